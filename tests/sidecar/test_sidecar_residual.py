"""The residual codec (centroid id + per-dimension quantised residual): its error bound on the data it was trained on,
centroid vectors, the batch decode against the plain reference decode, its parameters' layout and validation, and a
sidecar stored with it: written, read, transcoded, and refused when its codec file is damaged."""
from __future__ import annotations

import json

import numpy as np
import pytest
from sidecar_forge import assert_damaged_codec_refused, damage_codec_file

from pyserini_mores.sidecar import SidecarCorruptError, SidecarWriter, open_sidecar
from pyserini_mores.sidecar.__main__ import main as sidecar_main
from pyserini_mores.sidecar.codecs import TokenCodec, code_size, codec_options
from pyserini_mores.sidecar.residual import ResidualQuantizer, default_residual_dims

DIM = 16
MODEL = {"model_type": "mores", "store_variant": "s1", "fingerprint": "0123456789abcdef" * 4}
LENGTHS = [5, 0, 40, 7, 21, 0, 33, 12, 1, 60] * 6  # 60 documents, empty ones included, 1,074 tokens
DOCIDS = [f"d{row}" for row in range(len(LENGTHS))]
INDEX = {"num_docs": len(LENGTHS), "signature": "test:residual"}


def _vectors(count: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    """Clustered rows with a different scale and offset per dimension, as unnormalised token states have."""
    rng = np.random.default_rng(seed)
    scale, offset = rng.uniform(0.1, 3.0, dim), rng.uniform(-2.0, 2.0, dim)
    centers = rng.standard_normal((20, dim)) * 3
    rows = centers[rng.integers(0, len(centers), count)] + rng.standard_normal((count, dim))
    return (rows * scale + offset).astype(np.float32)


def _trained(vectors: np.ndarray, **options) -> ResidualQuantizer:
    codec = ResidualQuantizer(vectors.shape[1], **options)
    codec.train(vectors)
    return codec


# ---- the codec alone ---------------------------------------------------------------------------------------------
def test_code_sizes_are_the_id_bytes_plus_the_packed_residual_bits():
    # the default at MiniLM's width: 16x smaller than float16 (768 / 16 = 48 bytes): 2-byte id + 368 one-bit dims
    assert default_residual_dims(384, 1, 4096) == 368
    assert ResidualQuantizer(384).code_size == 48
    assert ResidualQuantizer(384, num_centroids=256).code_size == 48  # 1-byte id + 376 dims
    assert ResidualQuantizer(384, num_centroids=256).residual_dims == 376
    assert ResidualQuantizer(128, nbits=2, num_centroids=65536, residual_dims=128).code_size == 2 + 32
    assert code_size("residual", 384) == 48
    assert code_size("residual", 128, nbits=4, num_centroids=200, residual_dims=64) == 1 + 32


@pytest.mark.parametrize("nbits", [1, 2, 4, 8])
def test_decode_error_is_within_each_bucket_on_the_training_data(nbits):
    """Every kept dimension's residual lies in its bucket's interval (the outer ones closed by the training range),
    so the decode is off by at most the interval's farthest end from the bucket's weight; a dimension that is not
    kept decodes to its centroid's value exactly."""
    vectors = _vectors(3000)
    codec = _trained(vectors, nbits=nbits, num_centroids=32, residual_dims=DIM - 8 // nbits)
    decoded = np.empty_like(vectors)
    codec.decode(codec.encode(vectors), decoded)
    ids = codec._nearest(vectors)
    residuals = (vectors - codec.centroids[ids])[:, codec.kept]
    low = np.concatenate([residuals.min(axis=0)[:, None], codec.cutoffs], axis=1)  # [r, levels]
    high = np.concatenate([codec.cutoffs, residuals.max(axis=0)[:, None]], axis=1)
    bound = np.maximum(np.abs(codec.weights - low), np.abs(high - codec.weights)).max(axis=1)  # [r]
    error = np.abs(decoded - vectors)
    assert (error[:, codec.kept] <= bound + 1e-5).all()
    dropped = np.setdiff1d(np.arange(DIM), codec.kept)
    assert len(dropped) == 8 // nbits
    assert np.array_equal(decoded[:, dropped], codec.centroids[ids][:, dropped])
    # and the residual bits pay: more bits, less error, always below the centroids alone
    centroid_error = np.linalg.norm(vectors - codec.centroids[ids])
    assert np.linalg.norm(decoded - vectors) < centroid_error * {1: 0.75, 2: 0.5, 4: 0.2, 8: 0.1}[nbits]


def test_centroid_vectors_keep_their_id_and_decode_to_the_centroid_plus_the_zero_residual_bucket():
    vectors = _vectors(3000)
    codec = _trained(vectors, nbits=2, num_centroids=300, residual_dims=12)  # 2-byte ids
    codes = codec.encode(codec.centroids)
    assert np.array_equal(codes[:, 0].astype(np.int64) | codes[:, 1].astype(np.int64) << 8, np.arange(300))
    decoded = np.empty_like(codec.centroids)
    codec.decode(codes, decoded)
    zero_bucket = (codec.cutoffs < 0).sum(axis=1)  # the bucket a zero residual falls in, per kept dimension
    expected = codec.centroids.copy()
    expected[:, codec.kept] += codec.weights[np.arange(12), zero_bucket]
    assert np.array_equal(decoded, expected)
    # with 8 bits the zero bucket's weight is a residual within a 1/256 quantile step of 0
    fine = _trained(vectors, nbits=8, num_centroids=64, residual_dims=DIM)
    decoded = np.empty_like(fine.centroids)
    fine.decode(fine.encode(fine.centroids), decoded)
    assert np.abs(decoded - fine.centroids).max() < 0.05 * np.abs(fine.centroids).max()


@pytest.mark.parametrize("nbits,num_centroids", [(1, 64), (2, 300), (4, 64), (8, 256)])
def test_batch_decode_equals_the_reference_decode_row_by_row(nbits, num_centroids):
    vectors = _vectors(2000, seed=1)
    codec = _trained(vectors, nbits=nbits, num_centroids=num_centroids)
    codes = codec.encode(_vectors(500, seed=2))
    decoded = np.empty((500, DIM), dtype=np.float32)
    codec.decode(codes, decoded)
    reference = np.stack([codec.decode_reference(code) for code in codes])
    assert np.array_equal(decoded, reference)
    # any code decodes the same way, not only those encode makes
    rng = np.random.default_rng(3)
    random_codes = rng.integers(0, 256, codes.shape, dtype=np.uint8)
    ids = rng.integers(0, num_centroids, len(codes)).astype("<u2").view(np.uint8).reshape(-1, 2)
    random_codes[:, :codec.id_bytes] = ids[:, :codec.id_bytes]
    codec.decode(random_codes, decoded)
    assert np.array_equal(decoded, np.stack([codec.decode_reference(code) for code in random_codes]))


def test_parameters_round_trip_and_their_layout():
    vectors = _vectors(2000)
    codec = _trained(vectors, nbits=2, num_centroids=40, residual_dims=12)
    parameters = codec.parameters()
    assert parameters.dtype == np.float32 and parameters.shape == (40 * DIM + 12 + 12 * 3 + 12 * 4,)
    assert codec.parameter_count == parameters.size
    assert np.array_equal(parameters[40 * DIM:40 * DIM + 12], codec.kept)
    restored = ResidualQuantizer(DIM, nbits=2, num_centroids=40, residual_dims=12)
    restored.load_parameters(parameters)
    codes = codec.encode(vectors)
    assert np.array_equal(restored.encode(vectors), codes)
    first, second = np.empty_like(vectors), np.empty_like(vectors)
    assert np.array_equal(codec.decode(codes, first), restored.decode(codes, second))


def test_damaged_parameters_are_refused():
    codec = _trained(_vectors(2000), nbits=2, num_centroids=40, residual_dims=12)
    parameters, kept_at, cutoffs_at = codec.parameters(), 40 * DIM, 40 * DIM + 12
    fresh = ResidualQuantizer(DIM, nbits=2, num_centroids=40, residual_dims=12)
    with pytest.raises(SidecarCorruptError, match="has 736 parameters, not 735"):
        fresh.load_parameters(parameters[:-1])
    cases = {
        "not all finite": lambda p: p.__setitem__(5, np.nan),
        "kept dimensions are not 12 increasing integers below the dim 16": lambda p: p.__setitem__(kept_at, 16),
        "kept dimensions are not 12": lambda p: p.__setitem__(kept_at + 1, p[kept_at]),
        "kept dimensions are not": lambda p: p.__setitem__(kept_at, 0.5),
        "bucket cutoffs decrease within a dimension": lambda p: p.__setitem__(cutoffs_at, p[cutoffs_at + 2] + 1),
    }
    for message, damage in cases.items():
        damaged = parameters.copy()
        damage(damaged)
        with pytest.raises(SidecarCorruptError, match=message):
            fresh.load_parameters(damaged)
    # a code naming a centroid beyond the trained ones (a damaged tokens.bin) is refused, not read out of bounds
    codec = _trained(_vectors(2000), nbits=1, num_centroids=300, residual_dims=8)
    codes = codec.encode(_vectors(10))
    codes[3, :2] = [0xFF, 0xFF]
    with pytest.raises(SidecarCorruptError, match="names centroid 65535 of a residual codec with 300"):
        codec.decode(codes, np.empty((10, DIM), dtype=np.float32))


def test_settings_are_checked():
    with pytest.raises(ValueError, match="nbits must be one of 1, 2, 4, 8, not 3"):
        ResidualQuantizer(DIM, nbits=3)
    with pytest.raises(ValueError, match="num_centroids must be between 2 and 65536, not 70000"):
        ResidualQuantizer(DIM, num_centroids=70000)
    with pytest.raises(ValueError, match="residual_dims must be a positive multiple of 4 .* up to the dim 16, not 6"):
        ResidualQuantizer(DIM, nbits=2, residual_dims=6)
    with pytest.raises(ValueError, match="up to the dim 16, not 24"):
        ResidualQuantizer(DIM, residual_dims=24)
    with pytest.raises(ValueError, match="with 64 centroids needs at least that many token vectors to train, got 50"):
        ResidualQuantizer(DIM, num_centroids=64).train(_vectors(50))
    with pytest.raises(ValueError, match="nbits, residual_dims apply to the residual codec, not pq"):
        TokenCodec("pq", DIM, nbits=1, residual_dims=8)
    # the command line's check, before any work: each flag with its codec and in its range
    assert codec_options("residual", nbits=2, num_centroids=512) == {"nbits": 2, "num_centroids": 512}
    assert codec_options("residual") is None
    for codec, settings, message in [
        ("pq", {"nbits": 2}, "--nbits applies to --codec residual, not pq"),
        ("residual", {"pq_subquantizers": 4}, "--pq-subquantizers applies to --codec pq, not residual"),
        ("residual", {"nbits": 3}, "--nbits must be one of 1, 2, 4, 8, not 3"),
        ("residual", {"num_centroids": 1}, "--num-centroids must be between 2 and 65536, not 1"),
        ("residual", {"residual_dims": 0}, "--residual-dims must be positive, not 0"),
        ("residual", {"nbits": 2, "residual_dims": 6}, r"--residual-dims must be a multiple of 4 \(8 / --nbits\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            codec_options(codec, **settings)


# ---- in a sidecar ------------------------------------------------------------------------------------------------
def _documents(seed: int = 0) -> list[np.ndarray]:
    return np.split(_vectors(sum(LENGTHS), seed), np.cumsum(LENGTHS)[:-1])


def _write(path, docs, batch: int = 7, **options) -> None:
    writer = SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="residual",
                           codec_options=options, block_bytes=256)
    for start in range(writer.rows_done, len(docs), batch):
        writer.add(docs[start:start + batch])
    writer.finalize()


def test_a_residual_sidecar_round_trip(tmp_path):
    docs = _documents()
    options = {"nbits": 2, "num_centroids": 64, "residual_dims": 12}
    _write(tmp_path / "sc", docs, **options)
    manifest = json.loads((tmp_path / "sc" / "manifest.json").read_text())
    assert manifest["dtype"] == "residual"
    assert manifest["codec"]["code_size"] == 1 + 12 * 2 // 8
    assert manifest["codec"]["options"] == {"sample_tokens": 65536, **options}
    assert manifest["files"]["codec.bin"]["dtype"] == "<f4"
    assert manifest["files"]["codec.bin"]["shape"] == [64 * DIM + 12 + 12 * 3 + 12 * 4]
    # the codec trained on every token (fewer than the sample), so each row decodes to what it alone would give
    codec = ResidualQuantizer(DIM, **options)
    codec.train(np.concatenate(docs))
    with open_sidecar(tmp_path / "sc") as reader:
        assert reader.bytes_per_token == 4
        for row in (0, 2, 9, 59):
            expected = np.empty_like(docs[row])
            assert np.array_equal(reader.get(row), codec.decode(codec.encode(docs[row]), expected))
        docs, lengths = reader.get_batch([2, 0, 1, 9])  # the rerank path: one decode for the padded batch
        assert lengths.tolist() == [40, 5, 0, 60]
        for slot, row in enumerate([2, 0, 1, 9]):
            assert np.array_equal(docs[slot, :LENGTHS[row]].numpy(), reader.get(row))
            assert not docs[slot, LENGTHS[row]:].any()
    assert sidecar_main(["verify", str(tmp_path / "sc")]) == 0


def test_transcode_into_and_out_of_the_residual_codec(tmp_path, capsys):
    _write(tmp_path / "src", _documents(), num_centroids=64)
    assert sidecar_main(["transcode", str(tmp_path / "src"), "--output", str(tmp_path / "res"), "--codec",
                         "residual", "--nbits", "4", "--num-centroids", "32", "--residual-dims", "16"]) == 0
    out = capsys.readouterr().out
    assert "codec residual, nbits=4, num_centroids=32, residual_dims=16 (trained on 1,074 tokens)" in out
    assert f"{1 + 16 * 4 // 8} bytes/token" in out
    assert sidecar_main(["transcode", str(tmp_path / "res"), "--output", str(tmp_path / "fp16")]) == 0
    capsys.readouterr()
    with open_sidecar(tmp_path / "res") as coded, open_sidecar(tmp_path / "fp16") as plain:
        for row in range(len(LENGTHS)):
            assert np.array_equal(plain.get(row), coded.get(row).astype(np.float16))
    for flags, message in [(["--codec", "pq", "--nbits", "1"], "--nbits applies to --codec residual, not pq"),
                           (["--codec", "residual", "--nbits", "3"], "--nbits must be one of 1, 2, 4, 8, not 3"),
                           (["--codec", "residual", "--num-centroids", "4096"],
                            "holds 1074; lower num_centroids (--num-centroids)")]:
        assert sidecar_main(["transcode", str(tmp_path / "src"), "--output", str(tmp_path / "bad"), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("damage,message", [
    ("nan", "codec.bin is damaged: the residual codec's parameters are not all finite"),
    ("cutoffs", "codec.bin is damaged: the residual codec's bucket cutoffs decrease within a dimension"),
    ("kept", "codec.bin is damaged: the residual codec's kept dimensions are not 8 increasing integers"),
    ("bytes", r"codec.bin bytes \[0, \d+\) do not match their checksum"),
    ("truncated", "codec.bin: file is truncated"),
])
def test_a_damaged_codec_file_is_refused_at_open_with_one_line_and_exit_2(tmp_path, capsys, monkeypatch, damage,
                                                                          message):
    """Damage on disk is caught by the block checksums; parameters that were wrong when written (checksummed as they
    are, as a writer's bug would leave them) by the codec's own checks at open."""
    path, centroid_values = tmp_path / "sc", 64 * DIM

    def damaged(parameters: np.ndarray) -> np.ndarray:
        parameters = parameters.copy()
        if damage == "nan":
            parameters[centroid_values - 1] = np.nan
        elif damage == "kept":
            parameters[centroid_values] = DIM
        elif damage == "cutoffs":  # the first kept dimension's first cutoff above its third
            parameters[centroid_values + 8] = parameters[centroid_values + 10] + 1.0
        return parameters

    if damage in ("nan", "kept", "cutoffs"):
        trained_parameters = ResidualQuantizer.parameters
        monkeypatch.setattr(ResidualQuantizer, "parameters", lambda self: damaged(trained_parameters(self)))
    _write(path, _documents(), nbits=2, num_centroids=64, residual_dims=8)
    monkeypatch.undo()
    damage_codec_file(path, damage)
    assert_damaged_codec_refused(path, damage, message, tmp_path / "out", capsys)


def test_transcode_trains_on_documents_drawn_across_the_whole_source(tmp_path):
    """A source larger than the codec's sample trains it on random documents from all of it (a build only has its
    first ones); every stored code is then that codec's code of the source's vector."""
    from pyserini_mores.sidecar.transcode import _spread_sample, transcode_sidecar

    docs = _documents()
    writer = SidecarWriter(tmp_path / "src", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, dtype="float32")
    writer.add(docs)
    writer.finalize()
    with open_sidecar(tmp_path / "src") as source:
        sample = _spread_sample(source, 300)
        assert sample.shape == (300, DIM)
        starts = {row: int(source.offsets[row]) for row in range(len(LENGTHS))}
        tokens = np.asarray(source.tokens)
        sampled_rows = {row for row in range(len(LENGTHS)) if LENGTHS[row]
                        and any(np.array_equal(tokens[starts[row]], vector) for vector in sample)}
        assert max(sampled_rows) >= len(LENGTHS) // 2 and len(sampled_rows) >= 5  # spread, not the first rows
        assert np.array_equal(_spread_sample(source, 5000), tokens)  # a small store: every token, in row order
    options = {"sample_tokens": 300, "num_centroids": 16, "nbits": 2, "residual_dims": 16}
    transcode_sidecar(tmp_path / "src", tmp_path / "res", codec="residual", codec_options=options, progress=False)
    codec = TokenCodec("residual", DIM, **options)
    codec.train(sample)
    with open_sidecar(tmp_path / "res") as coded:
        assert coded.manifest.codec["trained_on_tokens"] == 300
        assert np.array_equal(np.asarray(coded.tokens), codec.encode(tokens))
    with pytest.raises(ValueError, match="train_codec must come before the first document is added"):
        writer = SidecarWriter(tmp_path / "late", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX,
                               codec="residual", codec_options={"num_centroids": 16})
        writer.add(docs[:3])
        writer.train_codec(sample)
