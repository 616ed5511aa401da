"""Explanations: attention rows are distributions over real keys, MORES/PreTTR attention equals what the models'
own scoring computes (recorded inside their attention kernels), TK's decompositions reproduce the score, and the
command renders every figure type with a page and a JSON that refer to them — on tiny random models."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_models import spread_tk_scores, spread_weights

from pyserini_mores import get_reranker
from pyserini_mores.explain import (
    combine_heads,
    compare_kernel_scores,
    mores_attention,
    parse_heads,
    prettr_joined_attention,
    tk_kernel_scores,
)
from pyserini_mores.explain.__main__ import main
from pyserini_mores.index import fetch_texts, open_searcher
from pyserini_mores.models import pad_documents
from pyserini_mores.models.mores import MoresConfig, MoresModel
from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel
from pyserini_mores.models.tk import TKConfig, TKModel
from pyserini_mores.search.searcher import default_sidecar_path
from pyserini_mores.sidecar.build import build_sidecar

QUERY = "text editor for source code"
DOCIDS = ["d04", "d01", "d02"]  # of different lengths, so every batch carries padding
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _save_with_sidecar(model, directory: Path, name: str, index: Path) -> Path:
    """Save ``model``, and build its float32 sidecar over ``index`` at the default location; returns the model dir."""
    model.save_pretrained(directory)
    reranker = get_reranker(name, model=directory)  # loaded back the way the command loads it
    searcher = open_searcher(index)
    try:
        build_sidecar(searcher, reranker.model, default_sidecar_path(index, name, reranker.model), reranker_name=name,
                      dtype="float32", batch_size=8, progress=False)
    finally:
        searcher.close()
    return directory


@pytest.fixture(scope="module")
def mores_dir(tmp_path_factory, tokenizer, tiny_index) -> Path:
    from pyserini_mores.models._layers import BertDims

    dims = BertDims(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)
    torch.manual_seed(0)
    model = MoresModel(MoresConfig(encoder=dims, n_interaction_blocks=2, reuse="s1", doc_max_length=64), tokenizer)
    spread_weights(model, seed=1)
    return _save_with_sidecar(model.eval(), tmp_path_factory.mktemp("models") / "tiny-mores", "mores", tiny_index)


@pytest.fixture(scope="module")
def prettr_dir(tmp_path_factory, tokenizer, tiny_index) -> Path:
    from pyserini_mores.models._layers import BertDims

    dims = BertDims(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=128)
    torch.manual_seed(0)
    config = PreTTRConfig(encoder=dims, join_layer=1, query_max_length=12, doc_max_length=48)
    model = PreTTRModel(config, tokenizer)
    spread_weights(model, seed=1)
    return _save_with_sidecar(model.eval(), tmp_path_factory.mktemp("models") / "tiny-prettr", "prettr", tiny_index)


def _tiny_tk(tokenizer) -> TKModel:
    torch.manual_seed(0)
    config = TKConfig(embedding_dim=32, vocab_size=len(tokenizer), num_layers=2, num_heads=4, head_dim=8, ffn_dim=16,
                      doc_max_length=64)
    model = TKModel(config, tokenizer).eval()
    return spread_tk_scores(model)


@pytest.fixture(scope="module")
def tk_dir(tmp_path_factory, tokenizer, tiny_index) -> Path:
    return _save_with_sidecar(_tiny_tk(tokenizer), tmp_path_factory.mktemp("models") / "tiny-tk", "tk", tiny_index)


@pytest.fixture(scope="module")
def texts(tiny_index) -> list[str]:
    searcher = open_searcher(tiny_index)
    try:
        return fetch_texts(searcher, DOCIDS)
    finally:
        searcher.close()


def _reranker_with_sidecar(name: str, model_dir: Path, index: Path, **overrides):
    from pyserini_mores.sidecar import open_sidecar

    reranker = get_reranker(name, model=model_dir, **overrides)
    reranker.sidecar = open_sidecar(default_sidecar_path(index, name, reranker.model))
    return reranker


def _stored(reranker, docids=DOCIDS):
    return reranker.sidecar.get_batch(reranker.sidecar.rows_for_docids(docids))


class RecordedAttention:
    """Records the post-softmax probabilities of every fused attention call the models make (torch's
    ``scaled_dot_product_attention``), computed from the very queries, keys and mask the model passes it."""

    def __init__(self):
        self.calls: list[torch.Tensor] = []
        self._original = F.scaled_dot_product_attention

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
        logits = (query.double() @ key.double().transpose(-1, -2)) * scale
        if attn_mask is not None:
            logits = logits.masked_fill(~attn_mask, float("-inf"))
        self.calls.append(logits.softmax(-1).float())
        return self._original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                              scale=scale, **kwargs)


@pytest.fixture
def recorded(monkeypatch) -> RecordedAttention:
    recorder = RecordedAttention()
    monkeypatch.setattr(F, "scaled_dot_product_attention", recorder)
    return recorder


def _assert_distributions(probs: torch.Tensor, key_mask: torch.Tensor) -> None:
    """``probs [B, h, r, L]``: every row sums to 1 over the real keys ``key_mask [B, L]``; padded keys get 0."""
    key_mask = key_mask[:, None, None, :].expand_as(probs)
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]), atol=1e-5, rtol=0)
    assert (probs[~key_mask] == 0).all()
    assert (probs[key_mask] > 0).all()


# ---- MORES ---------------------------------------------------------------------------------------------------------
def test_heads_are_parsed_and_combined():
    assert parse_heads("mean", 4) is None and parse_heads(None, 4) is None
    assert parse_heads("3,0,3", 4) == [0, 3]
    for bad in ("4", "x", "-1", ","):
        with pytest.raises(ValueError, match="heads"):
            parse_heads(bad, 4)
    probs = torch.rand(2, 4, 3, 5).softmax(-1)
    torch.testing.assert_close(combine_heads(probs, [1, 3]), (probs[:, 1] + probs[:, 3]) / 2)
    torch.testing.assert_close(combine_heads(probs).sum(-1), torch.ones(2, 3))


@pytest.mark.parametrize("from_sidecar", [True, False])
def test_mores_attention_rows_are_distributions_over_real_tokens(mores_dir, tiny_index, texts, from_sidecar):
    reranker = _reranker_with_sidecar("mores", mores_dir, tiny_index)
    model = reranker.model
    doc_batch = model.tokenize_documents(texts)
    docs, lengths = _stored(reranker) if from_sidecar else (None, None)
    attention = mores_attention(model, model.tokenize_queries([QUERY]), docs=docs, lengths=lengths,
                                doc_batch=doc_batch, document_layer=2)
    real = doc_batch["attention_mask"].bool()
    assert real.sum(1).unique().numel() == len(DOCIDS)  # different lengths: padding is exercised
    assert torch.equal(attention.doc_mask, real)
    assert len(attention.cross) == 2 and attention.document_layer == 2 and attention.query_layer == 2
    for cross in attention.cross:
        assert cross.shape == (len(DOCIDS), 4, attention.query.shape[-1], real.shape[1])
        _assert_distributions(cross, real)
    _assert_distributions(attention.document, real)
    _assert_distributions(attention.query, attention.query_mask[None])


@pytest.mark.parametrize("reuse", ["s1", "s2"])
def test_mores_attention_equals_the_attention_inside_the_models_scoring(mores_dir, texts, monkeypatch, reuse):
    reranker = get_reranker("mores", model=mores_dir, reuse=reuse)
    model = reranker.model
    query_batch, doc_batch = model.tokenize_queries([QUERY]), model.tokenize_documents(texts)
    docs, lengths = pad_documents(model.encode_documents(doc_batch))  # what a sidecar of this variant stores
    explained = mores_attention(model, query_batch, docs=docs, lengths=lengths, doc_batch=doc_batch)

    recorder = RecordedAttention()
    monkeypatch.setattr(F, "scaled_dot_product_attention", recorder)
    with torch.no_grad():
        state = model.encode_query(query_batch)  # the query module's layers
        query_calls = list(recorder.calls)
        recorder.calls.clear()
        model.score(state, docs, lengths)  # per block: cross-attention, then query self-attention (the last
        # block's self-attention is computed for the [CLS] row only, outside scaled_dot_product_attention)
        block_calls = list(recorder.calls)
        recorder.calls.clear()
        model.encode_documents(doc_batch)  # the document module's layers
        document_calls = list(recorder.calls)

    assert len(query_calls) == model.config.n_query_layers and len(block_calls) == 2 * len(explained.cross) - 1
    real = doc_batch["attention_mask"].bool()[:, None, None, :].expand_as(explained.cross[0])
    for block, cross in enumerate(explained.cross):
        inside = block_calls[2 * block]
        assert inside.shape == cross.shape
        torch.testing.assert_close(cross[real], inside[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(explained.query, query_calls[-1], atol=1e-5, rtol=0)
    inside_document = document_calls[explained.document_layer - 1]
    doc_mask = doc_batch["attention_mask"].bool()
    pairs = (doc_mask[:, :, None] & doc_mask[:, None, :])[:, None].expand_as(inside_document)
    torch.testing.assert_close(explained.document[pairs], inside_document[pairs], atol=1e-5, rtol=0)


# ---- PreTTR --------------------------------------------------------------------------------------------------------
def test_prettr_joined_attention_equals_the_first_joined_layer_of_scoring(prettr_dir, tiny_index, texts, recorded):
    reranker = _reranker_with_sidecar("prettr", prettr_dir, tiny_index)
    model = reranker.model
    docs, lengths = _stored(reranker)
    query_batch = model.tokenize_queries([QUERY])
    joined = prettr_joined_attention(model, query_batch, docs=docs, lengths=lengths)
    assert joined.layer == model.join_layer + 1 and joined.query_block == model.query_block_length
    # padding of the query block and of each document gets 0; every row is a distribution over real tokens
    assert not joined.mask[:, :joined.query_block].all() and not joined.mask.all()
    _assert_distributions(joined.probs, joined.mask)

    with torch.no_grad():
        state = model.encode_query(query_batch)
        recorded.calls.clear()
        model.score(state, docs, lengths)  # layers l+1 .. L-1 run on the joined sequence, then the CLS-only layer
    inside = recorded.calls[0]
    pairs = (joined.mask[:, :, None] & joined.mask[:, None, :])[:, None].expand_as(inside)
    torch.testing.assert_close(joined.probs[pairs], inside[pairs], atol=1e-5, rtol=0)
    # the same from text
    from_text = prettr_joined_attention(model, query_batch, doc_batch=model.tokenize_documents(texts))
    torch.testing.assert_close(from_text.probs, joined.probs, atol=1e-5, rtol=0)


def test_prettr_compressed_last_layer_join_matches_the_reference_forward(tokenizer, tiny_dims, texts, recorded):
    """join_layer = L-1 with a compressor: scoring keeps only the [CLS] row, so compare every row with layer l+1 of
    the paper's block-diagonal reference forward."""
    torch.manual_seed(0)
    model = PreTTRModel(PreTTRConfig(encoder=tiny_dims, compression_dim=16, query_max_length=12, doc_max_length=48),
                        tokenizer)
    spread_weights(model, seed=1)
    model.eval()
    query_batch, doc_batch = model.tokenize_queries([QUERY]), model.tokenize_documents(texts)
    docs, lengths = pad_documents(model.encode_documents(doc_batch))  # the compressed codes a sidecar stores
    joined = prettr_joined_attention(model, query_batch, docs=docs, lengths=lengths)
    with torch.no_grad():
        recorded.calls.clear()
        model.joint_forward_masked(query_batch, doc_batch)
    inside = recorded.calls[model.join_layer]
    pairs = (joined.mask[:, :, None] & joined.mask[:, None, :])[:, None].expand_as(inside)
    torch.testing.assert_close(joined.probs[pairs], inside[pairs], atol=1e-5, rtol=0)
    _assert_distributions(joined.probs, joined.mask)


# ---- TK ------------------------------------------------------------------------------------------------------------
def test_tk_kernel_contributions_reproduce_the_score(tk_dir, tiny_index, texts):
    from pyserini_mores import Query, Text

    reranker = _reranker_with_sidecar("tk", tk_dir, tiny_index)
    model = reranker.model
    docs, lengths = _stored(reranker)
    stored = tk_kernel_scores(model, QUERY, texts, docs=docs, lengths=lengths)
    from_text = tk_kernel_scores(model, QUERY, texts)
    reranked = reranker.rescore(Query(QUERY), [Text(text=t, metadata={"docid": d}) for d, t in zip(DOCIDS, texts)])
    scores = torch.tensor([text.score for text in reranked])
    first_minus_second = float(scores[0] - scores[1])
    assert scores.std() > 0.05  # the documents get clearly different scores
    for text, kernels, text_kernels, score, length in zip(texts, stored, from_text, scores.tolist(),
                                                          lengths.tolist()):
        assert kernels.score == pytest.approx(score, abs=1e-4)
        assert text_kernels.score == pytest.approx(score, abs=1e-4)
        # the per-kernel numbers (model weights included) add up to s_log, s_len and the score
        assert float(kernels.log_contributions.sum()) == pytest.approx(kernels.s_log, abs=1e-4)
        assert float(kernels.len_contributions.sum()) == pytest.approx(kernels.s_len, abs=1e-4)
        assert float(kernels.kernel_contributions.sum()) == pytest.approx(score, abs=1e-4)
        # and so do the query terms' shares
        assert float(kernels.query_term_contributions.sum()) == pytest.approx(score, abs=1e-4)
        assert kernels.query_kernel_mass.shape == (len(kernels.query_tokens), len(kernels.kernel_mus))
        assert len(kernels.doc_tokens) == length == kernels.match_matrix.shape[1]
        torch.testing.assert_close(kernels.match_matrix, text_kernels.match_matrix, atol=1e-5, rtol=0)
        assert kernels.best_match.max() <= 1 + 1e-5
        # the offsets name the very terms the model matched
        assert [text[start:end].lower() for start, end in kernels.term_offsets] == \
            [token.removeprefix("##") for token in kernels.doc_tokens]
    comparison = compare_kernel_scores(stored[0], stored[1])
    assert sum(comparison["kernel_differences"]) == pytest.approx(first_minus_second, abs=1e-4)
    assert sum(comparison["query_term_differences"]) == pytest.approx(first_minus_second, abs=1e-4)
    assert sorted(comparison["kernels_by_influence"]) == sorted(model.config.kernel_mus)


def test_tk_refuses_a_sidecar_row_that_does_not_fit_the_text(tk_dir, tiny_index, texts):
    reranker = _reranker_with_sidecar("tk", tk_dir, tiny_index)
    docs, lengths = _stored(reranker, ["d04", "d01"])
    with pytest.raises(ValueError, match="sidecar holds .* terms"):
        tk_kernel_scores(reranker.model, QUERY, [texts[1], texts[0]], docs=docs, lengths=lengths)


# ---- the command ---------------------------------------------------------------------------------------------------
def _check_output(output: Path, expected_pngs: int) -> dict:
    page = (output / "index.html").read_text(encoding="utf-8")
    pngs = sorted(output.glob("*.png"))
    assert len(pngs) == expected_pngs
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000, png.name
        assert f'src="{png.name}"' in page, png.name
    linked = set(re.findall(r'src="([^"]+)"', page))
    assert linked == {png.name for png in pngs}  # every image on the page exists, relative, in the folder
    assert 'href="explanation.json"' in page
    report = json.loads((output / "explanation.json").read_text(encoding="utf-8"))
    named = set(report["shared_figures"].values()) | set(report["comparison_figures"].values())
    for document in report["documents"]:
        named |= set(document["figures"].values())
    assert named == {png.name for png in pngs}
    return report


def test_command_renders_every_figure_type(mores_dir, prettr_dir, tk_dir, tiny_index, tmp_path, capsys):
    common = ["--index", str(tiny_index), "--query", QUERY]
    # MORES from its S1 sidecar: 1 shared query-module map + per document (1 document-module + 2 cross) maps
    assert main(common + ["--reranker", "mores", "--model", str(mores_dir), "--model-arg", "reuse=s1", "--top", "2",
                          "--heads", "0,2", "--layer", "3", "--output", str(tmp_path / "mores")]) == 0
    report = _check_output(tmp_path / "mores", 1 + 2 * 3)
    assert report["source"].startswith("sidecar") and report["heads"] == [0, 2]
    document = report["documents"][0]
    assert set(document["attention"]) == {"document_layer3", "ib1_cross", "ib2_cross"}
    cross = document["attention"]["ib2_cross"]
    assert len(cross["weights"]) == len(cross["rows"]) and len(cross["weights"][0]) == len(cross["columns"])
    assert cross["rows"][0] == "[CLS]" and cross["columns"][-1] == "[SEP]"
    assert all(abs(sum(row) - 1) < 1e-4 for row in cross["weights"])
    assert [doc["rank"] for doc in report["documents"]] == [1, 2]

    # TK from text (no sidecar for mode=online): per document kernels + shaded text, and the comparison
    assert main(common + ["--reranker", "tk", "--model", str(tk_dir), "--model-arg", "mode=online",
                          "--docid", "d04", "d05", "--output", str(tmp_path / "tk")]) == 0
    report = _check_output(tmp_path / "tk", 2 * 2 + 1)
    assert report["source"] == "text" and [doc["docid"] for doc in report["documents"]] == ["d04", "d05"]
    kernels = report["documents"][0]["kernels"]
    assert sum(kernels["kernel_contributions"]) == pytest.approx(report["documents"][0]["score"], abs=1e-4)
    assert report["comparison"]["first"] == "d04" and report["comparison"]["second"] == "d05"
    page = (tmp_path / "tk" / "index.html").read_text(encoding="utf-8")
    assert page.count('<span class="term"') == sum(len(doc["kernels"]["doc_tokens"]) for doc in report["documents"])

    # PreTTR from its sidecar: one joined-layer map per document; a second report in the same folder replaces the
    # figures of the first (and leaves other files alone)
    prettr = ["--reranker", "prettr", "--model", str(prettr_dir), "--output", str(tmp_path / "prettr")]
    assert main(common + prettr + ["--top", "2"]) == 0
    _check_output(tmp_path / "prettr", 2)
    (tmp_path / "prettr" / "notes.png").write_bytes(PNG_SIGNATURE + bytes(2000))
    assert main(common + prettr + ["--top", "1"]) == 0
    (tmp_path / "prettr" / "notes.png").unlink()
    report = _check_output(tmp_path / "prettr", 1)
    joined = report["documents"][0]["attention"]["joined_layer2"]
    assert joined["rows"][0] == "[CLS]" and joined["split"] == joined["rows"].index("[SEP]") + 1
    assert "Report:" in capsys.readouterr().out


def test_command_explains_only_models_it_knows(tiny_index, tiny_maxsim_dir, tmp_path, capsys):
    assert main(["--index", str(tiny_index), "--query", QUERY, "--reranker", "maxsim", "--model", str(tiny_maxsim_dir),
                 "--output", str(tmp_path / "out")]) == 2
    assert "explain supports the rerankers mores, prettr, tk" in capsys.readouterr().err
    assert main(["--index", str(tiny_index), "--query", QUERY, "--output", str(tmp_path / "out")]) == 2
    assert "--reranker is required" in capsys.readouterr().err


def test_a_windowed_sidecar_explains_each_documents_first_window(tokenizer, tiny_index, texts, tmp_path):
    """A windowed sidecar's row is every window of a document one after the other; explain shows the first, which is
    what the model reads of the text: the same maps as from a truncated sidecar, with a note that says so."""
    from pyserini_mores.explain import explain_documents
    from pyserini_mores.explain._types import DocumentExplanation
    from pyserini_mores.models._layers import BertDims
    from pyserini_mores.sidecar import open_sidecar
    from pyserini_mores.windows import WindowOptions

    dims = BertDims(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)
    torch.manual_seed(0)
    model = spread_weights(MoresModel(MoresConfig(encoder=dims, n_interaction_blocks=1, reuse="s1",
                                                  doc_max_length=8), tokenizer), seed=2).eval()
    reports = {}
    for name, windows in (("truncated", None), ("windowed", WindowOptions(max_windows=4))):
        searcher = open_searcher(tiny_index)
        try:
            path = build_sidecar(searcher, model, tmp_path / name, reranker_name="mores", dtype="float32",
                                 batch_size=4, progress=False, windows=windows)
        finally:
            searcher.close()
        reranker = get_reranker("mores", model=model)
        reranker.sidecar = open_sidecar(path)
        if name == "windowed":
            assert reranker.sidecar.window_counts(reranker.sidecar.rows_for_docids(DOCIDS)).min() > 1
        documents = [DocumentExplanation(docid=docid, text=text, score=0.0) for docid, text in zip(DOCIDS, texts)]
        reports[name] = explain_documents(reranker, QUERY, documents)
    truncated, windowed = reports["truncated"], reports["windowed"]
    assert any(note.startswith("The sidecar stores up to 4 windows per document; shown is the first window")
               for note in windowed.notes)
    assert not any("windows per document" in note for note in truncated.notes)
    for plain, first in zip(truncated.documents, windowed.documents):
        assert [m.key for m in plain.attention] == [m.key for m in first.attention]
        for plain_map, first_map in zip(plain.attention, first.attention):
            assert plain_map.columns == first_map.columns
            torch.testing.assert_close(torch.as_tensor(first_map.weights), torch.as_tensor(plain_map.weights),
                                       rtol=1e-5, atol=1e-6)
