"""bf16 scoring with weights cast once: what is cast (and what is not), that the fp32 model is left alone, that the
copy follows weight changes, and that bf16 scores rank like fp32 ones — on tiny random models reading real sidecars.

Tolerances. bf16 keeps 8 significant bits, so every rounding moves a value by up to 0.4%, and a score is a logit
difference at the end of dozens of them; autocast, the bf16 path that was accepted before, is the yardstick. Measured
on these tiny models (weights spread wider than BERT's, so scores differ clearly), autocast's scores deviate from fp32
by 1.2-5.6% of the fp32 score spread (RMS over 3 queries x 20 documents) and bf16 weights by 1.5-5.7%. The tests
allow 10% of the spread, at most 2x autocast's deviation, and 95% of document pairs in fp32 order (measured: >= 96.8%).
A wrong or stale weight, or a LayerNorm left out, moves scores by about the whole spread.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import spread_tk_scores

from pyserini_mores.rerankers.learned import ModelReranker, bf16_scoring_copy
from pyserini_mores.sidecar import SidecarWriter, open_sidecar
from pyserini_mores.types import Query, Text

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERIES = ["what is a text editor", "how do debian packages get installed", "compile the linux kernel"]
SPREAD_TOLERANCE = 0.10  # RMS deviation from fp32 / std of the fp32 scores
AUTOCAST_FACTOR = 2.0  # bf16 weights may deviate at most this much more than autocast does
PAIR_AGREEMENT = 0.95
FINGERPRINT_FREE_INDEX = {"num_docs": 20, "signature": "test:precision"}


def _spread_weights(model, seed: int = 0):
    """Weights wider than BERT's init, and non-trivial LayerNorms, so that scores differ clearly between documents
    (with std-0.02 heads every score is ~0 and any tolerance is vacuous)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name:
                parameter.add_(0.2 * noise)
            elif parameter.dim() == 2:
                parameter.copy_(noise * (1.0 if "head" in name else 0.3))
            else:
                parameter.copy_(noise * 0.1)
    return model.eval()


def _model(kind: str, dims, tokenizer):
    torch.manual_seed(0)
    if kind.startswith("mores-s2"):  # read head-major (BERT-base's default), or as stored with "-tokens"
        from pyserini_mores.models.mores import MoresConfig, MoresModel

        reads = "tokens" if kind.endswith("-tokens") else "heads"
        return _spread_weights(MoresModel(MoresConfig(encoder=dims, n_interaction_blocks=2, reuse="s2",
                                                      doc_max_length=64, s2_reads=reads), tokenizer))
    if kind.startswith("prettr"):
        from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel

        compression = 16 if kind.endswith("e16") else None
        reuse = "kv" if kind.endswith("-kv") else "states"  # the last layer's keys and values, read head-major
        return _spread_weights(PreTTRModel(PreTTRConfig(encoder=dims, join_layer=dims.num_hidden_layers - 1,
                                                        compression_dim=compression, query_max_length=12,
                                                        doc_max_length=64, reuse=reuse), tokenizer))
    if kind == "tk":
        from pyserini_mores.models.tk import TKConfig, TKModel

        model = TKModel(TKConfig(embedding_dim=dims.hidden_size, vocab_size=len(tokenizer), num_layers=2, num_heads=4,
                                 head_dim=8, ffn_dim=16, doc_max_length=64), tokenizer).eval()
        return spread_tk_scores(model)  # the paper's init gives scores of ~1e-3
    if kind == "cross-encoder":
        from pyserini_mores.models.cross_encoder import CrossEncoder, CrossEncoderConfig

        return _spread_weights(CrossEncoder(CrossEncoderConfig(encoder=dims, doc_max_length=64), tokenizer))
    raise AssertionError(kind)


def _sidecar(tmp_path, model, texts: list[str]):
    """A float32 sidecar of ``model``'s fp32 document representations: every precision reads the same rows."""
    with torch.no_grad():
        reps = model.encode_documents(model.tokenize_documents(texts))
    path = tmp_path / f"{model.model_type}-{model.store_variant}"
    writer = SidecarWriter(path, dim=model.store_width, dtype="float32", docids=[f"d{i}" for i in range(len(texts))],
                           model={"model_type": model.model_type, "store_variant": model.store_variant,
                                  "fingerprint": model.store_fingerprint()},
                           index={**FINGERPRINT_FREE_INDEX, "num_docs": len(texts)})
    writer.add([rep.float() for rep in reps])
    writer.finalize()
    return open_sidecar(path, expect_model_fingerprint=model.store_fingerprint())


def _candidates(texts: list[str]) -> list[Text]:
    return [Text(text, {"docid": f"d{i}", "lucene_docid": i}) for i, text in enumerate(texts)]


def _scores(reranker: ModelReranker, query: str, texts: list[str]) -> np.ndarray:
    scored = reranker.rescore(Query(query), _candidates(texts))
    return np.array([text.score for text in scored])


def _pair_agreement(reference: np.ndarray, other: np.ndarray) -> float:
    i, j = np.triu_indices(len(reference), 1)
    return float(np.mean(np.sign(reference[i] - reference[j]) == np.sign(other[i] - other[j])))


# ---- what is cast ------------------------------------------------------------------------------------------------
def test_bf16_copy_casts_weights_keeps_layernorm_fp32_and_leaves_the_model_alone(tiny_dims, tokenizer):
    model = _model("mores-s2", tiny_dims, tokenizer)
    fingerprint, state = model.store_fingerprint(), {k: v.clone() for k, v in model.state_dict().items()}
    copy = bf16_scoring_copy(model)
    norms = {f"{name}.{p}" for name, module in copy.named_modules() if isinstance(module, torch.nn.LayerNorm)
             for p in ("weight", "bias")}
    assert norms, "the model has LayerNorms"
    for name, parameter in copy.named_parameters():
        assert parameter.dtype == (torch.float32 if name in norms else torch.bfloat16), name
        assert name in norms or not parameter.requires_grad  # inference copies; shared norms stay as they were
    assert all(parameter.dtype == torch.float32 for parameter in model.parameters())
    assert model.store_fingerprint() == fingerprint
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    # LayerNorm parameters are shared, not copied; the tokenizer too.
    assert copy.query_module.embeddings.norm.weight is model.query_module.embeddings.norm.weight
    assert copy.tokenizer is model.tokenizer


def test_tk_keeps_its_fp32_kernel_head_in_fp32(tiny_dims, tokenizer):
    model = _model("tk", tiny_dims, tokenizer)
    copy = bf16_scoring_copy(model)
    kept = {name for name, parameter in copy.named_parameters() if parameter.dtype == torch.float32}
    # TK runs kernel pooling and its final linears with autocast disabled, on purpose (models/tk.py)
    assert {"log_weights.weight", "len_weights.weight", "combine.weight", "pooled_scale"} <= kept
    assert copy.embeddings.weight.dtype == torch.bfloat16 and "mixer" not in kept


def test_the_copy_is_made_once_and_only_for_bf16(tiny_dims, tokenizer):
    model = _model("mores-s2", tiny_dims, tokenizer)
    assert ModelReranker(model, precision="fp32").scoring_model is model
    assert ModelReranker(model, precision="bf16", cast_weights=False).scoring_model is model
    reranker = ModelReranker(model, precision="bf16", cast_weights=True)
    first = reranker.scoring_model
    assert first is not model and first.interaction_module.head.weight.dtype == torch.bfloat16
    _scores(reranker, QUERIES[0], ["a text editor", "the kernel"])
    assert reranker.scoring_model is first, "scoring must not cast the weights again"


def test_the_copy_follows_weight_changes(tiny_dims, tokenizer, tiny_documents):
    texts = [doc["contents"] for doc in tiny_documents[:8]]
    model = _model("mores-s2", tiny_dims, tokenizer)
    reranker = ModelReranker(model, precision="bf16", cast_weights=True)
    before = _scores(reranker, QUERIES[0], texts)
    other = _spread_weights(_model("mores-s2", tiny_dims, tokenizer), seed=1)
    model.load_state_dict(other.state_dict())  # in place: what loading a checkpoint into a live model does
    after = _scores(reranker, QUERIES[0], texts)
    fresh = _scores(ModelReranker(other, precision="bf16", cast_weights=True), QUERIES[0], texts)
    np.testing.assert_array_equal(after, fresh)
    assert not np.allclose(after, before)


def test_each_model_chooses_its_bf16_path_unless_the_caller_does(tiny_dims, tokenizer):
    """MORES scores bf16 under autocast alone (its bf16 weight copy cost ranking quality, see models/mores.py);
    the others cast their weights once. An explicit cast_weights wins either way."""
    for kind, copies in (("mores-s2", False), ("prettr", True), ("tk", True), ("cross-encoder", True)):
        model = _model(kind, tiny_dims, tokenizer)
        assert (ModelReranker(model, precision="bf16").scoring_model is not model) == copies, kind
        assert ModelReranker(model, precision="bf16", cast_weights=not copies).cast_weights == (not copies), kind


# ---- scores ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["mores-s2", "prettr", "prettr-e16", "prettr-kv", "tk", "cross-encoder"])
def test_bf16_weights_score_and_rank_like_fp32(tmp_path, tiny_dims, tokenizer, tiny_documents, kind):
    texts = [doc["contents"] for doc in tiny_documents]
    model = _model(kind, tiny_dims, tokenizer)
    sidecar = _sidecar(tmp_path, model, texts) if model.store_width is not None else None
    rerankers = {"fp32": ModelReranker(model, sidecar, precision="fp32"),
                 "bf16 weights": ModelReranker(model, sidecar, precision="bf16", cast_weights=True),
                 "autocast": ModelReranker(model, sidecar, precision="bf16", cast_weights=False)}
    scores = {name: [_scores(reranker, query, texts) for query in QUERIES] for name, reranker in rerankers.items()}
    reference = np.concatenate(scores["fp32"])
    spread = min(per_query.std() for per_query in scores["fp32"])
    assert spread > 0.5, "scores must spread for the comparison to mean anything"
    deviation = {}
    for name in ("bf16 weights", "autocast"):
        values = np.concatenate(scores[name])
        assert np.isfinite(values).all()
        deviation[name] = float(np.sqrt(np.mean((values - reference) ** 2)))
        assert deviation[name] <= SPREAD_TOLERANCE * reference.std(), (name, deviation[name], reference.std())
        for fp32, other in zip(scores["fp32"], scores[name]):
            assert _pair_agreement(fp32, other) >= PAIR_AGREEMENT, name
    assert deviation["bf16 weights"] <= AUTOCAST_FACTOR * deviation["autocast"], deviation


@pytest.mark.parametrize("kind", ["mores-s2", "mores-s2-tokens", "prettr", "prettr-kv"])
def test_sidecar_scores_equal_the_scores_from_text(tmp_path, tiny_dims, tokenizer, tiny_documents, kind):
    """Through a real sidecar (MORES S2 read head-major or as stored, PreTTR's stored keys and values read
    head-major) the reranker gives the text path's scores."""
    texts = [doc["contents"] for doc in tiny_documents]
    model = _model(kind, tiny_dims, tokenizer)
    from_sidecar = ModelReranker(model, _sidecar(tmp_path, model, texts), precision="fp32")
    from_text = ModelReranker(model, None, precision="fp32")
    for query in QUERIES:
        expected = _scores(from_text, query, texts)
        assert expected.std() > 0.5
        np.testing.assert_allclose(_scores(from_sidecar, query, texts), expected, atol=1e-5, rtol=0)


def test_batch_memory_is_kept_between_queries_and_released_on_request(tmp_path, tiny_dims, tokenizer,
                                                                       tiny_documents):
    texts = [doc["contents"] for doc in tiny_documents]
    model = _model("mores-s2", tiny_dims, tokenizer)
    reranker = ModelReranker(model, _sidecar(tmp_path, model, texts), precision="fp32")
    first = _scores(reranker, QUERIES[0], texts)
    buffer = reranker._batch_buffer()
    kept = buffer.take("stored", (1,), torch.float32).data_ptr()
    _scores(reranker, QUERIES[1], texts)
    assert reranker._batch_buffer() is buffer and buffer.take("stored", (1,), torch.float32).data_ptr() == kept
    reranker.release_memory()
    assert reranker._batch_buffer() is not buffer
    np.testing.assert_array_equal(_scores(reranker, QUERIES[0], texts), first)


def test_bf16_weights_read_the_sidecar_of_the_fp32_model(tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    from pyserini_mores import get_reranker
    from pyserini_mores.search import RerankingSearcher

    reranker = get_reranker("maxsim", model=tiny_maxsim_dir, sidecar=maxsim_sidecar, precision="bf16")
    fingerprint = reranker.model.store_fingerprint()
    texts = [Text(None, {"docid": docid, "lucene_docid": row}) for row, docid in
             enumerate(reranker.sidecar.docids(range(reranker.sidecar.num_docs)))]
    bf16 = [t.score for t in reranker.rescore(Query("text editor"), texts)]
    fp32 = [t.score for t in get_reranker("maxsim", model=tiny_maxsim_dir, sidecar=maxsim_sidecar)
            .rescore(Query("text editor"), [Text(None, dict(t.metadata)) for t in texts])]
    assert reranker.model.store_fingerprint() == fingerprint
    assert np.sqrt(np.mean((np.array(bf16) - fp32) ** 2)) <= SPREAD_TOLERANCE * np.std(fp32)
    assert _pair_agreement(np.array(fp32), np.array(bf16)) >= PAIR_AGREEMENT
    # The searcher finds the default sidecar by the (unchanged) fingerprint after bf16 scoring.
    reranker.sidecar = None
    searcher = RerankingSearcher(tiny_index, reranker, sidecar="auto", require_sidecar=True)
    try:
        assert searcher.sidecar_path == maxsim_sidecar
    finally:
        searcher.close()


def test_invalid_precision_is_refused(tiny_dims, tokenizer):
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16, not 'fp16'"):
        ModelReranker(_model("mores-s2", tiny_dims, tokenizer), precision="fp16")


# ---- the benchmark times both bf16 paths ---------------------------------------------------------------------------
def test_bench_times_bf16_weights_and_autocast_side_by_side(tmp_path):
    from pyserini_mores.bench.runner import BenchConfig, run_benchmark

    config = BenchConfig(backbones=["tiny"], doc_lens=[16], models=["mores:1xIB-s2"],
                         precisions=["bf16-copy", "bf16-autocast"], candidates=10, repetitions=1,
                         work_dir=str(tmp_path), peak_sizes=(64,), peak_repetitions=1)
    records = {record["precision"]: record for record in run_benchmark(config)["results"]}
    assert set(records) == {"bf16-copy", "bf16-autocast"}
    for record in records.values():
        # the query is encoded by the model that scores: its time is seen through the bf16 copy too
        assert record["query_encode_ms_median"] > 0 and record["ms_per_query_median"] > 0
        assert record["peak_fraction"] is not None
    with pytest.raises(ValueError, match="unknown precision"):
        BenchConfig(backbones=["tiny"], precisions=["fp16"])


# ---- the score head stays fp32 ------------------------------------------------------------------------------------
def test_the_score_head_runs_in_fp32_under_autocast_and_with_bf16_weights():
    import copy

    from pyserini_mores.models._layers import score_head

    torch.manual_seed(0)
    head = torch.nn.Linear(32, 2)
    pooled = torch.randn(1, 32).repeat(2, 1)
    pooled[1] += 1e-4 * torch.randn(32)  # two candidates closer than bf16 can tell apart
    expected = torch.nn.functional.linear(pooled, head.weight, head.bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = head(pooled)
        logits = score_head(head, pooled)
        from_bf16_weights = score_head(copy.deepcopy(head).to(torch.bfloat16), pooled)
    assert plain.dtype == torch.bfloat16 and torch.equal(plain[0], plain[1]), "autocast alone would tie them"
    assert logits.dtype == torch.float32 and not torch.equal(logits[0], logits[1])
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)
    assert from_bf16_weights.dtype == torch.float32 and not torch.equal(from_bf16_weights[0], from_bf16_weights[1])


@pytest.mark.parametrize("kind", ["mores-s2", "prettr", "cross-encoder"])
def test_bf16_scores_are_not_rounded_to_bf16(tmp_path, tiny_dims, tokenizer, tiny_documents, kind):
    """A score rounded to bf16 (8 significant bits) ties with its neighbours; the heads run in fp32 instead."""
    texts = [doc["contents"] for doc in tiny_documents]
    model = _model(kind, tiny_dims, tokenizer)
    sidecar = _sidecar(tmp_path, model, texts) if model.store_width is not None else None
    for cast_weights in (False, True):
        scores = torch.from_numpy(_scores(ModelReranker(model, sidecar, precision="bf16", cast_weights=cast_weights),
                                          QUERIES[1], texts))
        assert not torch.equal(scores, scores.bfloat16().float()), (kind, cast_weights)
