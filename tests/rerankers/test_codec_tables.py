"""Reranking from an rq sidecar through look-up tables: each query vector's inner product with every codebook entry
is tabled once per query, and a stored vector's products are the sums of its code's entries, never decoded. TK,
whose cosines also need the stored norm, scores codes that end in a norm byte: its scores must equal TK's on the
decoded terms with those norms, and come within the norm byte's rounding of TK on the decoded terms; MaxSim needs
no norm and must score what it scores on the decoded vectors. Every candidate must be scored with its own codes;
other codecs, and TK's rq codes without norms, read decoded vectors as before; a word stage's id adds its word's
table row; and a sharded sidecar scores codes only when its shards share one codec."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_codec_frame import QUERY, _candidates, _model, _scores, _sharded, _sidecar, _write, texts  # noqa: F401

from pyserini_mores.models import code_tables
from pyserini_mores.rerankers.learned import ModelReranker
from pyserini_mores.sidecar import open_sidecar, rq
from pyserini_mores.sidecar.rq import word_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RQ = {"rq_codebooks": 4, "rq_norms": 1}


def _stored_norms(sidecar, rows) -> torch.Tensor:
    """``[B, Lmax]``: the norm each stored code's last byte stands for."""
    codes, _ = sidecar.get_batch(np.asarray(rows), codes=True)
    return torch.from_numpy(sidecar.store_codebooks.norm_levels)[codes[..., -1].long()]


def _scores_with_stored_norms(model, sidecar, rows) -> np.ndarray:
    """TK's scores of the decoded rows ``x̂``, their cosines taken over the norms the codes store."""
    with torch.no_grad():
        state = model.encode_query(model.tokenize_queries([QUERY]))
        docs, lengths = sidecar.get_batch(np.asarray(rows))
        return model.score(state, docs, lengths, norms=_stored_norms(sidecar, rows)).float().numpy()


def _decoded_scores(model, sidecar, rows) -> np.ndarray:
    with torch.no_grad():
        state = model.encode_query(model.tokenize_queries([QUERY]))
        return model.score(state, *sidecar.get_batch(np.asarray(rows))).float().numpy()


def _recorded_reads(sidecar, monkeypatch) -> list[bool]:
    """A list that records, for every batch of spans the sidecar reads from now on, whether it read codes."""
    reads = []
    read = type(sidecar).get_spans
    monkeypatch.setattr(type(sidecar), "get_spans",
                        lambda self, *a, **k: reads.append(k.get("codes", False)) or read(self, *a, **k))
    return reads


@pytest.fixture
def tk_rq(tmp_path, tokenizer, texts):  # noqa: F811
    model = _model("tk", tokenizer)
    return model, _sidecar(tmp_path, model, texts, codec="rq", options=RQ)


def test_codes_read_undecoded_are_the_stored_codes(tk_rq):
    _, sidecar = tk_rq
    rows = np.array([3, 0, 17, 39, 3])
    codes, lengths = sidecar.get_batch(rows, codes=True)
    assert codes.dtype == torch.uint8 and codes.shape == (5, int(lengths.max()), 5)  # 4 codebooks, the norm
    tokens = np.asarray(sidecar.tokens)
    for position, row in enumerate(rows):
        start, length = int(sidecar.offsets[row]), int(lengths[position])
        np.testing.assert_array_equal(codes[position, :length].numpy(), tokens[start:start + length])
        assert not codes[position, length:].any()
    decoded, _ = sidecar.get_batch(rows)
    books = sidecar.store_codebooks
    entries, levels = torch.from_numpy(books.entries), torch.from_numpy(books.norm_levels)
    summed = entries[torch.arange(4), codes[..., :4].long()].sum(-2)  # [B, L, dim]: one entry of each, summed
    step = float(levels[1] - levels[0])
    for position, length in enumerate(lengths.tolist()):
        torch.testing.assert_close(summed[position, :length], decoded[position, :length], rtol=1e-5, atol=1e-6)
        true_norms = torch.linalg.vector_norm(decoded[position, :length], dim=-1)
        stored = levels[codes[position, :length, 4].long()]
        assert (stored - true_norms).abs().max() <= step / 2 + 1e-6  # the nearest of 256 levels


def test_tk_scores_codes_as_the_decoded_unit_terms(tk_rq, texts):  # noqa: F811
    model, sidecar = tk_rq
    with torch.no_grad():
        state = model.encode_query(model.tokenize_queries([QUERY]))
        tables = model.code_tables(state, torch.from_numpy(sidecar.store_codebooks.entries))
        rows = np.arange(len(texts))
        codes, lengths = sidecar.get_batch(rows, codes=True)
        norms = _stored_norms(sidecar, rows)
        got = model.score_codes(tables, codes[..., :4], lengths, norms).numpy()
        want = _scores_with_stored_norms(model, sidecar, rows)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        spread = want.max() - want.min()
        assert spread > 0.1
        # the stored norms are the decoded terms' own, to the byte's rounding
        np.testing.assert_allclose(got, _decoded_scores(model, sidecar, rows), atol=0.02 * spread)
        # each candidate's own codes: scoring the batch's codes in another order gives the scores in that order
        order = torch.from_numpy(np.random.default_rng(0).permutation(len(rows)))
        shuffled = model.score_codes(tables, codes[order, :, :4], lengths[order], norms[order])
        np.testing.assert_allclose(shuffled.numpy(), got[order], rtol=1e-6)
        assert np.abs(got[order] - got).max() > 1e-2


def test_the_reranker_scores_tk_from_codes_without_decoding(tk_rq, texts, monkeypatch):  # noqa: F811
    model, sidecar = tk_rq
    reads = _recorded_reads(sidecar, monkeypatch)
    reranker = ModelReranker(model, sidecar, batch_size=7, device="cpu", precision="fp32")
    assert reranker.scores_codes
    got = _scores(reranker, texts)
    assert reads and all(reads)  # every batch read as codes: nothing decoded
    rows = np.arange(len(texts))
    np.testing.assert_allclose(got, _scores_with_stored_norms(model, sidecar, rows), rtol=1e-4, atol=1e-4)
    assert reranker._store_codebooks(reranker.scoring_model) is reranker._store_codebooks(reranker.scoring_model)
    # decoding instead (a model that does not score codes) divides by each decoded term's own norm: within the
    # norm byte's rounding of the tables
    decoded = ModelReranker(model, sidecar, batch_size=7, device="cpu", precision="fp32")
    monkeypatch.setattr(type(model), "scores_codes", False)
    assert not decoded.scores_codes
    reads.clear()
    normalised = _scores(decoded, texts)
    assert reads and not any(reads)
    np.testing.assert_allclose(normalised, _decoded_scores(model, sidecar, rows), rtol=1e-4, atol=1e-4)
    assert 0 < np.abs(normalised - got).max() < 0.02 * (got.max() - got.min())


@pytest.mark.parametrize("name", ["tk", "maxsim"])
def test_word_stage_codes_score_as_the_decoded_vectors(name, tmp_path, tokenizer, texts, monkeypatch):  # noqa: F811
    model = _model(name, tokenizer)
    with torch.no_grad():
        batch = model.tokenize_documents(texts)
        reps, ids = model.encode_documents(batch), model.stored_token_ids(batch)
    options = {**RQ, "rq_words": model.stored_vocabulary}
    sidecar = open_sidecar(_write(tmp_path / "words", model, reps, [f"d{i}" for i in range(len(texts))], "rq",
                                  options, token_ids=ids), expect_model_fingerprint=model.store_fingerprint())
    assert sidecar.store_codebooks.words.shape == (len(tokenizer), model.store_width)
    rows = np.arange(len(texts))
    codes, lengths = sidecar.get_batch(rows, codes=True)
    assert codes.shape[-1] == 2 + 4 + 1  # the word id, 4 codebooks, the norm
    assert code_tables.WORD_ID_BYTES == rq.WORD_ID_BYTES == 2  # the tables read the layout the codec writes
    for row in rows:  # every stored term carries its own word's id
        np.testing.assert_array_equal(word_ids(codes[row, :lengths[row]].numpy()), ids[row].numpy())
        if name == "maxsim":  # MaxSim stores every WordPiece of the text, [CLS] and [SEP] included
            pieces = tokenizer.tokenize(texts[row])[:int(lengths[row]) - 2]
            assert tokenizer.convert_ids_to_tokens(ids[row].tolist()) == ["[CLS]", *pieces, "[SEP]"]
    reads = _recorded_reads(sidecar, monkeypatch)
    reranker = ModelReranker(model, sidecar, batch_size=7, device="cpu", precision="fp32")
    assert reranker.scores_codes
    got = _scores(reranker, texts)
    assert reads and all(reads)  # nothing decoded
    # the decoded vectors (word mean + codebook entries); TK's cosines over the norms the codes store
    want = (_scores_with_stored_norms if name == "tk" else _decoded_scores)(model, sidecar, rows)
    assert want.max() - want.min() > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    state = model.encode_query(model.tokenize_queries([QUERY]))
    books = sidecar.store_codebooks
    tables = model.code_tables(state, torch.from_numpy(books.entries), torch.from_numpy(books.words))
    damaged = codes[:2, :, :6].clone()
    damaged[1, 0, :2] = 255  # word 65535
    with pytest.raises(ValueError, match=f"a code holds word id 65535, beyond the table's {len(tokenizer)} words"):
        model.score_codes(tables, damaged, lengths[:2], torch.ones(damaged.shape[:2]))


def test_a_words_row_is_made_when_first_asked_for_then_kept():
    generator = torch.Generator().manual_seed(0)
    codebooks, means = torch.randn(2, 4, 8, generator=generator), torch.randn(50, 8, generator=generator)
    vectors = torch.randn(3, 8, generator=generator)
    tables = code_tables.query_code_tables(vectors, torch.ones(3), codebooks, means)
    assert tables.table.shape == (2 * 4 + 50, 3) and tables.words.offset == 8
    # codes: word id 4, 9, 4 / 0, 49 (two bytes, little-endian), then an entry of each codebook
    codes = torch.tensor([[[4, 0, 1, 2], [9, 0, 3, 0], [4, 0, 0, 0]], [[0, 0, 2, 2], [49, 0, 1, 3], [9, 0, 0, 1]]])
    decoded = means[codes[..., 0].long()] + codebooks[0][codes[..., 2].long()] + codebooks[1][codes[..., 3].long()]
    np.testing.assert_allclose(code_tables.code_inner_products(tables, codes).numpy(),
                               (decoded @ vectors.T).transpose(1, 2).numpy(), rtol=1e-5, atol=1e-5)
    assert tables.words.made.nonzero().flatten().tolist() == [0, 4, 9, 49]  # only the words asked for
    means[9] = float("nan")  # a row is made once: asking again reads it, never the mean
    again = torch.tensor([[[9, 0, 0, 0], [7, 0, 0, 0]]])
    assert code_tables.code_inner_products(tables, again).isfinite().all() and tables.words.made.sum() == 5
    with pytest.raises(ValueError, match="a code holds word id 306, beyond the table's 50 words"):
        code_tables.code_inner_products(tables, torch.tensor([[[3, 0, 0, 0], [50, 1, 0, 0]]]))


@pytest.mark.parametrize("kind", ["maxsim-opq", "tk-opq", "tk-rq without norms"])
def test_other_models_and_codecs_read_decoded_vectors(kind, tmp_path, tokenizer, texts):  # noqa: F811
    name, codec = kind.split()[0].split("-")
    model = _model(name, tokenizer)
    options = {"rq_codebooks": 4} if "without" in kind else RQ if codec == "rq" else None
    sidecar = _sidecar(tmp_path, model, texts, codec=codec, options=options)
    assert (sidecar.store_codebooks is None) == (codec != "rq")
    reranker = ModelReranker(model, sidecar, batch_size=7, device="cpu", precision="fp32")
    assert not reranker.scores_codes
    np.testing.assert_allclose(_scores(reranker, texts), _decoded_scores(model, sidecar, np.arange(len(texts))),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("options", [{"rq_codebooks": 4}, RQ], ids=["codes", "codes with norms"])
def test_maxsim_scores_codes_as_the_decoded_vectors(options, tmp_path, tokenizer, texts, monkeypatch):  # noqa: F811
    model = _model("maxsim", tokenizer)
    sidecar = _sidecar(tmp_path, model, texts, codec="rq", options=options)
    rows = np.arange(len(texts))
    want = _decoded_scores(model, sidecar, rows)
    assert want.max() - want.min() > 0.1
    with torch.no_grad():
        state = model.encode_query(model.tokenize_queries([QUERY]))
        tables = model.code_tables(state, torch.from_numpy(sidecar.store_codebooks.entries))
        codes, lengths = sidecar.get_batch(rows, codes=True)
        assert len(set(lengths.tolist())) > 3  # padding in the batch, which must not be anyone's maximum
        got = model.score_codes(tables, codes[..., :4], lengths).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        # each candidate's own codes: scoring the batch's codes in another order gives the scores in that order
        order = torch.from_numpy(np.random.default_rng(0).permutation(len(rows)))
        np.testing.assert_allclose(model.score_codes(tables, codes[order, :, :4], lengths[order]).numpy(),
                                   got[order], rtol=1e-6)
        assert np.abs(got[order] - got).max() > 1e-2
    reads = _recorded_reads(sidecar, monkeypatch)
    reranker = ModelReranker(model, sidecar, batch_size=7, device="cpu", precision="fp32")
    assert reranker.scores_codes
    np.testing.assert_allclose(_scores(reranker, texts), want, rtol=1e-4, atol=1e-4)
    assert reads and all(reads)  # every batch read as codes: nothing decoded


def test_tk_refuses_to_score_codes_without_their_norms(tk_rq):
    model, sidecar = tk_rq
    state = model.encode_query(model.tokenize_queries([QUERY]))
    tables = model.code_tables(state, torch.from_numpy(sidecar.store_codebooks.entries))
    codes, lengths = sidecar.get_batch([0, 1], codes=True)
    with pytest.raises(ValueError, match=r"TK scores codes with the norms of the terms they decode to \(an rq store "
                                         r"with norms\)"):
        model.score_codes(tables, codes[..., :4], lengths)


def test_codes_are_refused_where_there_are_no_codebooks(tmp_path, tokenizer, texts):  # noqa: F811
    model = _model("tk", tokenizer)
    for codec in ("opq", None):
        sidecar = _sidecar(tmp_path, model, texts, codec=codec)
        with pytest.raises(ValueError, match=r"sidecar .* stores no codes scored by look-up tables \(only an rq "
                                             r"codec's are\)"):
            sidecar.get_batch([0, 1], codes=True)
    sidecar = _sidecar(tmp_path, model, texts, codec="rq", options=RQ)
    with pytest.raises(ValueError, match="codes are read as stored: without heads or a rotated frame"):
        sidecar.get_batch([0, 1], codes=True, heads=2)


def test_a_sharded_sidecar_scores_the_codes_of_the_codec_its_shards_share(tmp_path, tokenizer, texts):  # noqa: F811
    model = _model("tk", tokenizer)
    whole = _sidecar(tmp_path, model, texts, codec="rq", options=RQ)
    sharded = open_sidecar(_sharded(tmp_path, model, texts, whole.codec.parameters(), codec="rq", options=RQ),
                           expect_model_fingerprint=model.store_fingerprint())
    np.testing.assert_array_equal(sharded.store_codebooks.entries, whole.store_codebooks.entries)
    np.testing.assert_array_equal(sharded.store_codebooks.norm_levels, whole.store_codebooks.norm_levels)
    rows = [0, 25, 3, 39, 20, 19]  # across the shard boundary
    codes, lengths = sharded.get_batch(rows, codes=True)
    want, want_lengths = whole.get_batch(rows, codes=True)
    assert torch.equal(codes, want) and torch.equal(lengths, want_lengths)
    reranker = ModelReranker(model, sharded, batch_size=7, device="cpu", precision="fp32")
    assert reranker.scores_codes
    np.testing.assert_allclose(_scores(reranker, texts),
                               _scores_with_stored_norms(model, whole, np.arange(len(texts))), rtol=1e-4, atol=1e-4)
    # shards whose codebooks differ (assembled by an older version) never have their codes scored by one table
    other = whole.codec.parameters().copy()
    books = sharded.store_codebooks.entries.size
    other[:books] = np.random.default_rng(1).standard_normal(books)
    sharded.shards[1].codec.load_parameters(other)
    del sharded._store_codebooks
    assert sharded.store_codebooks is None
    assert not ModelReranker(model, sharded, batch_size=7, device="cpu", precision="fp32").scores_codes
