"""The opq codec (learned rotation + product quantisation): its encode picks the nearest code, its error against plain
PQ on correlated data, the batch decode against the plain reference decode, its parameters' layout and validation,
and a sidecar stored with it: written, read (one piece and sharded), transcoded, and refused when its codec file or
its manifest entry is damaged."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from sidecar_forge import assert_codec_options_refused, assert_damaged_codec_refused, damage_codec_file

from pyserini_mores.sidecar import SidecarCorruptError, SidecarMismatchError, SidecarWriter, open_sidecar
from pyserini_mores.sidecar.__main__ import main as sidecar_main
from pyserini_mores.sidecar.assemble import assemble_shards
from pyserini_mores.sidecar.codecs import TokenCodec, code_size, codec_options
from pyserini_mores.sidecar.opq import OptimizedProductQuantizer
from pyserini_mores.sidecar.shards import shard_rows

DIM, M = 16, 4
MODEL = {"model_type": "mores", "store_variant": "s1", "fingerprint": "0123456789abcdef" * 4}
LENGTHS = [5, 0, 40, 7, 21, 0, 33, 12, 1, 60] * 30  # 300 documents, empty ones included, 5,370 tokens
DOCIDS = [f"d{row}" for row in range(len(LENGTHS))]
INDEX = {"num_docs": len(LENGTHS), "signature": "test:opq"}


def _vectors(count: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    """Correlated rows: most of the variance in a few directions that cut across every contiguous slice, plus an
    offset, as hidden states have."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(np.random.default_rng(99).standard_normal((dim, dim)))[0]
    spread = np.geomspace(4.0, 0.05, dim)
    return ((rng.standard_normal((count, dim)) * spread) @ basis.T + 0.5).astype(np.float32)


def _trained(vectors: np.ndarray, m: int = M) -> OptimizedProductQuantizer:
    codec = OptimizedProductQuantizer(vectors.shape[1], m)
    codec.train(vectors)
    return codec


def _decode(codec: OptimizedProductQuantizer, codes: np.ndarray) -> np.ndarray:
    return codec.decode(codes, np.empty((len(codes), codec.dim), dtype=np.float32))


def _assert_rounding_close(got: np.ndarray, want: np.ndarray) -> None:
    """Equal to float32 rounding of the rotation product (a BLAS kernel rounds a row's last bits by its position
    in the batch), far tighter than any two codes' vectors differ."""
    scale = np.linalg.norm(want, axis=-1, keepdims=True)
    assert got.shape == want.shape and (np.abs(got - want) <= 1e-6 * scale + 1e-30).all()


def _relative_error(decoded: np.ndarray, vectors: np.ndarray) -> float:
    return float((np.linalg.norm(decoded - vectors, axis=1) / np.linalg.norm(vectors, axis=1)).mean())


# ---- the codec alone ---------------------------------------------------------------------------------------------
def test_code_size_settings_and_the_command_line_check():
    assert code_size("opq", 384, pq_subquantizers=48) == 48 and code_size("opq", 128) == 32
    assert TokenCodec("opq", 384, pq_subquantizers=48).options == {"sample_tokens": 65536, "pq_subquantizers": 48}
    with pytest.raises(ValueError, match="opq needs a number of sub-quantisers M that divides the dim 16, not 5"):
        TokenCodec("opq", DIM, pq_subquantizers=5)
    with pytest.raises(ValueError, match="the opq codec needs at least 256 token vectors to train, got 100"):
        TokenCodec("opq", DIM).train(_vectors(100))
    assert codec_options("opq", pq_subquantizers=8) == {"pq_subquantizers": 8}
    with pytest.raises(ValueError, match="--nbits applies to --codec residual, not opq"):
        codec_options("opq", nbits=1)
    with pytest.raises(ValueError, match="--pq-subquantizers applies to --codec pq, not sq8; --codec opq takes it too"):
        codec_options("sq8", pq_subquantizers=4)


def test_encode_picks_the_nearest_code_and_beats_plain_pq_on_correlated_data():
    train, held_out = _vectors(6000, seed=1), _vectors(1000, seed=2)
    codec = _trained(train)
    decoded = _decode(codec, codec.encode(held_out))
    # the rotation preserves distances and each slice takes its nearest centroid: no code decodes nearer
    rng = np.random.default_rng(3)
    best = np.linalg.norm(decoded - held_out, axis=1)
    for _ in range(20):
        other = _decode(codec, rng.integers(0, 256, (len(held_out), M), dtype=np.uint8))
        assert (best <= np.linalg.norm(other - held_out, axis=1) + 1e-4).all()
    pq = TokenCodec("pq", DIM, pq_subquantizers=M)
    pq.train(train)
    opq_error, pq_error = _relative_error(decoded, held_out), _relative_error(pq.decode(pq.encode(held_out)), held_out)
    assert opq_error < 0.8 * pq_error and opq_error < 0.25


def test_centroid_vectors_decode_to_themselves():
    codec = _trained(_vectors(4000))
    codes = np.random.default_rng(4).integers(0, 256, (50, M), dtype=np.uint8)
    vectors = _decode(codec, codes)
    assert np.allclose(_decode(codec, codec.encode(vectors)), vectors, atol=1e-5)


def _assert_batch_meets_the_reference(codec: OptimizedProductQuantizer, codes: np.ndarray) -> None:
    """The gather bit for bit, row by row; the rotation back to float32 rounding of its product (a row's last bits
    depend on its position in a BLAS tile), far below what another row's vector would differ by."""
    rotated = codec.decode_rotated(codes, np.empty((len(codes), codec.dim), dtype=np.float32))
    assert np.array_equal(rotated, np.stack([codec.decode_reference(code, rotated=True) for code in codes]))
    decoded = _decode(codec, codes)
    _assert_rounding_close(decoded, np.stack([codec.decode_reference(code) for code in codes]))
    np.testing.assert_array_equal(rotated @ codec.rotation, decoded)  # decode is that product, nothing else


@pytest.mark.parametrize("count", [1, 3, 63, 64, 65, 517])
def test_batch_decode_equals_the_reference_decode_row_by_row(count):
    codec = _trained(_vectors(4000, seed=5))
    for codes in (codec.encode(_vectors(count, seed=6)),  # any code decodes the same way, not only encode's
                  np.random.default_rng(7).integers(0, 256, (count, M), dtype=np.uint8)):
        _assert_batch_meets_the_reference(codec, codes)
    # at the MiniLM width
    rng = np.random.default_rng(8)
    wide = OptimizedProductQuantizer(384, 48)
    rotation = np.linalg.qr(rng.standard_normal((384, 384)))[0].astype(np.float32)
    wide.load_parameters(np.concatenate([rotation.ravel(), rng.standard_normal(384 * 256).astype(np.float32)]))
    _assert_batch_meets_the_reference(wide, rng.integers(0, 256, (count, 48), dtype=np.uint8))
    # a row swapped with its neighbour is caught: the bound is far tighter than two rows' difference
    if count > 1:
        codes = rng.integers(0, 256, (count, 48), dtype=np.uint8)
        decoded = _decode(wide, codes)
        reference = np.stack([wide.decode_reference(code) for code in codes[::-1]])
        assert (np.abs(decoded - reference) > 1e-3).any()


def test_parameters_round_trip_and_their_layout():
    vectors = _vectors(4000)
    codec = _trained(vectors)
    parameters = codec.parameters()
    assert parameters.dtype == np.float32 and parameters.shape == (DIM * DIM + DIM * 256,) == (codec.parameter_count,)
    rotation = parameters[:DIM * DIM].reshape(DIM, DIM)
    assert np.array_equal(rotation, codec.rotation)
    assert np.allclose(rotation @ rotation.T, np.eye(DIM), atol=1e-5)
    restored = OptimizedProductQuantizer(DIM, M)
    restored.load_parameters(parameters)
    codes = codec.encode(vectors)
    assert np.array_equal(restored.encode(vectors), codes)
    assert np.array_equal(_decode(codec, codes), _decode(restored, codes))


def test_damaged_parameters_are_refused():
    parameters = _trained(_vectors(4000)).parameters()
    fresh = OptimizedProductQuantizer(DIM, M)
    with pytest.raises(SidecarCorruptError, match="has 4352 parameters, not 4351"):
        fresh.load_parameters(parameters[:-1])
    cases = {
        "parameters are not all finite": lambda p: p.__setitem__(DIM * DIM + 5, np.inf),
        r"rotation is not orthogonal \(\|R Rᵀ - I\| reaches": lambda p: p.__setitem__(0, p[0] + 0.01),
    }
    for message, damage in cases.items():
        damaged = parameters.copy()
        damage(damaged)
        with pytest.raises(SidecarCorruptError, match=message):
            fresh.load_parameters(damaged)
    assert not fresh.trained


# ---- in a sidecar ------------------------------------------------------------------------------------------------
def _documents(seed: int = 0) -> list[np.ndarray]:
    return np.split(_vectors(sum(LENGTHS), seed), np.cumsum(LENGTHS)[:-1])


def _write(path, docs, batch: int = 7, **options) -> None:
    writer = SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="opq",
                           codec_options={"pq_subquantizers": M, **options}, block_bytes=256)
    for start in range(writer.rows_done, len(docs), batch):
        writer.add(docs[start:start + batch])
    writer.finalize()


def test_an_opq_sidecar_round_trip(tmp_path):
    docs = _documents()
    _write(tmp_path / "sc", docs)
    manifest = json.loads((tmp_path / "sc" / "manifest.json").read_text())
    assert manifest["dtype"] == "opq"
    assert manifest["codec"]["code_size"] == M and manifest["codec"]["parameter_count"] == DIM * DIM + DIM * 256
    assert manifest["codec"]["options"] == {"sample_tokens": 65536, "pq_subquantizers": M}
    assert manifest["files"]["codec.bin"]["shape"] == [DIM * DIM + DIM * 256]
    # the codec trained on every token (fewer than the sample), so each row is coded as it alone would be
    codec = _trained(np.concatenate(docs))
    with open_sidecar(tmp_path / "sc") as reader:
        assert reader.bytes_per_token == M
        for row in (0, 1, 2, 9, 299):
            assert np.array_equal(np.asarray(reader.tokens[reader.offsets[row]:reader.offsets[row + 1]]),
                                  codec.encode(docs[row]))
            _assert_rounding_close(reader.get(row), _decode(codec, codec.encode(docs[row])))
        rows = [2, 0, 1, 9, 6]
        batch, lengths = reader.get_batch(rows)  # the rerank path: one decode for the padded batch
        rotated, _ = reader.get_batch(rows, rotated=True)
        assert lengths.tolist() == [40, 5, 0, 60, 33]
        for slot, row in enumerate(rows):
            alone = reader.get_batch([row], rotated=True)[0][0]
            assert np.array_equal(rotated[slot, :LENGTHS[row]].numpy(), alone.numpy())  # the gather: exact
            _assert_rounding_close(batch[slot, :LENGTHS[row]].numpy(), reader.get(row))
            assert not batch[slot, LENGTHS[row]:].any() and not rotated[slot, LENGTHS[row]:].any()
        assert _relative_error(reader.get(9), docs[9]) < 0.25
    assert sidecar_main(["verify", str(tmp_path / "sc")]) == 0


def test_a_sharded_opq_sidecar_reads_like_one_piece(tmp_path):
    docs = _documents()
    _write(tmp_path / "whole", docs)
    with open_sidecar(tmp_path / "whole") as whole:
        parameters = whole.codec.parameters()
        paths = []
        for number in range(3):
            start, end = shard_rows(len(DOCIDS), 3, number)
            writer = SidecarWriter(tmp_path / f"shard-{number}", dim=DIM, docids=DOCIDS[start:end], model=MODEL,
                                   index=INDEX, codec="opq", codec_options={"pq_subquantizers": M},
                                   shard={"build_id": "opq", "index": number, "count": 3, "row_start": start,
                                          "row_end": end, "num_docs": len(DOCIDS)})
            writer.adopt_codec(parameters)
            writer.add(docs[start:end])
            paths.append(writer.finalize())
        assemble_shards(tmp_path / "sharded", paths)
        rows = [0, 99, 100, 2, 250, 199, 200, 9]  # across every shard boundary
        with open_sidecar(tmp_path / "sharded") as sharded:
            batch, lengths = sharded.get_batch(rows)
            expected, expected_lengths = whole.get_batch(rows)
            assert np.array_equal(lengths.numpy(), expected_lengths.numpy())
            assert np.array_equal(sharded.get_batch(rows, rotated=True)[0].numpy(),
                                  whole.get_batch(rows, rotated=True)[0].numpy())
            _assert_rounding_close(batch.numpy(), expected.numpy())


def test_shards_whose_codec_parameters_differ_are_not_assembled_even_under_one_build_id(tmp_path):
    """The build id of a sharded build includes its codec's checksum; assemble also compares the shards' codecs
    themselves, so shards claiming one build but coded with two codecs never read as one piece."""
    docs = _documents()
    one, other = _trained(np.concatenate(docs)), _trained(np.concatenate(docs[::2]))
    paths = []
    for number, codec in enumerate([one, other, one]):
        start, end = shard_rows(len(DOCIDS), 3, number)
        writer = SidecarWriter(tmp_path / f"shard-{number}", dim=DIM, docids=DOCIDS[start:end], model=MODEL,
                               index=INDEX, codec="opq", codec_options={"pq_subquantizers": M},
                               shard={"build_id": "one-build", "index": number, "count": 3, "row_start": start,
                                      "row_end": end, "num_docs": len(DOCIDS)})
        writer.adopt_codec(codec.parameters())
        writer.add(docs[start:end])
        paths.append(writer.finalize())
    with pytest.raises(SidecarMismatchError, match=re.escape(
            f"{paths[1]} is a shard of another build: its codec is opq (sample_tokens=65536, pq_subquantizers=4) "
            "with parameters sha256 ")):
        assemble_shards(tmp_path / "sharded", paths)
    assert not (tmp_path / "sharded" / "manifest.json").exists()


def test_transcode_into_and_out_of_the_opq_codec(tmp_path, capsys):
    writer = SidecarWriter(tmp_path / "src", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, dtype="float32")
    writer.add(_documents())
    writer.finalize()
    assert sidecar_main(["transcode", str(tmp_path / "src"), "--output", str(tmp_path / "opq"), "--codec", "opq",
                         "--pq-subquantizers", "8"]) == 0
    out = capsys.readouterr().out
    assert "codec opq, pq_subquantizers=8 (trained on 5,370 tokens)" in out and "8 bytes/token" in out
    assert sidecar_main(["transcode", str(tmp_path / "opq"), "--output", str(tmp_path / "fp16")]) == 0
    capsys.readouterr()
    with open_sidecar(tmp_path / "opq") as coded, open_sidecar(tmp_path / "fp16") as plain:
        for row in range(len(LENGTHS)):
            assert np.array_equal(plain.get(row), coded.get(row).astype(np.float16))
    assert sidecar_main(["transcode", str(tmp_path / "src"), "--output", str(tmp_path / "bad"), "--codec", "opq",
                         "--pq-subquantizers", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "opq needs a number of sub-quantisers M that divides the dim 16, not 5" in err


@pytest.mark.parametrize("damage,message", [
    ("nan", "codec.bin is damaged: the opq codec's parameters are not all finite"),
    ("rotation", r"codec.bin is damaged: the opq codec's rotation is not orthogonal"),
    ("bytes", r"codec.bin bytes \[0, \d+\) do not match their checksum"),
    ("truncated", "codec.bin: file is truncated"),
])
def test_a_damaged_codec_file_is_refused_at_open_with_one_line_and_exit_2(tmp_path, capsys, monkeypatch, damage,
                                                                          message):
    """Damage on disk is caught by the block checksums; parameters that were wrong when written (checksummed as they
    are, as a writer's bug would leave them) by the codec's own checks at open."""
    path = tmp_path / "sc"

    def damaged(parameters: np.ndarray) -> np.ndarray:
        parameters = parameters.copy()
        if damage == "nan":
            parameters[-1] = np.nan
        elif damage == "rotation":  # two rows of the rotation swapped in part: no longer orthogonal
            parameters[:DIM // 2] = parameters[DIM:DIM + DIM // 2]
        return parameters

    if damage in ("nan", "rotation"):
        trained_parameters = OptimizedProductQuantizer.parameters
        monkeypatch.setattr(OptimizedProductQuantizer, "parameters", lambda self: damaged(trained_parameters(self)))
    _write(path, _documents())
    monkeypatch.undo()
    damage_codec_file(path, damage)
    assert_damaged_codec_refused(path, damage, message, tmp_path / "out", capsys)


@pytest.mark.parametrize("options,message", [
    ({"pq_subquantizers": 5}, "opq needs a number of sub-quantisers M that divides the dim 16, not 5"),
    ({"pq_subquantizers": 0}, "option 'pq_subquantizers' is 0, not a positive integer"),
    ({"pq_subquantizers": "4"}, "option 'pq_subquantizers' is '4', not a positive integer"),
    ({"pq_subquantizers": 4.0}, "option 'pq_subquantizers' is 4.0, not a positive integer"),
    ({"pq_subquantizers": True}, "option 'pq_subquantizers' is True, not a positive integer"),
    ({"sample_tokens": -1}, "option 'sample_tokens' is -1, not a positive integer"),
    ({"nbits": 1}, "nbits apply to the residual codec, not opq"),
    ({"rotation": 1}, "has an unknown option 'rotation'"),
])
def test_manifest_codec_values_out_of_range_are_refused_at_open(tmp_path, capsys, options, message):
    path = tmp_path / "sc"
    _write(path, _documents())
    assert_codec_options_refused(path, options, message, tmp_path / "out", capsys)
