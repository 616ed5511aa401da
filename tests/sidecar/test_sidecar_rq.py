"""The rq codec (residual vector quantisation: M full-width codebooks summed): its settings and their command-line
check, its error against PQ and OPQ on clustered data, the batch decode against each row alone, its parameters'
round trip and validation, and a sidecar stored with it: written, read, transcoded, and refused when its codec file
or its manifest entry is damaged; and its word stage (a token id, then codebooks on what its word's mean leaves):
closer than rq of the same size on vectors round their words, decoded as its parts summed, its ids required and
range-checked, taken by the writer, refused by transcode."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from sidecar_forge import assert_codec_options_refused, assert_damaged_codec_refused, damage_codec_file

from pyserini_mores.sidecar import SidecarCorruptError, SidecarWriter, open_sidecar
from pyserini_mores.sidecar.__main__ import main as sidecar_main
from pyserini_mores.sidecar.codecs import TokenCodec, code_size, codec_from_manifest, codec_options
from pyserini_mores.sidecar.rq import ResidualVectorQuantizer, word_ids

DIM, M = 16, 4
MODEL = {"model_type": "tk", "store_variant": "ctx", "fingerprint": "0123456789abcdef" * 4}
LENGTHS = [5, 0, 40, 7, 21, 0, 33, 12, 1, 60] * 30  # 300 documents, empty ones included, 5,370 tokens
DOCIDS = [f"d{row}" for row in range(len(LENGTHS))]
INDEX = {"num_docs": len(LENGTHS), "signature": "test:rq"}
WORDS = 600  # the word-like points test vectors crowd around


def _words_and_vectors(count: int, seed: int, noise: float = 0.05, dim: int = DIM) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors each close to one of 600 word points (TK's terms are 95% their word's embedding), with the id of
    that word."""
    words = np.random.default_rng(99).standard_normal((WORDS, dim))
    rng = np.random.default_rng(seed)
    ids = rng.zipf(1.3, count) % WORDS
    rows = words[ids] + noise * rng.standard_normal((count, dim))
    return ids, (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _vectors(count: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    """Unit vectors crowded around 600 word-like points, as TK's term vectors are (mostly their word's embedding)."""
    return _words_and_vectors(count, seed, noise=0.15, dim=dim)[1]


def _trained(vectors: np.ndarray, m: int = M) -> ResidualVectorQuantizer:
    codec = ResidualVectorQuantizer(vectors.shape[1], m)
    codec.train(vectors)
    return codec


def _decode(codec, codes: np.ndarray) -> np.ndarray:
    return codec.decode(codes, np.empty((len(codes), codec.dim), dtype=np.float32))


def _relative_error(decoded: np.ndarray, vectors: np.ndarray) -> float:
    return float((np.linalg.norm(decoded - vectors, axis=1) / np.linalg.norm(vectors, axis=1)).mean())


# ---- the codec alone ---------------------------------------------------------------------------------------------
def test_code_size_settings_and_the_command_line_check():
    assert code_size("rq", 384) == 48 and code_size("rq", 384, rq_codebooks=24) == 24
    assert TokenCodec("rq", 384).options == {"sample_tokens": 65536, "rq_codebooks": 48}
    with pytest.raises(ValueError, match="rq needs between 1 and 256 codebooks, not 257"):
        TokenCodec("rq", DIM, rq_codebooks=257)
    with pytest.raises(ValueError, match="rq_codebooks applies to the rq codec, not opq"):
        TokenCodec("opq", DIM, rq_codebooks=4)
    with pytest.raises(ValueError, match="the rq codec needs at least 256 token vectors to train, got 100"):
        TokenCodec("rq", DIM).train(_vectors(100))
    assert codec_options("rq", rq_codebooks=8) == {"rq_codebooks": 8}
    with pytest.raises(ValueError, match="--rq-codebooks applies to --codec rq, not pq"):
        codec_options("pq", rq_codebooks=8)
    with pytest.raises(ValueError, match="--rq-codebooks must be positive, not 0"):
        codec_options("rq", rq_codebooks=0)
    with pytest.raises(ValueError, match="--rq-codebooks must be between 1 and 256, not 300"):
        codec_options("rq", rq_codebooks=300)
    with pytest.raises(ValueError, match="--pq-subquantizers applies to --codec pq, not rq"):
        codec_options("rq", pq_subquantizers=4)


def test_clustered_vectors_are_coded_better_than_by_pq_and_opq_of_the_same_size():
    train, held_out = _vectors(12000, seed=1), _vectors(2000, seed=2)
    rq = _trained(train)
    errors = {"rq": _relative_error(_decode(rq, rq.encode(held_out)), held_out)}
    for name in ("pq", "opq"):
        codec = TokenCodec(name, DIM, pq_subquantizers=M)
        codec.train(train)
        errors[name] = _relative_error(codec.decode(codec.encode(held_out)), held_out)
    assert errors["rq"] < 0.8 * min(errors["pq"], errors["opq"]), errors


@pytest.mark.parametrize("count", [1, 3, 64, 517])
def test_batch_decode_equals_each_row_decoded_alone(count):
    codec = _trained(_vectors(4000, seed=5))
    for codes in (codec.encode(_vectors(count, seed=6)),  # any code decodes the same way, not only encode's
                  np.random.default_rng(7).integers(0, 256, (count, M), dtype=np.uint8)):
        assert np.array_equal(_decode(codec, codes), np.concatenate([_decode(codec, code[None]) for code in codes]))
    assert np.allclose(_decode(codec, codes[:1])[0], sum(codec.parameters().reshape(M, 256, DIM)[m, codes[0, m]]
                                                        for m in range(M)), atol=1e-5)


def test_parameters_round_trip_and_damaged_ones_are_refused():
    vectors = _vectors(4000)
    codec = _trained(vectors)
    parameters = codec.parameters()
    assert parameters.dtype == np.float32 and parameters.shape == (M * 256 * DIM,) == (codec.parameter_count,)
    restored = ResidualVectorQuantizer(DIM, M)
    restored.load_parameters(parameters)
    codes = codec.encode(vectors)
    assert np.array_equal(restored.encode(vectors), codes)
    assert np.array_equal(_decode(codec, codes), _decode(restored, codes))
    # the codebooks as an array: copied out of faiss once per loading (a reader asks at every read), read-only
    books = restored.codebooks_array
    assert restored.codebooks_array is books and not books.flags.writeable
    assert np.array_equal(books.reshape(-1), parameters)
    restored.load_parameters(_trained(_vectors(4000, seed=3)).parameters())  # new parameters: a new array
    assert not np.array_equal(restored.codebooks_array, books)
    fresh = ResidualVectorQuantizer(DIM, M)
    with pytest.raises(SidecarCorruptError, match=re.escape("the rq codec (dim 16, 4 codebooks) has 16384 "
                                                            "parameters, not 16383")):
        fresh.load_parameters(parameters[:-1])
    damaged = parameters.copy()
    damaged[7] = np.nan
    with pytest.raises(SidecarCorruptError, match="the rq codec's parameters are not all finite"):
        fresh.load_parameters(damaged)
    assert not fresh.trained


# ---- in a sidecar ------------------------------------------------------------------------------------------------
def _documents(seed: int = 0) -> list[np.ndarray]:
    return np.split(_vectors(sum(LENGTHS), seed), np.cumsum(LENGTHS)[:-1])


def _write(path, docs, batch: int = 7) -> None:
    writer = SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="rq",
                           codec_options={"rq_codebooks": M}, block_bytes=256)
    for start in range(writer.rows_done, len(docs), batch):
        writer.add(docs[start:start + batch])
    writer.finalize()


def test_an_rq_sidecar_round_trip(tmp_path):
    docs = _documents()
    _write(tmp_path / "sc", docs)
    manifest = json.loads((tmp_path / "sc" / "manifest.json").read_text())
    assert manifest["dtype"] == "rq"
    assert manifest["codec"]["code_size"] == M and manifest["codec"]["parameter_count"] == M * 256 * DIM
    assert manifest["codec"]["options"] == {"sample_tokens": 65536, "rq_codebooks": M}
    codec = _trained(np.concatenate(docs))  # trained on every token (fewer than the sample), as the writer did
    with open_sidecar(tmp_path / "sc") as reader:
        assert reader.bytes_per_token == M
        for row in (0, 1, 2, 9, 299):
            assert np.array_equal(reader.get(row), _decode(codec, codec.encode(docs[row])))
        batch, lengths = reader.get_batch([2, 0, 1, 9, 6])
        assert lengths.tolist() == [40, 5, 0, 60, 33]
        for slot, row in enumerate([2, 0, 1, 9, 6]):
            assert np.array_equal(batch[slot, :LENGTHS[row]].numpy(), reader.get(row))
            assert not batch[slot, LENGTHS[row]:].any()
    assert sidecar_main(["verify", str(tmp_path / "sc")]) == 0


def test_transcode_into_the_rq_codec(tmp_path, capsys):
    writer = SidecarWriter(tmp_path / "src", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, dtype="float32")
    writer.add(_documents())
    writer.finalize()
    assert sidecar_main(["transcode", str(tmp_path / "src"), "--output", str(tmp_path / "rq"), "--codec", "rq",
                         "--rq-codebooks", "8"]) == 0
    out = capsys.readouterr().out
    assert "codec rq, rq_codebooks=8 (trained on 5,370 tokens)" in out and "8 bytes/token" in out
    assert sidecar_main(["transcode", str(tmp_path / "src"), "--output", str(tmp_path / "bad"), "--codec", "rq",
                         "--rq-codebooks", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--rq-codebooks must be positive, not 0" in err


def test_the_training_sample_size_flag(tmp_path, capsys):
    writer = SidecarWriter(tmp_path / "src", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, dtype="float32")
    writer.add(_documents())
    writer.finalize()
    assert sidecar_main(["transcode", str(tmp_path / "src"), "--output", str(tmp_path / "rq"), "--codec", "rq",
                         "--rq-codebooks", "4", "--sample-tokens", "3000"]) == 0
    assert "codec rq, rq_codebooks=4 (trained on 3,000 tokens)" in capsys.readouterr().out
    with open_sidecar(tmp_path / "rq") as reader:
        assert reader.manifest.codec["options"] == {"sample_tokens": 3000, "rq_codebooks": 4}
        assert reader.manifest.codec["trained_on_tokens"] == 3000
    for flags, message in [(["--codec", "rq", "--sample-tokens", "0"], "--sample-tokens must be positive, not 0"),
                           (["--codec", "fp16", "--dtype", "float16", "--sample-tokens", "3000"],
                            "--sample-tokens applies to a codec that is trained (every --codec but fp16)")]:
        assert sidecar_main(["transcode", str(tmp_path / "src"), "--output", str(tmp_path / "bad"), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("damage,message", [
    ("nan", "codec.bin is damaged: the rq codec's parameters are not all finite"),
    ("bytes", r"codec.bin bytes \[0, \d+\) do not match their checksum"),
    ("truncated", "codec.bin: file is truncated"),
])
def test_a_damaged_codec_file_is_refused_at_open_with_one_line_and_exit_2(tmp_path, capsys, monkeypatch, damage,
                                                                          message):
    path = tmp_path / "sc"
    if damage == "nan":  # wrong when written, checksummed as it is: the codec's own check refuses it
        trained_parameters = ResidualVectorQuantizer.parameters

        def damaged(self):
            parameters = trained_parameters(self).copy()
            parameters[-1] = np.nan
            return parameters

        monkeypatch.setattr(ResidualVectorQuantizer, "parameters", damaged)
    _write(path, _documents())
    monkeypatch.undo()
    damage_codec_file(path, damage)
    assert_damaged_codec_refused(path, damage, message, tmp_path / "out", capsys)


@pytest.mark.parametrize("options,message", [
    ({"rq_codebooks": 300}, "rq needs between 1 and 256 codebooks, not 300"),
    ({"rq_codebooks": 0}, "option 'rq_codebooks' is 0, not a positive integer"),
    ({"rq_codebooks": "4"}, "option 'rq_codebooks' is '4', not a positive integer"),
    ({"rq_codebooks": True}, "option 'rq_codebooks' is True, not a positive integer"),
    ({"rq_codebooks": 8}, "has 32768 parameters, the manifest records 16384"),
    ({"pq_subquantizers": 4}, "pq_subquantizers applies to the pq codec, not rq"),
    ({"rq_norms": 2}, "rq_norms is 1 (a norm byte) when given, not 2"),
    ({"rq_norms": 1}, "has 16386 parameters, the manifest records 16384"),
    ({"rq_words": 70000}, "rq's word stage takes a vocabulary of 1 to 65536 words, not 70000"),
    ({"rq_words": 600}, "has 25984 parameters, the manifest records 16384"),  # (600 words + 4 x 256) x 16
])
def test_manifest_codec_values_out_of_range_are_refused_at_open(tmp_path, capsys, options, message):
    path = tmp_path / "sc"
    _write(path, _documents())
    assert_codec_options_refused(path, options, message, tmp_path / "out", capsys)


# ---- the norm byte ---------------------------------------------------------------------------------------------------
def test_codes_with_norms_end_in_the_nearest_level_of_their_vectors_norm():
    vectors = _vectors(6000)
    plain, with_norms = ResidualVectorQuantizer(DIM, M), ResidualVectorQuantizer(DIM, M, norms=True)
    plain.train(vectors[:5000])
    with_norms.train(vectors[:5000])
    assert with_norms.code_size == M + 1 and with_norms.options == {"rq_codebooks": M, "rq_norms": 1}
    assert with_norms.parameter_count == plain.parameter_count + 2
    codes = with_norms.encode(vectors[5000:])
    np.testing.assert_array_equal(codes[:, :M], plain.encode(vectors[5000:]))  # the same codebooks, same entries
    decoded = _decode(with_norms, codes)  # the norm byte is not decoded
    np.testing.assert_array_equal(decoded, _decode(plain, codes[:, :M]))
    levels = with_norms.norm_levels
    assert levels.shape == (256,) and np.all(np.diff(levels) > 0)
    lowest, highest = with_norms.norm_range
    assert levels[0] == np.float32(lowest) and levels[-1] == np.float32(highest)
    norms = np.linalg.norm(decoded, axis=1)
    inside = (norms >= lowest) & (norms <= highest)
    assert inside.mean() > 0.95
    nearest = np.abs(norms[:, None] - levels[None, :]).argmin(1)
    assert np.abs(codes[inside, M].astype(int) - nearest[inside]).max() <= 1  # a tie may round either way
    assert np.abs(levels[codes[inside, M]] - norms[inside]).max() <= (highest - lowest) / 255 / 2 + 1e-6
    assert np.all(codes[norms < lowest, M] == 0) and np.all(codes[norms > highest, M] == 255)  # clamped
    fresh = ResidualVectorQuantizer(DIM, M, norms=True)
    fresh.load_parameters(with_norms.parameters())
    np.testing.assert_array_equal(fresh.norm_levels, levels)
    np.testing.assert_array_equal(fresh.encode(vectors[5000:]), codes)


def test_a_norm_range_out_of_order_is_refused():
    codec = ResidualVectorQuantizer(DIM, M, norms=True)
    codec.train(_vectors(3000))
    parameters = codec.parameters()
    for lowest, highest in ((1.0, 0.5), (-0.1, 1.0), (0.7, 0.7)):
        damaged = parameters.copy()
        damaged[-2:] = lowest, highest
        with pytest.raises(SidecarCorruptError, match=re.escape(f"the rq codec's norm range [{np.float32(lowest)}, "
                                                                f"{np.float32(highest)}] is not 0 <= lowest < "
                                                                "highest")):
            ResidualVectorQuantizer(DIM, M, norms=True).load_parameters(damaged)


def test_the_norm_option_and_its_flag(tmp_path, capsys):
    assert code_size("rq", 384, rq_codebooks=47, rq_norms=1) == 48
    assert codec_options("rq", rq_codebooks=47, rq_norms=True) == {"rq_codebooks": 47, "rq_norms": 1}
    with pytest.raises(ValueError, match="--rq-norms applies to --codec rq, not opq"):
        codec_options("opq", rq_norms=True)
    with pytest.raises(ValueError, match="rq_norms is 1 \\(a norm byte\\) when given, not 2"):
        TokenCodec("rq", DIM, rq_norms=2)
    writer = SidecarWriter(tmp_path / "src", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, dtype="float32")
    writer.add(_documents())
    writer.finalize()
    assert sidecar_main(["transcode", str(tmp_path / "src"), "--output", str(tmp_path / "rq"), "--codec", "rq",
                         "--rq-codebooks", "7", "--rq-norms"]) == 0
    assert "8 bytes/token" in capsys.readouterr().out
    with open_sidecar(tmp_path / "rq") as reader:
        assert reader.manifest.codec["options"] == {"sample_tokens": 65536, "rq_codebooks": 7, "rq_norms": 1}
        books = reader.store_codebooks
        assert books.entries.shape == (7, 256, DIM) and books.norm_levels.shape == (256,)
        codes, lengths = reader.get_batch([2, 9], codes=True)
        decoded, _ = reader.get_batch([2, 9])
        for slot in range(2):
            norms = np.linalg.norm(decoded[slot, :lengths[slot]].numpy(), axis=1)
            stored = books.norm_levels[codes[slot, :lengths[slot], 7].numpy()]
            assert np.abs(stored - norms).max() <= (books.norm_levels[1] - books.norm_levels[0]) / 2 + 1e-6
    assert sidecar_main(["transcode", str(tmp_path / "src"), "--output", str(tmp_path / "bad"), "--codec", "opq",
                         "--rq-norms"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--rq-norms applies to --codec rq, not opq" in err


# ---- the word stage ------------------------------------------------------------------------------------------------
def _word_stage(ids, vectors, m: int = M, norms: bool = False) -> ResidualVectorQuantizer:
    codec = ResidualVectorQuantizer(DIM, m, norms=norms, words=WORDS)
    codec.train(vectors, ids)
    return codec


def test_the_word_stage_codes_vectors_round_their_words_better_than_rq_of_the_same_size():
    train_ids, train = _words_and_vectors(12000, seed=1)
    ids, held_out = _words_and_vectors(2000, seed=2)
    word_stage = _word_stage(train_ids, train, m=M - 2)  # 2 id bytes + 2 codebooks: M bytes, as rq's M codebooks
    assert word_stage.code_size == M and TokenCodec("rq", DIM, rq_codebooks=M - 2, rq_words=WORDS).code_size == M
    codes = word_stage.encode(held_out, ids)
    assert np.array_equal(word_ids(codes), ids)  # the id's two bytes, little-endian, first
    plain = _trained(train)
    errors = {"word stage": _relative_error(_decode(word_stage, codes), held_out),
              "rq": _relative_error(_decode(plain, plain.encode(held_out)), held_out)}
    assert errors["word stage"] < 0.8 * errors["rq"], errors
    # a word the sample never held has no mean: its vectors are coded whole, by codebooks that met such vectors in
    # training (the sample's second half against its first half's means)
    unseen = np.isin(ids, train_ids, invert=True)
    assert unseen.sum() >= 5 and not word_stage.word_means[ids[unseen]].any()
    # 0.80 here; codebooks trained on the whole sample's residuals, which never meet a whole vector, give 0.95
    assert _relative_error(_decode(word_stage, codes[unseen]), held_out[unseen]) < 0.85


@pytest.mark.parametrize("count", [1, 3, 517])
def test_a_word_stage_batch_decodes_as_each_code_alone_and_as_its_parts_summed(count):
    ids, vectors = _words_and_vectors(4000, seed=5)
    codec = _word_stage(ids, vectors, norms=True)
    assert codec.code_size == 2 + M + 1
    codes = codec.encode(*_words_and_vectors(count, seed=6)[::-1])
    decoded = _decode(codec, codes)
    assert np.array_equal(decoded, np.concatenate([_decode(codec, code[None]) for code in codes]))
    books = codec.codebooks_array
    reference = codec.word_means[word_ids(codes)] + sum(books[m, codes[:, 2 + m]] for m in range(M))
    np.testing.assert_allclose(decoded, reference, rtol=1e-5, atol=1e-6)


def test_word_stage_parameters_round_trip_through_the_manifest_and_bad_ids_are_refused():
    ids, vectors = _words_and_vectors(4000, seed=8)
    codec = TokenCodec("rq", DIM, rq_codebooks=M, rq_norms=1, rq_words=WORDS)
    assert codec.needs_token_ids and not TokenCodec("rq", DIM).needs_token_ids
    with pytest.raises(ValueError, match="the rq codec's word stage codes each vector's token id: pass token_ids"):
        codec.train(vectors)
    codec.train(vectors, ids)
    entry = codec.manifest_entry()
    # a word the sample misses has no mean: the word stage's sample is 16 times the others'
    assert entry["options"] == {"sample_tokens": 1048576, "rq_codebooks": M, "rq_norms": 1, "rq_words": WORDS}
    assert entry["parameter_count"] == (WORDS + M * 256) * DIM + 2 and entry["code_size"] == 2 + M + 1
    restored = codec_from_manifest(entry, DIM, codec.parameters())
    codes = codec.encode(vectors, ids)
    assert np.array_equal(restored.encode(vectors, ids), codes)
    assert np.array_equal(restored.decode(codes), codec.decode(codes))
    with pytest.raises(ValueError, match=re.escape("token ids must lie in 0 … 599 (the codec's 600 words), not "
                                                   "0 … 600")):
        codec.encode(vectors[:2], np.array([0, WORDS]))
    with pytest.raises(ValueError, match="3 token ids for 2 vectors"):
        codec.encode(vectors[:2], np.array([0, 1, 2]))
    damaged = codes[:3].copy()
    damaged[1, :2] = 255  # word 65535 of a 600-word codec
    with pytest.raises(SidecarCorruptError, match="an rq code holds word id 65535, beyond the codec's 600 words"):
        codec.decode(damaged)
    with pytest.raises(SidecarCorruptError, match=re.escape(f"the rq codec (dim 16, {M} codebooks, norms, 600 "
                                                            "words) has")):
        ResidualVectorQuantizer(DIM, M, norms=True, words=WORDS).load_parameters(codec.parameters()[WORDS:])
    with pytest.raises(ValueError, match="rq's word stage takes a vocabulary of 1 to 65536 words, not 70000"):
        ResidualVectorQuantizer(DIM, M, words=70000)


def test_the_writer_takes_token_ids_exactly_when_its_codec_codes_them(tmp_path):
    ids, vectors = _words_and_vectors(sum(LENGTHS), seed=9)
    docs, doc_ids = (np.split(array, np.cumsum(LENGTHS)[:-1]) for array in (vectors, ids))
    writer = SidecarWriter(tmp_path / "sc", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="rq",
                           codec_options={"rq_codebooks": M, "rq_words": WORDS})
    with pytest.raises(ValueError, match=re.escape("the rq codec codes each token's id (a word stage): pass "
                                                   "token_ids")):
        writer.add(docs[:2])
    with pytest.raises(ValueError, match="rep 0 has 5 vectors but 4 token ids"):
        writer.add(docs[:2], token_ids=[doc_ids[0][:4], doc_ids[1]])
    assert writer.rows_done == 0  # refused before anything was kept
    for start in range(0, len(docs), 7):
        writer.add(docs[start:start + 7], token_ids=doc_ids[start:start + 7])
    writer.finalize()
    codec = _word_stage(ids, vectors)  # trained on every token (fewer than the sample), as the writer did
    with open_sidecar(tmp_path / "sc") as reader:
        assert reader.bytes_per_token == 2 + M
        np.testing.assert_array_equal(word_ids(np.asarray(reader.tokens)), ids)
        for row in (0, 2, 9, 299):
            np.testing.assert_array_equal(reader.get(row), _decode(codec, codec.encode(docs[row], doc_ids[row])))
    plain = SidecarWriter(tmp_path / "plain", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="rq",
                          codec_options={"rq_codebooks": M})
    with pytest.raises(ValueError, match="token_ids are for a codec that codes them"):
        plain.add(docs[:1], token_ids=doc_ids[:1])


def test_transcode_refuses_the_word_stage_naming_the_build(tmp_path, capsys):
    writer = SidecarWriter(tmp_path / "src", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, dtype="float32")
    writer.add(_documents())
    writer.finalize()
    assert sidecar_main(["transcode", str(tmp_path / "src"), "--output", str(tmp_path / "rq"), "--codec", "rq",
                         "--rq-word-stage"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --rq-word-stage codes each token's id, which a sidecar does not keep: build the store with "
                   "`sidecar build --codec rq --rq-word-stage` instead of transcoding\n")
    assert not (tmp_path / "rq").exists()


def test_a_build_codes_each_stored_terms_word_id_and_refuses_what_gives_none(tiny_index, tokenizer, tmp_path, capsys):
    import torch
    from pyserini.search.lucene import LuceneSearcher

    from pyserini_mores.index import iter_index_documents
    from pyserini_mores.models._layers import BertDims
    from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel
    from pyserini_mores.models.tk import TKConfig, TKModel
    from pyserini_mores.sidecar.build import BuildOptions, run_build

    torch.manual_seed(0)
    model = TKModel(TKConfig(embedding_dim=32, vocab_size=len(tokenizer), num_layers=1, num_heads=4, head_dim=8,
                             ffn_dim=16, doc_max_length=32), tokenizer).eval()
    options = BuildOptions(index=str(tiny_index), reranker="tk", output=str(tmp_path / "sc"), codec="rq",
                           codec_options={"rq_codebooks": 2}, rq_word_stage=True, batch_size=4, precision="fp32")
    path = run_build(options, model)
    searcher = LuceneSearcher(str(tiny_index))
    texts = [text for _, _, text in iter_index_documents(searcher, 0)]
    searcher.close()
    with open_sidecar(path) as reader:
        assert reader.manifest.codec["options"]["rq_words"] == len(tokenizer) == model.stored_vocabulary
        assert reader.bytes_per_token == 2 + 2 and reader.num_docs == len(texts) == 20
        tokens = np.asarray(reader.tokens)
        for row, text in enumerate(texts):  # each stored term's code starts with that term's id
            with torch.no_grad():
                want = model.stored_token_ids(model.tokenize_documents([text]))[0].numpy()
            codes = tokens[int(reader.offsets[row]):int(reader.offsets[row + 1])]
            np.testing.assert_array_equal(word_ids(codes), want)
    # sharded: the one codec every shard adopts is trained on documents drawn across the index, with their ids
    sharded = run_build(dataclasses.replace(options, output=str(tmp_path / "sharded"), shards=2), model)
    with open_sidecar(path) as whole, open_sidecar(sharded) as reader:
        assert reader.store_codebooks.words.shape == (len(tokenizer), 32)
        rows = np.arange(20)
        codes, lengths = reader.get_batch(rows, codes=True)
        want, want_lengths = whole.get_batch(rows, codes=True)
        assert torch.equal(lengths, want_lengths)
        for row in rows:
            np.testing.assert_array_equal(word_ids(codes[row, :lengths[row]].numpy()),
                                          word_ids(want[row, :lengths[row]].numpy()))
    with pytest.raises(ValueError, match="--rq-word-stage applies to --codec rq, not opq"):
        BuildOptions(index=str(tiny_index), reranker="tk", codec="opq", rq_word_stage=True)
    capsys.readouterr()
    prettr = PreTTRModel(PreTTRConfig(encoder=BertDims(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                       intermediate_size=64), join_layer=1), tokenizer)
    prettr.save_pretrained(tmp_path / "tiny-prettr")
    assert sidecar_main(["build", "--index", str(tiny_index), "--reranker", "prettr", "--model",
                         str(tmp_path / "tiny-prettr"), "--output", str(tmp_path / "prettr"), "--codec", "rq",
                         "--rq-word-stage"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --rq-word-stage codes the token id of each stored vector, which a prettr model does not "
                   "give (tk and maxsim do)\n")
    assert not (tmp_path / "prettr").exists()
