"""--device on the bench, budget and explain commands, as search and sidecar build have it: the same names checked at
parse time (a malformed one is a usage error), a GPU that is not there refused before any model loads, and the device
asked for reaching the rerankers and the models. On the CPU everywhere, on CUDA where there is one."""
from __future__ import annotations

import json
import re

import pytest
import torch

from pyserini_mores.bench import baselines
from pyserini_mores.bench.__main__ import main as bench_main
from pyserini_mores.budget.__main__ import main as budget_main
from pyserini_mores.explain.__main__ import main as explain_main
from pyserini_mores.rerankers import learned

from conftest import RESOURCES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOPICS = RESOURCES / "tiny_topics.tsv"
QRELS = RESOURCES / "tiny_qrels.txt"
NO_CUDA = re.escape("torch.cuda.is_available() is False")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                   reason="no CUDA device"))]
MALFORMED = "argument --device: device must be one of auto, cpu, cuda, cuda:N, not 'gpu'"


@pytest.fixture
def without_cuda(monkeypatch):
    """This machine as one without a GPU, whatever it has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def reranker_devices(monkeypatch) -> list[tuple[str, str]]:
    """(reranker device, model parameters' device) of every ModelReranker made."""
    seen = []
    init = learned.ModelReranker.__init__

    def spied_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append((self.device.type, next(self.model.parameters()).device.type))

    monkeypatch.setattr(learned.ModelReranker, "__init__", spied_init)
    return seen


@pytest.fixture
def no_model_loads(monkeypatch):
    monkeypatch.setattr(learned, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


@pytest.fixture
def calibration_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYSERINI_MORES_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny_mores_dir(tmp_path_factory, tokenizer):
    """A saved random MORES (no sidecar: explain encodes the documents from their text)."""
    from pyserini_mores.models._layers import BertDims
    from pyserini_mores.models.mores import MoresConfig, MoresModel

    dims = BertDims(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)
    torch.manual_seed(0)
    model = MoresModel(MoresConfig(encoder=dims, n_interaction_blocks=1, doc_max_length=64), tokenizer).eval()
    path = tmp_path_factory.mktemp("models") / "tiny-mores"
    model.save_pretrained(path)
    return path


def _usage_error(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


# ---- bench -----------------------------------------------------------------------------------------------------------
BENCH = ["--tiny", "--models", "cross-encoder", "--baselines", "hf-bert-sdpa", "--candidates", "6",
         "--repetitions", "1", "--doc-lens", "16", "--precision", "fp32", "--peak-sizes", "64"]


@pytest.mark.parametrize("device", DEVICES)
def test_bench_runs_every_model_on_the_device(device, reranker_devices, monkeypatch, tmp_path):
    scorer_devices = []
    build_scorer = baselines.build_scorer

    def spied_build_scorer(name, checkpoint, **kwargs):
        scorer_devices.append(kwargs["device"].type)
        return build_scorer(name, checkpoint, **kwargs)

    monkeypatch.setattr(baselines, "build_scorer", spied_build_scorer)
    json_path = tmp_path / "bench.json"
    assert bench_main(BENCH + ["--device", device, "--work-dir", str(tmp_path), "--json", str(json_path)]) == 0
    assert reranker_devices == [(device, device)] and scorer_devices == [device]
    report = json.loads(json_path.read_text())
    assert report["config"]["device"] == device and report["machine"]["device"] == device
    assert [(r["model"], r["device"]) for r in report["results"]] == [("cross-encoder", device),
                                                                       ("hf-bert-sdpa", device)]


def test_bench_refuses_a_malformed_device_and_a_missing_gpu(without_cuda, tmp_path, capsys):
    assert MALFORMED in _usage_error(bench_main, BENCH + ["--device", "gpu"], capsys)
    assert bench_main(BENCH + ["--device", "cuda:1", "--work-dir", str(tmp_path)]) == 2
    assert re.search(f"^error: device 'cuda:1' was asked for, but {NO_CUDA}", capsys.readouterr().err, re.MULTILINE)


# ---- budget ----------------------------------------------------------------------------------------------------------
def _budget_args(tiny_index, tiny_maxsim_dir, output) -> list[str]:
    return ["--index", str(tiny_index), "--topics", str(TOPICS), "--qrels", str(QRELS), "--rerankers",
            f"maxsim:{tiny_maxsim_dir}", "--budgets", "1000", "--rerank-depth", "5", "--hits", "5",
            "--max-queries", "1", "--precision", "fp32", "--output-dir", str(output)]


@pytest.mark.parametrize("device", DEVICES)
def test_budget_reranks_on_the_device(device, calibration_cache, reranker_devices, tiny_index, tiny_maxsim_dir,
                                      maxsim_sidecar, tmp_path):
    output = tmp_path / "sweep"
    assert budget_main(_budget_args(tiny_index, tiny_maxsim_dir, output) + ["--device", device]) == 0
    assert reranker_devices == [(device, device)]
    assert json.loads((output / "budget_sweep.json").read_text())["settings"]["device"] == device


def test_budget_refuses_a_malformed_device_and_a_missing_gpu(without_cuda, no_model_loads, calibration_cache,
                                                             tiny_index, tiny_maxsim_dir, tmp_path, capsys):
    args = _budget_args(tiny_index, tiny_maxsim_dir, tmp_path / "sweep")
    assert MALFORMED in _usage_error(budget_main, args + ["--device", "gpu"], capsys)
    assert budget_main(args + ["--device", "cuda"]) == 2
    assert re.search(f"^error: device 'cuda' was asked for, but {NO_CUDA}", capsys.readouterr().err, re.MULTILINE)
    assert not (tmp_path / "sweep").exists()


# ---- explain ---------------------------------------------------------------------------------------------------------
def _explain_args(tiny_index, model_dir, output) -> list[str]:
    return ["--index", str(tiny_index), "--query", "text editor for source code", "--reranker", "mores",
            "--model", str(model_dir), "--top", "1", "--rerank-depth", "3", "--precision", "fp32",
            "--output", str(output)]


@pytest.mark.parametrize("device", DEVICES)
def test_explain_scores_on_the_device(device, reranker_devices, tiny_index, tiny_mores_dir, tmp_path):
    output = tmp_path / "explained"
    assert explain_main(_explain_args(tiny_index, tiny_mores_dir, output) + ["--device", device]) == 0
    assert reranker_devices == [(device, device)]
    assert json.loads((output / "explanation.json").read_text())["documents"]


def test_explain_refuses_a_malformed_device_and_a_missing_gpu(without_cuda, no_model_loads, tiny_index,
                                                              tiny_mores_dir, tmp_path, capsys):
    args = _explain_args(tiny_index, tiny_mores_dir, tmp_path / "explained")
    assert MALFORMED in _usage_error(explain_main, args + ["--device", "gpu"], capsys)
    assert explain_main(args + ["--device", "cuda"]) == 2
    assert re.search(f"^error: device 'cuda' was asked for, but {NO_CUDA}", capsys.readouterr().err, re.MULTILINE)
    assert not (tmp_path / "explained").exists()
