"""The sidecar build command: encode a real index, publish atomically, resume after an interruption."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pyserini_mores.sidecar import build as build_module
from pyserini_mores.sidecar import open_sidecar, verify_sidecar
from pyserini_mores.sidecar.__main__ import main as sidecar_main


def _build(tiny_index, tiny_maxsim_dir, output, *extra):
    return sidecar_main(["build", "--index", str(tiny_index), "--reranker", "maxsim", "--model",
                         str(tiny_maxsim_dir), "--output", str(output), "--batch-size", "2", *extra])


def test_build_info_verify(tiny_index, tiny_maxsim_dir, tmp_path, capsys):
    output = tmp_path / "sidecar"
    assert _build(tiny_index, tiny_maxsim_dir, output) == 0
    assert verify_sidecar(output) == []
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["num_docs"] == 20 and manifest["dtype"] == "float16" and manifest["model"]["model_type"] == "maxsim"
    assert manifest["build"]["reranker"] == "maxsim" and "truncated_documents" in manifest["build"]
    capsys.readouterr()
    assert sidecar_main(["info", str(output)]) == 0
    assert "maxsim" in capsys.readouterr().out
    assert sidecar_main(["verify", str(output)]) == 0


def test_truncation_is_counted(tiny_index, tiny_maxsim_dir, tmp_path):
    output = tmp_path / "short"
    assert _build(tiny_index, tiny_maxsim_dir, output, "--max-length", "8", "--dtype", "float32") == 0
    reader = open_sidecar(output)
    assert reader.lengths().max() == 8
    assert reader.manifest.build["truncated_documents"] == int((reader.lengths() == 8).sum()) > 10


def test_interrupted_build_resumes_to_the_same_bytes(tiny_index, tiny_maxsim_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(build_module, "WINDOW_BATCHES", 2)  # windows of 4 documents
    whole = tmp_path / "whole"
    assert _build(tiny_index, tiny_maxsim_dir, whole, "--dtype", "float32") == 0

    real_encode = build_module._encode_window
    calls = {"n": 0}

    def crash_on_third_window(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill")
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(build_module, "_encode_window", crash_on_third_window)
    resumed = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        _build(tiny_index, tiny_maxsim_dir, resumed, "--dtype", "float32")
    assert not resumed.exists() and resumed.with_name("resumed.partial").is_dir()

    monkeypatch.setattr(build_module, "_encode_window", real_encode)
    calls["n"] = 0
    encoded = []
    monkeypatch.setattr(build_module, "_encode_window",
                        lambda model, texts, *rest: encoded.append(len(texts)) or real_encode(model, texts, *rest))
    assert _build(tiny_index, tiny_maxsim_dir, resumed, "--dtype", "float32") == 0
    assert sum(encoded) == 20 - 8  # the two finished windows were kept, not recomputed
    np.testing.assert_array_equal(open_sidecar(resumed).tokens, open_sidecar(whole).tokens)
    assert open_sidecar(resumed).manifest.files["tokens.bin"] == open_sidecar(whole).manifest.files["tokens.bin"]


def test_reranker_without_stored_representations_is_refused(tiny_index, tmp_path):
    with pytest.raises(SystemExit, match="stores no document representations"):
        sidecar_main(["build", "--index", str(tiny_index), "--reranker", "bm25", "--output", str(tmp_path / "x")])


def test_searcher_hits_are_accepted_by_pyserini_output_writers(tiny_index, tmp_path):
    """Our hits go through Pyserini's own TREC writer unchanged."""
    from pyserini_mores._jvm import import_pyserini
    from pyserini_mores.search import RerankingSearcher

    output_writer = import_pyserini("pyserini.output_writer")
    searcher = RerankingSearcher(tiny_index, "bm25")
    results = searcher.batch_search(["text editor"], ["q1"], k=3)
    path = tmp_path / "run.txt"
    writer = output_writer.get_output_writer(str(path), output_writer.OutputFormat.TREC, "w",
                                             max_hits=3, tag="t", topics={"q1": {"title": "text editor"}})
    with writer:
        writer.write("q1", results["q1"])
    assert [line.split()[2] for line in path.read_text().splitlines()] == [h.docid for h in results["q1"]]
