"""Long documents scored as windows: FirstP is exactly the scores without windows (from text and from a sidecar, every
model), MaxP and SumP are the window scores aggregated as by hand, AvgCLS is the head on the mean of the windows' [CLS]
vectors (PreTTR, MORES, cross-encoder), and what cannot be done is refused in one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import spread_tk_scores, spread_weights

from pyserini_mores import get_reranker
from pyserini_mores.errors import UsageError
from pyserini_mores.models import pad_documents
from pyserini_mores.models._layers import BertDims
from pyserini_mores.rerankers.learned import ModelReranker
from pyserini_mores.sidecar import SidecarWriter, open_sidecar
from pyserini_mores.types import Query, Text
from pyserini_mores.windows import WindowOptions, average_windows, document_capacity, split_texts

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERY = "a configurable text editor for the terminal"
# the stored models (their sidecar variants) and the text-only one
STORED = ["mores-s1", "mores-s2", "prettr", "prettr-kv", "prettr-e16", "prettr-avg", "tk", "maxsim"]
CLS_MODELS = ["mores-s1", "mores-s2", "prettr", "prettr-kv", "prettr-e16", "prettr-avg", "cross-encoder"]
WINDOWS = WindowOptions(window=12, stride=8, max_windows=5)


def _model(kind: str, tokenizer):
    torch.manual_seed(0)
    dims = BertDims(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)
    if kind.startswith("mores"):
        from pyserini_mores.models.mores import MoresConfig, MoresModel

        model = MoresModel(MoresConfig(encoder=dims, n_interaction_blocks=1, reuse=kind[-2:], doc_max_length=24),
                           tokenizer)
    elif kind.startswith("prettr"):
        from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel

        options = {"prettr-kv": {"reuse": "kv"}, "prettr-e16": {"compression_dim": 16},
                   "prettr-avg": {"pooling": "avg"}}.get(kind, {})
        model = PreTTRModel(PreTTRConfig(encoder=dims, doc_max_length=24, **options), tokenizer)
    elif kind == "tk":
        from pyserini_mores.models.tk import TKConfig, TKModel

        return spread_tk_scores(TKModel(TKConfig(embedding_dim=32, vocab_size=len(tokenizer), num_layers=2,
                                                 num_heads=4, head_dim=8, ffn_dim=16, doc_max_length=24),
                                        tokenizer)).eval()
    elif kind == "maxsim":
        from pyserini_mores.models.dual_encoder import DualEncoder, DualEncoderConfig

        model = DualEncoder(DualEncoderConfig(encoder=dims, doc_max_length=24), tokenizer)
    else:
        from pyserini_mores.models.cross_encoder import CrossEncoder, CrossEncoderConfig

        model = CrossEncoder(CrossEncoderConfig(encoder=dims, doc_max_length=24), tokenizer)
    return spread_weights(model).eval()


@pytest.fixture(scope="module")
def models(tokenizer):
    return {kind: _model(kind, tokenizer) for kind in [*STORED, "cross-encoder"]}


@pytest.fixture(scope="module")
def documents(tiny_documents) -> list[str]:
    """Documents of 1 to ~5 windows of 12 tokens: the tiny collection's texts, some joined into long ones."""
    texts = [record["contents"] for record in tiny_documents]
    return [texts[0], " ".join(texts[1:4]), texts[4][:20], " ".join(texts[5:7]), "", " ".join(texts[7:12])]


def _sidecar(tmp_path, model, texts: list[str]):
    """A float32 sidecar of ``model``'s documents (one window per row, as built without windows)."""
    with torch.no_grad():
        reps = model.encode_documents(model.tokenize_documents(texts))
    path = tmp_path / f"{model.model_type}-{model.store_variant}"
    writer = SidecarWriter(path, dim=model.store_width, dtype="float32", docids=[f"d{i}" for i in range(len(texts))],
                           model={"model_type": model.model_type, "store_variant": model.store_variant,
                                  "fingerprint": model.store_fingerprint()},
                           index={"num_docs": len(texts), "signature": "test:windows"})
    writer.add([rep.float() for rep in reps])
    writer.finalize()
    return open_sidecar(path, expect_model_fingerprint=model.store_fingerprint())


def _windowed_sidecar(tmp_path, model, texts: list[str], windows: WindowOptions):
    """A float32 sidecar of ``model``'s documents cut into ``windows``, each window encoded alone."""
    capacity = document_capacity(model)
    pieces, owners = split_texts(texts, model.tokenizer, capacity, windows)
    with torch.no_grad():
        reps = [model.encode_documents(model.tokenize_documents([piece]))[0] for piece in pieces]
    window, stride = windows.resolved(capacity)
    writer = SidecarWriter(tmp_path / f"{model.model_type}-windowed", dim=model.store_width, dtype="float32",
                           docids=[f"d{i}" for i in range(len(texts))],
                           model={"model_type": model.model_type, "store_variant": model.store_variant,
                                  "fingerprint": model.store_fingerprint()},
                           index={"num_docs": len(texts), "signature": "test:windows"},
                           windows={"window": window, "stride": stride, "max_windows": windows.max_windows,
                                    "capacity": capacity})
    writer.add([rep.float() for rep in reps], windows=np.bincount(owners, minlength=len(texts)))
    return open_sidecar(writer.finalize(), expect_model_fingerprint=model.store_fingerprint())


def _texts(documents: list[str]) -> list[Text]:
    return [Text(text, {"docid": f"d{i}", "lucene_docid": i}, score=float(-i)) for i, text in enumerate(documents)]


def _scores(reranker, documents) -> np.ndarray:
    return reranker.score_documents(QUERY, documents, doc_ids=[f"d{i}" for i in range(len(documents))])


def _direct(model, documents: list[str]) -> torch.Tensor:
    """The scores without windows, computed as the reranker always has: one batch, each document cut by the model."""
    with torch.inference_mode():
        if model.store_width is None:
            return model.score_texts(QUERY, documents).float()
        state = model.encode_query(model.tokenize_queries([QUERY]))
        docs, lengths = pad_documents(model.encode_documents(model.tokenize_documents(documents)))
        return model.score(state, docs, lengths).float()


@pytest.mark.parametrize("kind", [*STORED, "cross-encoder"])
def test_firstp_from_text_is_the_score_without_windows_exactly(kind, models, documents):
    model = models[kind]
    expected = _direct(model, documents).numpy()
    for windows in (None, WindowOptions(max_windows=5), WindowOptions(stride=4, max_windows=3)):
        reranker = ModelReranker(model, aggregate="firstp", windows=windows, device="cpu")
        assert np.array_equal(_scores(reranker, documents), expected), windows
    # one window per document (the default): every score aggregation is that window's score
    for aggregate in ("maxp", "sump"):
        assert np.array_equal(_scores(ModelReranker(model, aggregate=aggregate, device="cpu"), documents), expected)


@pytest.mark.parametrize("kind", STORED)
def test_firstp_from_a_sidecar_is_the_score_without_windows_exactly(kind, models, documents, tmp_path):
    model = models[kind]
    sidecar = _sidecar(tmp_path, model, documents)
    rows = np.arange(len(documents))
    order = np.argsort(sidecar.lengths(rows), kind="stable")  # the length-sorted batch the reranker reads
    with torch.inference_mode():
        state = model.encode_query(model.tokenize_queries([QUERY]))
        expected = torch.empty(len(documents))
        expected[torch.from_numpy(order)] = model.score(state, *sidecar.get_batch(rows[order])).float()
    for aggregate in ("firstp", "maxp", "sump"):
        reranker = ModelReranker(model, sidecar, aggregate=aggregate, device="cpu")
        ranked = reranker.rerank(Query(QUERY), _texts(documents))
        assert {text.id: text.score for text in ranked} == {f"d{i}": float(s) for i, s in enumerate(expected)}
    capacity = 24 if kind == "tk" else 22  # of doc_max_length 24: TK's words have no special tokens
    with pytest.raises(UsageError, match=rf"windows --window {capacity} --stride {capacity} --max-windows 3 differ "
                                         rf"from the --window {capacity} --stride {capacity} --max-windows 1 sidecar"):
        ModelReranker(model, sidecar, windows=WindowOptions(max_windows=3), device="cpu")


def _by_hand(model, documents, how: str) -> np.ndarray:
    """Every window scored alone, then aggregated in Python."""
    pieces, owners = split_texts(documents, model.tokenizer, document_capacity(model), WINDOWS)
    window_scores = [float(_direct(model, [piece])[0]) for piece in pieces]
    per_document = [[s for s, owner in zip(window_scores, owners) if owner == i] for i in range(len(documents))]
    assert max(len(scores) for scores in per_document) >= 3 and min(len(scores) for scores in per_document) == 1
    return np.array([{"firstp": scores[0], "maxp": max(scores), "sump": sum(scores),
                      "firstmaxp": (scores[0] + max(scores)) / 2}[how]
                     for scores in per_document])


@pytest.mark.parametrize("kind", [*STORED, "cross-encoder"])
def test_window_scores_from_text_are_aggregated_as_by_hand(kind, models, documents):
    model = models[kind]
    firstp = None
    for how in ("firstp", "maxp", "sump", "firstmaxp"):
        reranker = ModelReranker(model, aggregate=how, windows=WINDOWS, batch_size=4, device="cpu")
        scores = _scores(reranker, documents)
        np.testing.assert_allclose(scores, _by_hand(model, documents, how), rtol=1e-5, atol=1e-5)
        if how == "firstp":
            firstp = scores
        else:
            assert not np.allclose(scores, firstp)  # the later windows count


@pytest.mark.parametrize("kind", ["mores-s1", "cross-encoder"])
def test_score_windows_gives_every_window_whatever_the_aggregation(kind, models, documents):
    model = models[kind]
    pieces, owners = split_texts(documents, model.tokenizer, document_capacity(model), WINDOWS)
    by_hand = np.array([float(_direct(model, [piece])[0]) for piece in pieces])
    for how in ("firstp", "maxp"):
        reranker = ModelReranker(model, aggregate=how, windows=WINDOWS, batch_size=4, device="cpu")
        texts = [Text(text, {"docid": f"d{i}"}) for i, text in enumerate(documents)]
        window_scores, window_owners = reranker.score_windows(QUERY, texts)
        np.testing.assert_array_equal(window_owners, owners)
        np.testing.assert_allclose(window_scores, by_hand, rtol=1e-5, atol=1e-5)
    # the head's inputs give the same window scores, and their per-document means what avgcls scores
    reranker = ModelReranker(model, aggregate="avgcls", windows=WINDOWS, batch_size=4, device="cpu")
    vectors, window_owners = reranker.score_windows(QUERY, texts, head_inputs=True)
    np.testing.assert_allclose(reranker.scores_from_head_inputs(vectors), by_hand, rtol=1e-5, atol=1e-5)
    averaged = reranker.scores_from_head_inputs(average_windows(vectors, window_owners, len(texts)))
    np.testing.assert_allclose(averaged, _scores(reranker, documents), rtol=1e-5, atol=1e-5)


def test_head_inputs_are_refused_for_a_model_without_a_cls_head(models):
    reranker = ModelReranker(models["maxsim"], windows=WINDOWS, device="cpu")
    with pytest.raises(UsageError, match="avgcls"):
        reranker.score_windows(QUERY, [Text("a text", {"docid": "d0"})], head_inputs=True)


def _head_on_mean(model, documents: list[str]) -> np.ndarray:
    """The head, by hand, on the mean of each document's windows' [CLS] vectors (each window read alone)."""
    pieces, owners = split_texts(documents, model.tokenizer, document_capacity(model), WINDOWS)
    with torch.inference_mode():
        if model.store_width is None:
            vectors = [model.text_cls(QUERY, [piece])[0] for piece in pieces]
        else:
            state = model.encode_query(model.tokenize_queries([QUERY]))
            encoded = [pad_documents(model.encode_documents(model.tokenize_documents([piece]))) for piece in pieces]
            vectors = [model.score_cls(state, docs, lengths)[0] for docs, lengths in encoded]
    head = model.ranking_head or model.head  # the cross-encoder's head is its own, not one to start others from
    scores = []
    for i in range(len(documents)):
        mean = torch.stack([v for v, owner in zip(vectors, owners) if owner == i]).double().mean(0)
        logits = head.weight.detach().double() @ mean + head.bias.detach().double()
        scores.append(float(logits[1] - logits[0]) if len(logits) == 2 else float(logits[0]))
    return np.array(scores)


@pytest.mark.parametrize("kind", CLS_MODELS)
def test_avgcls_is_the_head_on_the_mean_of_the_windows_cls_vectors(kind, models, documents):
    model = models[kind]
    reranker = ModelReranker(model, aggregate="avgcls", windows=WINDOWS, batch_size=4, device="cpu")
    scores = _scores(reranker, documents)
    np.testing.assert_allclose(scores, _head_on_mean(model, documents), rtol=1e-5, atol=1e-5)
    maxp = _scores(ModelReranker(model, aggregate="maxp", windows=WINDOWS, device="cpu"), documents)
    assert not np.allclose(scores, maxp)


@pytest.mark.parametrize("kind", [kind for kind in CLS_MODELS if kind != "cross-encoder"])
def test_avgcls_from_a_one_window_sidecar_is_the_head_on_each_cls_vector(kind, models, documents, tmp_path):
    model = models[kind]
    reranker = ModelReranker(model, _sidecar(tmp_path, model, documents), aggregate="avgcls", device="cpu")
    ranked = reranker.rerank(Query(QUERY), _texts(documents))
    expected = _direct(model, documents)
    np.testing.assert_allclose([text.score for text in sorted(ranked, key=lambda text: text.id)],
                               expected.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", CLS_MODELS)
def test_the_head_on_score_cls_is_score_exactly(kind, models, documents):
    model = models[kind]
    with torch.inference_mode():
        if model.store_width is None:
            cls, scores = model.text_cls(QUERY, documents), model.score_texts(QUERY, documents)
        else:
            state = model.encode_query(model.tokenize_queries([QUERY]))
            docs, lengths = pad_documents(model.encode_documents(model.tokenize_documents(documents)))
            cls, scores = model.score_cls(state, docs, lengths), model.score(state, docs, lengths)
        from_cls = model.score_from_cls(cls)
    assert cls.shape == (len(documents), 32)
    assert torch.equal(from_cls, scores)


@pytest.mark.parametrize("kind", ["tk", "maxsim"])
def test_avgcls_is_refused_for_a_model_without_a_cls_head(kind, models):
    message = rf"--aggregate avgcls averages the \[CLS\] vectors a model's head reads, and {kind} scores without one"
    with pytest.raises(UsageError, match=message):
        ModelReranker(models[kind], aggregate="avgcls", device="cpu")
    with pytest.raises(UsageError, match=message):
        get_reranker(kind, model=models[kind], aggregate="avgcls")


def test_an_unknown_aggregation_and_a_window_beyond_the_model_are_refused(models):
    with pytest.raises(UsageError,
                       match="--aggregate must be one of firstp, maxp, sump, firstmaxp, avgcls, not 'meanp'"):
        get_reranker("mores", model=models["mores-s1"], aggregate="meanp")
    with pytest.raises(UsageError, match="--window 40 is longer than the 22 tokens the model reads of a document"):
        ModelReranker(models["mores-s1"], windows=WindowOptions(window=40, max_windows=2), device="cpu")


def test_under_a_deadline_a_candidate_is_kept_only_with_all_its_windows(models, documents):
    """The pacing counts windows: a deadline that leaves time for some windows returns the candidates whose windows
    were all scored, with the scores they have without a deadline."""
    import time

    model = models["mores-s1"]
    reranker = ModelReranker(model, aggregate="maxp", windows=WINDOWS, device="cpu")
    texts = _texts(documents)
    full = {text.id: text.score for text in reranker.rerank(Query(QUERY), texts)}
    kept = reranker.rerank_until(Query(QUERY), texts, time.monotonic() + 60)
    assert {text.id: text.score for text in kept} == full
    pieces, owners = split_texts(documents, model.tokenizer, document_capacity(model), WINDOWS)
    scores = torch.arange(len(pieces), dtype=torch.float32)
    for scored in range(len(pieces) + 1):  # the first ``scored`` windows have their scores
        complete = sum(1 for i in range(len(documents)) if np.flatnonzero(owners == i).max() < scored)
        aggregated = reranker._aggregated(scores[:scored], owners, len(documents))
        assert len(aggregated) == complete
        assert aggregated.tolist() == [float(np.flatnonzero(owners == i).max()) for i in range(complete)]


@pytest.mark.parametrize("stored", [False, True], ids=["from-text", "from-sidecar"])
def test_tk_explains_each_window_it_scored(models, documents, tmp_path, stored):
    """With windows, TK's explanation holds each scored window's numbers (the windows of the text, or the sidecar's),
    which give that window's score, beside the aggregation and the document's score."""
    model = models["tk"]
    sidecar = _windowed_sidecar(tmp_path, model, documents, WINDOWS) if stored else None
    counts = np.bincount(split_texts(documents, model.tokenizer, document_capacity(model), WINDOWS)[1])
    assert counts.max() >= 3 and counts.min() == 1
    for how in ("firstmaxp", "firstp"):
        reranker = ModelReranker(model, sidecar, aggregate=how, windows=None if stored else WINDOWS,
                                 precision="fp32", device="cpu")
        window_scores, owners = reranker.score_windows(QUERY, _texts(documents))
        for text in reranker.rerank(Query(QUERY), _texts(documents), explain=True):
            explanation, position = text.metadata["explanation"], int(text.id[1:])
            assert (explanation["aggregate"], explanation["score"]) == (how, text.score)
            windows = explanation["windows"]
            assert len(windows) == (counts[position] if how == "firstmaxp" else 1)
            np.testing.assert_allclose([window["score"] for window in windows],
                                       window_scores[owners == position][:len(windows)], rtol=1e-5, atol=1e-5)
            for window in windows:
                assert sum(window["log_contributions"]) == pytest.approx(window["s_log"], rel=1e-5, abs=1e-4)
            scores = [window["score"] for window in windows]
            if how == "firstmaxp":
                assert text.score == pytest.approx((scores[0] + max(scores)) / 2, rel=1e-6)
