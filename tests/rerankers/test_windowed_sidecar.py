"""A sidecar built with windows (format 3) scores long documents as the same windows cut from the text do: every
aggregation from the sidecar equals it from text, the sidecar's windows decide, and FirstP over a sidecar whose windows
are the model's capacity is exactly the score of a sidecar without windows."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pyserini_mores.errors import UsageError
from pyserini_mores.index import build_lucene_index, open_searcher
from pyserini_mores.rerankers import get_reranker
from pyserini_mores.rerankers.learned import ModelReranker, check_windows_before_loading
from pyserini_mores.search import RerankingSearcher
from pyserini_mores.sidecar import open_sidecar
from pyserini_mores.sidecar.build import build_sidecar
from pyserini_mores.types import Query, Text
from pyserini_mores.windows import WindowOptions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
QUERY = "a configurable text editor"
OPTIONS = WindowOptions(window=12, stride=8, max_windows=4)


@pytest.fixture(scope="module")
def long_texts() -> list[str]:
    """Five documents of 1 to 150 words, cut from the tiny collection's texts."""
    texts = [json.loads(line)["contents"] for line in (RESOURCES / "tiny_collection.jsonl").read_text().splitlines()]
    words = " ".join(texts).split()
    return [" ".join(words[start:start + size]) for start, size in ((0, 150), (5, 1), (30, 40), (60, 9), (90, 80))]


@pytest.fixture(scope="module")
def long_index(tmp_path_factory, long_texts) -> Path:
    root = tmp_path_factory.mktemp("long_index")
    (root / "jsonl").mkdir()
    (root / "jsonl" / "docs.jsonl").write_text("".join(
        json.dumps({"id": f"w{i}", "contents": text}) + "\n" for i, text in enumerate(long_texts)))
    return build_lucene_index(root / "jsonl", root / "index")


def _model(kind: str, tokenizer):
    from tiny_models import spread_weights

    from pyserini_mores.models._layers import BertDims
    from pyserini_mores.models.dual_encoder import DualEncoder, DualEncoderConfig
    from pyserini_mores.models.mores import MoresConfig, MoresModel
    from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel

    torch.manual_seed(0)
    dims = BertDims(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)
    if kind == "mores":
        model = MoresModel(MoresConfig(encoder=dims, n_interaction_blocks=1, reuse="s2", doc_max_length=24), tokenizer)
    elif kind == "prettr":
        model = PreTTRModel(PreTTRConfig(encoder=dims, doc_max_length=24), tokenizer)
    else:
        model = DualEncoder(DualEncoderConfig(encoder=dims, doc_max_length=24), tokenizer)
    return spread_weights(model).eval()


def _sidecar(index: Path, model, output: Path, windows: WindowOptions):
    searcher = open_searcher(index)
    try:
        build_sidecar(searcher, model, output, reranker_name=model.model_type, dtype="float32", progress=False,
                      batch_size=1, windows=windows)  # each window encoded alone: no padding
    finally:
        searcher.close()
    return open_sidecar(output, expect_model_fingerprint=model.store_fingerprint())


def _candidates(texts: list[str]) -> list[Text]:
    # rows are the index's: look the candidates up by docid
    return [Text(text, {"docid": f"w{i}"}, score=float(-i)) for i, text in enumerate(texts)]


def _by_docid(texts: list[Text]) -> list[float]:
    return [text.score for text in sorted(texts, key=lambda text: int(text.id[1:]))]


@pytest.mark.parametrize("kind", ["mores", "prettr", "maxsim"])
def test_a_windowed_sidecar_scores_as_the_same_windows_from_text(kind, long_index, long_texts, tokenizer, tmp_path):
    model = _model(kind, tokenizer)
    sidecar = _sidecar(long_index, model, tmp_path / kind, OPTIONS)
    assert sidecar.windows == OPTIONS and sidecar.window_counts().max() == 4
    aggregations = ["firstp", "maxp", "sump", "firstmaxp"] + (["avgcls"] if kind != "maxsim" else [])
    for aggregate in aggregations:
        stored = ModelReranker(model, sidecar, aggregate=aggregate, batch_size=3, device="cpu")
        assert stored.describe_windows() == f"{aggregate} of at most 4 windows of 12 tokens every 8"
        from_text = ModelReranker(model, aggregate=aggregate, windows=OPTIONS, batch_size=5, device="cpu")
        got = _by_docid(stored.rerank(Query(QUERY), _candidates(long_texts)))
        want = _by_docid(from_text.rerank(Query(QUERY), _candidates(long_texts)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=aggregate)
        assert stored.windows_per_candidate == (1.0 if aggregate == "firstp" else sidecar.window_counts().mean())
    with pytest.raises(UsageError, match="differ from the --window 12 --stride 8 --max-windows 4 sidecar"):
        ModelReranker(model, sidecar, windows=WindowOptions(window=12, max_windows=4), device="cpu")
    ModelReranker(model, sidecar, windows=WindowOptions(window=12, stride=8, max_windows=4), device="cpu")  # the same


def test_firstp_over_windows_of_the_models_capacity_is_the_score_without_windows(long_index, long_texts, tokenizer,
                                                                                   tmp_path):
    model = _model("mores", tokenizer)
    windowed = _sidecar(long_index, model, tmp_path / "windowed", WindowOptions(max_windows=3))
    plain = _sidecar(long_index, model, tmp_path / "plain", WindowOptions())
    assert windowed.window_counts().max() == 3
    firstp = ModelReranker(model, windowed, aggregate="firstp", device="cpu")
    without = ModelReranker(model, plain, aggregate="maxp", device="cpu")
    assert _by_docid(firstp.rerank(Query(QUERY), _candidates(long_texts))) == \
        _by_docid(without.rerank(Query(QUERY), _candidates(long_texts)))


def _no_model_loads(monkeypatch) -> None:
    import pyserini_mores.rerankers.learned as learned

    def load_model(*args, **kwargs):
        raise AssertionError("the model loaded before the windows were checked against the sidecar's")

    monkeypatch.setattr(learned, "load_model", load_model)


def test_windows_other_than_a_sidecars_are_refused_from_its_manifest_before_the_model_loads(
        long_index, tokenizer, tmp_path, monkeypatch):
    model = _model("maxsim", tokenizer)
    model.save_pretrained(tmp_path / "model")
    path = _sidecar(long_index, model, tmp_path / "windowed", OPTIONS).path
    plain = _sidecar(long_index, model, tmp_path / "plain", WindowOptions()).path
    _no_model_loads(monkeypatch)
    refusal = ("windows --window 12 --stride 12 --max-windows 4 differ from the --window 12 --stride 8 --max-windows 4 "
               f"sidecar {path} stores; its windows are cut when it is built: leave out --window, --stride and "
               "--max-windows, or build a sidecar with these windows")
    asked = WindowOptions(window=12, max_windows=4)
    with pytest.raises(UsageError) as refused:
        get_reranker("maxsim", model=tmp_path / "model", sidecar=path, windows=asked)
    assert str(refused.value) == refusal
    with pytest.raises(UsageError) as refused:  # the searcher checks before the index or the model opens
        RerankingSearcher(long_index, "maxsim", model=tmp_path / "model", sidecar=path, windows=asked)
    assert str(refused.value) == refusal
    with pytest.raises(UsageError) as refused:  # the windows a model reads whole, of a sidecar stored without them
        get_reranker("maxsim", model=tmp_path / "model", sidecar=plain, windows=WindowOptions(max_windows=2))
    assert str(refused.value).startswith("windows --window 22 --stride 22 --max-windows 2 differ from the --window 22 "
                                         f"--stride 22 --max-windows 1 sidecar {plain} stores; ")
    with pytest.raises(UsageError) as refused:  # an open reader's manifest says the same
        get_reranker("maxsim", model=tmp_path / "model", sidecar=open_sidecar(path), windows=asked)
    assert str(refused.value) == refusal
    # the sidecar's own windows are not refused: the model is what loads next
    with pytest.raises(AssertionError, match="the model loaded"):
        get_reranker("maxsim", model=tmp_path / "model", sidecar=path, windows=OPTIONS)


def test_a_sidecar_without_a_window_map_refuses_more_windows_from_its_manifest():
    legacy = Path(__file__).resolve().parents[1] / "resources" / "sidecar_format_2"
    with pytest.raises(UsageError) as refused:
        check_windows_before_loading(legacy, WindowOptions(window=64, max_windows=3))
    assert str(refused.value) == (
        f"windows --window 64 --max-windows 3 differ from the --max-windows 1 sidecar {legacy} stores; its windows are "
        "cut when it is built: leave out --window, --stride and --max-windows, or build a sidecar with these windows")
    check_windows_before_loading(legacy, WindowOptions())  # one window: what it stores
    check_windows_before_loading(legacy, None)
