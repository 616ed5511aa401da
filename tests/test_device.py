"""--device / device=: one resolver for search, sidecar builds, training and the Python API; the model, the query
batch, the stored rows and autocast on the device; scores back on the CPU. The plumbing runs on the CPU everywhere
and on CUDA where there is one (skipped otherwise); a GPU asked for where there is none fails at once."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from pyserini_mores import get_reranker
from pyserini_mores.index import iter_index_documents, open_searcher
from pyserini_mores.precision import DeviceUnavailableError, check_device_name, resolve_device
from pyserini_mores.rerankers import learned
from pyserini_mores.search import RerankingSearcher
from pyserini_mores.search.__main__ import main as search_main
from pyserini_mores.sidecar import open_sidecar
from pyserini_mores.sidecar.__main__ import main as sidecar_main
from pyserini_mores.sidecar.build import build_sidecar
from pyserini_mores.types import Query, Text

from conftest import RESOURCES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOPICS = RESOURCES / "tiny_topics.tsv"
NO_CUDA = re.escape("torch.cuda.is_available() is False")
#: every device the plumbing runs on here: the CPU, and the first GPU where PyTorch sees one
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                   reason="no CUDA device"))]


@pytest.fixture
def without_cuda(monkeypatch):
    """This machine as one without a GPU, whatever it has (a CUDA CI runner too)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# ---- the resolver ----------------------------------------------------------------------------------------------------
def test_auto_is_cuda_where_there_is_one_else_cpu():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device().type == resolve_device("auto").type == resolve_device(None).type == expected
    assert resolve_device("cpu") == resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_auto_is_cpu_without_cuda(without_cuda):
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:12", " CUDA:1 "])
def test_device_names_are_checked_without_torch(name):
    assert check_device_name(name) == name.strip().lower()


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "cuda:-1", "mps", "meta", ""])
def test_other_device_names_are_refused(name):
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, cuda:N"):
        check_device_name(name)


@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_cuda_fails_naming_the_device(without_cuda, name):
    with pytest.raises(DeviceUnavailableError, match=f"device '{name}' was asked for, but {NO_CUDA}"):
        resolve_device(name)


# ---- the Python API --------------------------------------------------------------------------------------------------
def test_the_api_refuses_cuda_without_cuda_before_loading_the_model(without_cuda, monkeypatch, tiny_index,
                                                                    tiny_maxsim_dir):
    monkeypatch.setattr(learned, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    with pytest.raises(DeviceUnavailableError, match=f"device 'cuda' was asked for, but {NO_CUDA}"):
        get_reranker("maxsim", model=str(tiny_maxsim_dir), device="cuda")
    with pytest.raises(DeviceUnavailableError, match=f"device 'cuda:0' was asked for, but {NO_CUDA}"):
        RerankingSearcher(tiny_index, "maxsim", model=str(tiny_maxsim_dir), device="cuda:0")


def test_a_model_reranker_refuses_cuda_without_cuda(without_cuda, tiny_maxsim_dir):
    model = get_reranker("maxsim", model=str(tiny_maxsim_dir), device="cpu").model
    with pytest.raises(DeviceUnavailableError, match=NO_CUDA):
        learned.ModelReranker(model, device="cuda")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_scoring_runs_on_the_device_and_scores_come_back_as_floats(device, precision, tiny_index, tiny_maxsim_dir,
                                                                   maxsim_sidecar):
    """Stored rows and from-text documents, on ``device``: every tensor the model sees is there, autocast is that
    device's, and the scores equal the CPU's (to bf16 accuracy under bf16)."""
    reference = get_reranker("maxsim", model=str(tiny_maxsim_dir), device="cpu", precision="fp32")
    reranker = get_reranker("maxsim", model=str(tiny_maxsim_dir), device=device, precision=precision)
    assert reranker.device.type == device and next(reranker.model.parameters()).device.type == device
    seen = _spy_on_inputs(reranker)
    searcher = open_searcher(tiny_index)
    sidecar = open_sidecar(maxsim_sidecar)
    texts = [text for _, _, text in iter_index_documents(searcher)]
    tolerance = 1e-4 if precision == "fp32" else 0.05
    for use_sidecar in (True, False):
        expected = _scores(reference, sidecar if use_sidecar else None, texts)
        scores = _scores(reranker, sidecar if use_sidecar else None, texts)
        assert all(type(score) is float for score in scores)
        np.testing.assert_allclose(scores, expected, rtol=tolerance, atol=tolerance)
    assert seen["devices"] == {device}
    assert seen["autocast"] == {precision == "bf16"}
    searcher.close()


@pytest.mark.parametrize("device", DEVICES)
def test_batches_travel_through_pinned_memory_to_a_gpu_and_are_never_overwritten_in_flight(
        device, tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    """Batches of 2 through one reused buffer: pinned (page-locked) for a GPU, whose asynchronous copy the next batch
    waits for, so that every candidate keeps its own vectors; pageable on the CPU."""
    reference = get_reranker("maxsim", model=str(tiny_maxsim_dir), device="cpu", precision="fp32")
    reranker = get_reranker("maxsim", model=str(tiny_maxsim_dir), device=device, precision="fp32", batch_size=2)
    searcher = open_searcher(tiny_index)
    sidecar = open_sidecar(maxsim_sidecar)
    texts = [text for _, _, text in iter_index_documents(searcher)]
    np.testing.assert_allclose(_scores(reranker, sidecar, texts), _scores(reference, sidecar, texts), rtol=1e-4,
                               atol=1e-4)
    assert reranker._batch_buffer().pin_memory == (device == "cuda")
    searcher.close()


def _spy_on_inputs(reranker) -> dict:
    """Record the device of every tensor given to the scoring model, and whether autocast was on for the device."""
    seen = {"devices": set(), "autocast": set()}
    model = reranker.scoring_model
    encode_query, score = model.encode_query, model.score

    def spied_encode_query(batch):
        seen["devices"] |= {tensor.device.type for tensor in batch.values()}
        return encode_query(batch)

    def spied_score(query_state, docs, lengths):
        seen["devices"] |= {docs.device.type, lengths.device.type}
        seen["autocast"].add(torch.is_autocast_enabled(reranker.device.type))
        return score(query_state, docs, lengths)

    model.encode_query, model.score = spied_encode_query, spied_score
    return seen


def _scores(reranker, sidecar, texts: list[str]) -> list[float]:
    reranker.sidecar = sidecar
    candidates = [Text(text, {"docid": sidecar.docid(row) if sidecar else str(row), "lucene_docid": row})
                  for row, text in enumerate(texts)]
    return [text.score for text in reranker.rescore(Query("a text editor for programmers"), candidates)]


# ---- the search command ----------------------------------------------------------------------------------------------
def test_search_device_cpu_equals_the_default_and_is_printed(tiny_index, tiny_maxsim_dir, maxsim_sidecar, tmp_path,
                                                             capsys):
    runs = {}
    for name, extra in (("default", []), ("cpu", ["--device", "cpu"])):
        runs[name] = tmp_path / f"{name}.trec"
        assert search_main(["--index", str(tiny_index), "--topics", str(TOPICS), "--output", str(runs[name]),
                            "--hits", "5", "--reranker", "maxsim", "--model", str(tiny_maxsim_dir),
                            "--precision", "fp32", *extra]) == 0
        out = capsys.readouterr().out
        device = "cuda" if name == "default" and torch.cuda.is_available() else "cpu"
        assert f"reranker: maxsim (precision fp32, device {device})" in out
    if not torch.cuda.is_available():  # the default is the CPU here
        assert runs["cpu"].read_text() == runs["default"].read_text()


def test_search_refuses_cuda_without_cuda(without_cuda, monkeypatch, tiny_index, tiny_maxsim_dir, capsys):
    monkeypatch.setattr(learned, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    assert search_main(["--index", str(tiny_index), "--topics", str(TOPICS), "--reranker", "maxsim",
                        "--model", str(tiny_maxsim_dir), "--device", "cuda"]) == 2
    assert re.search(f"^error: device 'cuda' was asked for, but {NO_CUDA}", capsys.readouterr().err, re.MULTILINE)


def test_a_malformed_device_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        search_main(["--device", "gpu"])
    assert exit_info.value.code == 2
    assert "argument --device: device must be one of auto, cpu, cuda, cuda:N, not 'gpu'" in capsys.readouterr().err


# ---- the sidecar build -----------------------------------------------------------------------------------------------
def _build(tiny_index, tiny_maxsim_dir, output, *extra):
    return sidecar_main(["build", "--index", str(tiny_index), "--reranker", "maxsim", "--model",
                         str(tiny_maxsim_dir), "--output", str(output), "--batch-size", "3", "--dtype", "float32",
                         "--precision", "fp32", *extra])


def test_build_refuses_cuda_without_cuda(without_cuda, monkeypatch, tiny_index, tiny_maxsim_dir, tmp_path):
    monkeypatch.setattr(learned, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit, match=f"error: device 'cuda' was asked for, but {NO_CUDA}"):
        _build(tiny_index, tiny_maxsim_dir, tmp_path / "sidecar", "--device", "cuda")
    assert not (tmp_path / "sidecar").exists()


def test_build_sidecar_refuses_cuda_without_cuda(without_cuda, tiny_index, tiny_maxsim_dir, tmp_path):
    model = get_reranker("maxsim", model=str(tiny_maxsim_dir), device="cpu").model
    searcher = open_searcher(tiny_index)
    with pytest.raises(DeviceUnavailableError, match=NO_CUDA):
        build_sidecar(searcher, model, tmp_path / "sidecar", reranker_name="maxsim", device="cuda")
    searcher.close()


@pytest.mark.parametrize("device", DEVICES)
def test_build_on_the_device_stores_the_cpu_vectors(device, tiny_index, tiny_maxsim_dir, tmp_path):
    """Encoded on ``device``, copied back and written: the vectors of a CPU build through the Python API (exactly,
    on the CPU), and the device recorded in the manifest."""
    model = get_reranker("maxsim", model=str(tiny_maxsim_dir), device="cpu").model
    searcher = open_searcher(tiny_index)
    build_sidecar(searcher, model, tmp_path / "reference", reranker_name="maxsim", batch_size=3, dtype="float32",
                  precision="fp32", device="cpu", progress=False)
    searcher.close()
    output = tmp_path / "sidecar"
    assert _build(tiny_index, tiny_maxsim_dir, output, "--device", device) == 0
    built, reference = open_sidecar(output), open_sidecar(tmp_path / "reference")
    assert built.manifest.build_device == device and built.num_docs == reference.num_docs
    np.testing.assert_array_equal(built.lengths(), reference.lengths())
    if device == "cpu":
        np.testing.assert_array_equal(np.asarray(built.tokens), np.asarray(reference.tokens))
    else:
        np.testing.assert_allclose(np.asarray(built.tokens), np.asarray(reference.tokens), atol=1e-4)
