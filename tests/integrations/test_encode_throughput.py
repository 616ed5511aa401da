"""integrations/scale/encode_throughput.py on a few passages with a tiny model: it indexes them, runs the real
`sidecar build` for each reranker asked, and writes the docs/s and the MS MARCO projection it prints."""
import json
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
if str(REPOSITORY) not in sys.path:
    sys.path.append(str(REPOSITORY))

from integrations.scale import encode_throughput  # noqa: E402
from pyserini_mores.search.sample import sample_dir  # noqa: E402
from pyserini_mores.sidecar import open_sidecar  # noqa: E402

SAMPLE = sample_dir() / "collection.tsv.gz"


def test_a_tiny_model_is_timed_through_sidecar_build_and_projected(tmp_path, tiny_maxsim_dir, capsys):
    results = tmp_path / "encode.json"
    assert encode_throughput.main(["--collection", str(SAMPLE), "--num-docs", "12", "--rerankers", "maxsim",
                                   "--model", str(tiny_maxsim_dir), "--precision", "fp32", "--device", "cpu",
                                   "--batch-size", "4", "--ray-workers", "8", "64", "--work", str(tmp_path / "work"),
                                   "--json", str(results)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(results.read_text())
    assert (result["num_docs"], result["precision"], result["device"]) == (12, "fp32", "cpu")
    [row] = result["rerankers"]
    assert row["reranker"] == "maxsim" and row["num_docs"] == 12 and row["device"] == "cpu"
    assert row["docs_per_s"] == pytest.approx(12 / row["encode_seconds"], rel=1e-2)
    assert row["command_seconds"] >= row["encode_seconds"] > 0
    hours = 8_841_823 / row["docs_per_s"] / 3600
    assert row["projection_hours"]["this machine"] == pytest.approx(hours, rel=1e-3)
    assert row["projection_hours"]["64 Ray workers"] == pytest.approx(hours / 64, rel=1e-3)
    assert list(row["projection_hours"]) == ["this machine", "8 Ray workers", "64 Ray workers"]
    assert row["command"].startswith("python -m pyserini_mores.sidecar build --index ")
    with open_sidecar(tmp_path / "work" / "sidecar-maxsim-fp32") as sidecar:  # the build really ran
        assert sidecar.num_docs == 12 and sidecar.num_tokens / 12 == pytest.approx(row["stored_tokens_per_doc"], 0.01)
    assert "docs/s" in printed and "maxsim" in printed


def test_a_fast_projection_keeps_its_relative_precision():
    # 8,841,823 passages at 59,073 docs/s is 0.04158 h: fixed decimals would have written 0.042 (1% off).
    hours = encode_throughput.projection(59_073.0, "cuda", (1, 64))
    assert hours == {"one GPU": 0.04158, "1 Ray workers": 0.04158, "64 Ray workers": 0.0006496}


def test_a_gpu_that_is_not_there_is_refused_before_any_work(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert encode_throughput.main(["--device", "cuda", "--work", str(tmp_path / "work")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --device cuda: device 'cuda' was asked for, but torch.cuda.is_available() is "
                            "False") and error.count("\n") == 1
    assert not (tmp_path / "work").exists()
