"""Compressed sidecar codecs (faiss SQ8/6/4 and PQ): error bounds, parameters round-trip, the store writes and reads
codes (decoded in one call per batch), checksums and expectations cover them, resumes keep the trained codec, and a
compressed MaxSim sidecar scores close to the float16 one."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sidecar_forge import reseal

from pyserini_mores.sidecar import (
    SidecarCorruptError,
    SidecarMismatchError,
    SidecarReader,
    SidecarWriter,
    open_sidecar,
    verify_sidecar,
)
from pyserini_mores.sidecar.__main__ import main as sidecar_main
from pyserini_mores.sidecar.codecs import TokenCodec, code_size, codec_from_manifest, default_pq_subquantizers

DIM = 16
MODEL = {"model_type": "mores", "store_variant": "s1", "fingerprint": "0123456789abcdef" * 4}
LENGTHS = [5, 0, 40, 7, 21, 0, 33, 12, 1, 60] * 6  # 60 documents, empty ones included, 1,038 tokens
DOCIDS = [f"d{row}" for row in range(len(LENGTHS))]
INDEX = {"num_docs": len(LENGTHS), "signature": "test:codecs"}
SCALAR_BITS = {"sq8": 8, "sq6": 6, "sq4": 4}


def _vectors(count: int, seed: int = 0) -> np.ndarray:
    """Rows with a different scale and offset per dimension, as real token states have."""
    rng = np.random.default_rng(seed)
    scale, offset = rng.uniform(0.1, 3.0, DIM), rng.uniform(-2.0, 2.0, DIM)
    return (rng.standard_normal((count, DIM)) * scale + offset).astype(np.float32)


def _documents(seed: int = 0) -> list[np.ndarray]:
    vectors = _vectors(sum(LENGTHS), seed)
    return np.split(vectors, np.cumsum(LENGTHS)[:-1])


def _write(path, docs, codec, batch: int = 7, dtype: str = "float16", **options) -> SidecarWriter:
    writer = SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec=codec, dtype=dtype,
                           codec_options=options or None, block_bytes=256)
    for start in range(writer.rows_done, len(docs), batch):
        writer.add(docs[start:start + batch])
    writer.finalize()
    return writer


# ---- the codecs alone --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sq8", "sq6", "sq4"])
def test_scalar_quantisers_stay_within_one_step_of_the_trained_range(name):
    vectors = _vectors(4000)
    codec = TokenCodec(name, DIM)
    codec.train(vectors)
    codes = codec.encode(vectors)
    assert codes.dtype == np.uint8 and codes.shape == (4000, -(-DIM * SCALAR_BITS[name] // 8))
    decoded = codec.decode(codes)
    assert decoded.dtype == np.float32 and decoded.shape == vectors.shape
    value_range = vectors.max(0) - vectors.min(0)
    step = value_range / (2 ** SCALAR_BITS[name] - 1)
    # faiss rounds to the middle of the step: the error is at most half a step, one step leaves float slack
    error = np.abs(decoded - vectors).max(0)
    assert (error <= step * 1.0001).all(), error / step
    assert (error >= step / 8).all(), "the error of a real quantiser is not ~0"
    if name == "sq8":
        assert (error / value_range).max() <= 1 / 255  # small relative to the range


def test_values_outside_the_trained_range_are_clamped_not_wrapped():
    codec = TokenCodec("sq8", DIM)
    codec.train(_vectors(500))
    far = _vectors(10, seed=1) * 100
    decoded = codec.decode(codec.encode(far))
    params = codec.parameters().reshape(2, DIM)  # faiss: per-dimension minimum, then range
    low, high, half_step = params[0], params[0] + params[1], params[1] / 255 / 2
    assert (far > high).any() and (far < low).any()
    assert (decoded >= low - half_step * 1.001).all() and (decoded <= high + half_step * 1.001).all()
    np.testing.assert_allclose(decoded[far > high], np.broadcast_to(high, far.shape)[far > high],
                               atol=float(half_step.max()) * 1.001)


def test_product_quantisation_error_is_finite_and_far_below_a_random_code():
    vectors = _vectors(6000)
    codec = TokenCodec("pq", DIM, pq_subquantizers=8)
    codec.train(vectors[:4000])
    assert codec.code_size == 8
    held_out = vectors[4000:]
    error = np.mean((codec.decode(codec.encode(held_out)) - held_out) ** 2)
    random_codes = np.random.default_rng(2).integers(0, 256, (len(held_out), 8), dtype=np.uint8)
    random_error = np.mean((codec.decode(random_codes) - held_out) ** 2)
    mean_error = np.mean((held_out - vectors[:4000].mean(0)) ** 2)  # the best 0-byte code
    assert np.isfinite(error)
    assert error < 0.25 * mean_error < random_error


def test_parameters_restore_the_same_codec():
    vectors = _vectors(3000)
    for name, options in (("sq6", {}), ("pq", {"pq_subquantizers": 4})):
        codec = TokenCodec(name, DIM, **options)
        codec.train(vectors)
        restored = codec_from_manifest(codec.manifest_entry(), DIM, codec.parameters().copy())
        codes = codec.encode(vectors)
        np.testing.assert_array_equal(restored.encode(vectors), codes)
        np.testing.assert_array_equal(restored.decode(codes), codec.decode(codes))
    with pytest.raises(SidecarCorruptError, match="has 32 parameters, not 31"):
        TokenCodec("sq8", DIM).load_parameters(np.zeros(31, dtype=np.float32))


def test_decode_writes_into_a_preallocated_buffer():
    codec = TokenCodec("sq8", DIM)
    codec.train(_vectors(100))
    codes = codec.encode(_vectors(50, seed=3))
    out = np.full((50, DIM), np.nan, dtype=np.float32)
    assert codec.decode(codes, out=out) is out and np.isfinite(out).all()
    with pytest.raises(ValueError, match="out must be a C-contiguous float32 array of shape"):
        codec.decode(codes, out=np.empty((50, DIM), dtype=np.float64))


def test_codec_settings_are_checked():
    assert code_size("fp16", 128) == 256 and code_size("sq8", 128) == 128 and code_size("sq6", 128) == 96
    assert code_size("sq4", 128) == 64 and code_size("pq", 128) == 32 == default_pq_subquantizers(128) * 1
    assert default_pq_subquantizers(30) == 6  # 30 / 4 is not whole: the largest divisor below it
    with pytest.raises(ValueError, match="pq needs a number of sub-quantisers M that divides the dim 16, not 5"):
        TokenCodec("pq", DIM, pq_subquantizers=5)
    with pytest.raises(ValueError, match="unknown codec 'sq3'"):
        TokenCodec("sq3", DIM)
    with pytest.raises(ValueError, match="the pq codec needs at least 256 token vectors to train, got 100"):
        TokenCodec("pq", DIM).train(_vectors(100))


# ---- the store ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sq8", "sq6", "sq4", "pq"])
def test_compressed_sidecar_round_trip(tmp_path, name):
    docs = _documents()
    # A sample smaller than the collection: training happens mid-stream, after some documents waited for it.
    _write(tmp_path / name, docs, name, sample_tokens=300)
    with SidecarReader(tmp_path / name, expect_dtype=name, expect_dim=DIM) as reader:
        codec = reader.codec
        assert reader.dtype == name and reader.bytes_per_token == codec.code_size
        assert reader.manifest.codec["trained_on_tokens"] == 300
        assert reader.tokens.dtype == np.uint8 and reader.tokens.shape == (sum(LENGTHS), codec.code_size)
        assert reader.bytes_per_doc == pytest.approx(sum(LENGTHS) * codec.code_size / len(LENGTHS))
        rows = [9, 1, 2, 9, 0, 5]
        batch, lengths = reader.get_batch(rows)
        assert batch.dtype == torch.float32 and lengths.tolist() == [LENGTHS[row] for row in rows]
        for i, row in enumerate(rows):
            expected = codec.decode(reader.tokens[reader.offsets[row]:reader.offsets[row + 1]])
            np.testing.assert_array_equal(batch[i, :LENGTHS[row]].numpy(), expected)
            assert not batch[i, LENGTHS[row]:].any(), "padding must be zeros, not the decoded zero code"
            np.testing.assert_array_equal(reader.get(row), expected)
        bf16, _ = reader.get_batch(rows, dtype=torch.bfloat16)
        assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, batch.to(torch.bfloat16))
        heads, _ = reader.get_batch(rows, heads=2)  # decoded token-major, then split
        assert torch.equal(heads, batch.unflatten(-1, (2, -1)).transpose(1, 2))
        # What the codes stand for: the written vectors. Within the training sample's range (here: its first 300
        # tokens) a scalar quantiser is off by at most half a step of that range; outside, it clamps.
        sample = np.concatenate(docs)[:300]
        low, high = sample.min(0), sample.max(0)
        decoded = np.concatenate([reader.get(row) for row in range(len(docs))])
        written = np.concatenate(docs)
        inside = ((written >= low) & (written <= high)).all(1)
        assert inside.sum() > 500
        if name in SCALAR_BITS:
            step = (high - low) / (2 ** SCALAR_BITS[name] - 1)
            assert (np.abs(decoded - written)[inside] <= step * 0.5001).all()
        else:
            variance = np.mean((written - written.mean(0)) ** 2)
            assert np.mean((decoded - written) ** 2) < 0.5 * variance
    assert verify_sidecar(tmp_path / name) == []


def test_a_collection_smaller_than_the_sample_trains_on_all_of_it(tmp_path):
    _write(tmp_path / "s", _documents(), "sq8")  # default sample: far more than 1,038 tokens
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["dtype"] == "sq8" and manifest["codec"]["trained_on_tokens"] == sum(LENGTHS)
    assert manifest["codec"]["code_size"] == DIM and manifest["codec"]["parameter_count"] == 2 * DIM
    assert manifest["files"]["codec.bin"]["bytes"] == 2 * DIM * 4


def test_uncompressed_manifests_have_no_codec_field(tmp_path):
    _write(tmp_path / "f", _documents(), "fp16")
    manifest = json.loads((tmp_path / "f" / "manifest.json").read_text())
    assert manifest["dtype"] == "float16" and "codec" not in manifest and "codec.bin" not in manifest["files"]
    assert not (tmp_path / "f" / "codec.bin").exists()
    assert open_sidecar(tmp_path / "f").bytes_per_token == 2 * DIM


def test_checksums_cover_the_codec_file(tmp_path):
    path = tmp_path / "s"
    _write(path, _documents(), "sq8")
    data = bytearray((path / "codec.bin").read_bytes())
    data[5] ^= 0x01  # same size, other parameters
    (path / "codec.bin").write_bytes(bytes(data))
    problems = verify_sidecar(path)
    assert len(problems) == 1 and problems[0].startswith("codec.bin: checksum mismatch")
    (path / "codec.bin").write_bytes(bytes(data[:-4]))
    with pytest.raises(SidecarCorruptError, match="codec.bin: file is truncated: expected 128 bytes, found 124"):
        open_sidecar(path)
    (path / "codec.bin").unlink()
    with pytest.raises(SidecarCorruptError, match=r"codec.bin: file is missing"):
        open_sidecar(path)


def test_expectations_and_manifest_checks_still_refuse_mismatches(tmp_path):
    path = tmp_path / "s"
    _write(path, _documents(), "sq4")
    with pytest.raises(SidecarMismatchError, match="stores dtype sq4 but float16 was expected"):
        open_sidecar(path, expect_dtype="float16")
    with pytest.raises(SidecarMismatchError, match="was built for another model"):
        open_sidecar(path, expect_model_fingerprint="fedcba9876543210" * 4)
    with pytest.raises(SidecarMismatchError, match="stores vectors of dim 16 but dim 32 was expected"):
        open_sidecar(path, expect_dim=32)
    manifest = json.loads((path / "manifest.json").read_text())
    for broken, message in (
            ({k: v for k, v in manifest.items() if k != "codec"}, "field 'codec' is missing or incomplete"),
            ({**manifest, "codec": {**manifest["codec"], "name": "sq8"}}, "field 'codec' is missing or incomplete"),
            ({**manifest, "dtype": "sq5"}, "field 'dtype' is 'sq5', expected one of"),
            ({**manifest, "files": {k: v for k, v in manifest["files"].items() if k != "codec.bin"}},
             "field 'files.codec.bin' is missing or incomplete")):
        (path / "manifest.json").write_text(json.dumps(broken))
        with pytest.raises(SidecarCorruptError, match=message):
            open_sidecar(path)
    # A code size that disagrees with the codec is caught when the codec is loaded.
    (path / "manifest.json").write_text(json.dumps({**manifest, "codec": {**manifest["codec"], "code_size": 4},
                                                    "files": {**manifest["files"], "tokens.bin": {
                                                        **manifest["files"]["tokens.bin"],
                                                        "bytes": sum(LENGTHS) * 4, "shape": [sum(LENGTHS), 4]}}}))
    with open(path / "tokens.bin", "r+b") as stream:
        stream.truncate(sum(LENGTHS) * 4)
    reseal(path)  # as a writer would have sealed it: the manifest checksum alone would refuse the edit
    with pytest.raises(SidecarCorruptError, match="makes 8-byte codes, the manifest records 4"):
        open_sidecar(path).get_batch([0])


def test_an_interrupted_compressed_build_resumes_with_its_trained_codec(tmp_path):
    docs = _documents()
    _write(tmp_path / "whole", docs, "sq6", sample_tokens=200)
    writer = SidecarWriter(tmp_path / "resumed", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="sq6",
                           codec_options={"sample_tokens": 200}, block_bytes=256)
    writer.add(docs[:10])  # 179 tokens: still waiting for the sample, nothing durable
    assert writer.rows_done == 10 and (tmp_path / "resumed.partial" / "tokens.bin").stat().st_size == 0
    writer.add(docs[10:30])  # trains, then writes all 30
    writer.close()
    with pytest.raises(SidecarMismatchError, match=r"differing: codec, dtype"):
        SidecarWriter(tmp_path / "resumed", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="sq8",
                      codec_options={"sample_tokens": 200}, block_bytes=256)
    writer = SidecarWriter(tmp_path / "resumed", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="sq6",
                           codec_options={"sample_tokens": 200}, block_bytes=256)
    assert writer.rows_done == 30
    writer.add(docs[30:])
    writer.finalize()
    for name in ("tokens.bin", "codec.bin", "offsets.bin"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "resumed" / name).read_bytes(), name


def test_codec_options_need_a_codec(tmp_path):
    with pytest.raises(ValueError, match=r"codec options \['pq_subquantizers'\] need a compressed codec, not fp16"):
        SidecarWriter(tmp_path / "x", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX,
                      codec_options={"pq_subquantizers": 4})
    with pytest.raises(ValueError, match="codec must be one of fp16, sq8, sq6, sq4, pq, opq, residual, rq, not 'zstd'"):
        SidecarWriter(tmp_path / "x", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="zstd")


# ---- transcoding a finished sidecar ------------------------------------------------------------------------------
def test_transcode_gives_the_codes_a_build_would_and_keeps_the_identity(tmp_path, capsys):
    """A float32 source transcoded to sq8 holds exactly what writing the same vectors with sq8 holds (the same codec,
    trained on the same first tokens); back to float16 it holds the source rounded to float16."""
    docs = _documents()
    _write(tmp_path / "source", docs, None, dtype="float32")
    _write(tmp_path / "direct-sq8", docs, "sq8")
    assert sidecar_main(["transcode", str(tmp_path / "source"), "--output", str(tmp_path / "sq8"),
                         "--codec", "sq8"]) == 0
    assert f"sidecar written to {tmp_path / 'sq8'}" in capsys.readouterr().out
    with open_sidecar(tmp_path / "sq8", expect_model_fingerprint=MODEL["fingerprint"], expect_dtype="sq8") as sq8, \
            open_sidecar(tmp_path / "direct-sq8") as direct, open_sidecar(tmp_path / "source") as source:
        assert np.array_equal(sq8.tokens, direct.tokens) and np.array_equal(sq8.offsets, source.offsets)
        assert sq8.docids(range(len(DOCIDS))) == DOCIDS and sq8.index == source.index
        assert sq8.manifest.build["transcoded_from"] == {"path": str(tmp_path / "source"), "dtype": "float32"}
    assert verify_sidecar(tmp_path / "sq8") == []
    assert sidecar_main(["transcode", str(tmp_path / "sq8"), "--output", str(tmp_path / "back"),
                         "--dtype", "float16"]) == 0
    with open_sidecar(tmp_path / "back", expect_dtype="float16") as back, open_sidecar(tmp_path / "sq8") as sq8:
        for row in range(len(DOCIDS)):
            np.testing.assert_array_equal(back.get(row), sq8.get(row).astype(np.float16).astype(np.float32))


def test_transcode_refuses_its_source_an_existing_output_and_stray_options(tmp_path, capsys):
    _write(tmp_path / "source", _documents(), None)
    _write(tmp_path / "taken", _documents(), "sq4")
    for output, extra, message in (
            ("source", [], "is the source sidecar: transcode into another directory"),
            ("taken", ["--codec", "sq8"], "already exists; pass overwrite=True to replace it"),
            ("new", ["--codec", "sq8", "--pq-subquantizers", "4"], "--pq-subquantizers applies to --codec pq, not sq8"),
            ("new", ["--codec", "pq", "--pq-subquantizers", "5"], "sub-quantisers M that divides the dim 16, not 5")):
        assert sidecar_main(["transcode", str(tmp_path / "source"), "--output", str(tmp_path / output),
                             *extra]) == 2
        assert message in capsys.readouterr().err
    assert open_sidecar(tmp_path / "taken").dtype == "sq4", "the existing sidecar is untouched"
    assert not (tmp_path / "new").exists()
    assert sidecar_main(["transcode", str(tmp_path / "missing"), "--output", str(tmp_path / "new")]) == 2
    assert "missing" in capsys.readouterr().err


# ---- a real model through the build command --------------------------------------------------------------------
def _build(tiny_index, tiny_maxsim_dir, output, *extra):
    return sidecar_main(["build", "--index", str(tiny_index), "--reranker", "maxsim", "--model",
                         str(tiny_maxsim_dir), "--output", str(output), "--batch-size", "4", *extra])


def test_compressed_maxsim_sidecars_score_close_to_float16(tiny_index, tiny_maxsim_dir, tmp_path, capsys):
    from pyserini_mores import get_reranker
    from pyserini_mores.types import Query, Text

    assert _build(tiny_index, tiny_maxsim_dir, tmp_path / "fp16") == 0
    reference_reader = open_sidecar(tmp_path / "fp16")
    rows = list(range(reference_reader.num_docs))
    texts = [Text(None, {"docid": docid, "lucene_docid": row}) for row, docid in
             zip(rows, reference_reader.docids(rows))]
    queries = ["text editor", "debian package manager", "linux kernel", "python programming language"]
    model = get_reranker("maxsim", model=tiny_maxsim_dir).model
    query_tokens = np.array([int(model.tokenize_queries([q])["attention_mask"].sum()) for q in queries])

    def scores(path):
        reranker = get_reranker("maxsim", model=tiny_maxsim_dir, sidecar=path)
        return np.array([[t.score for t in reranker.rescore(Query(q), [Text(None, dict(x.metadata)) for x in texts])]
                         for q in queries])

    reference = scores(tmp_path / "fp16")
    spread = reference.std(axis=1).mean()
    for name in ("sq8", "sq6", "sq4", "pq", "opq"):
        assert _build(tiny_index, tiny_maxsim_dir, tmp_path / name, "--codec", name) == 0, name
        assert verify_sidecar(tmp_path / name) == []
        reader = open_sidecar(tmp_path / name)
        worst_token = max(np.linalg.norm(reader.get(row) - reference_reader.get(row), axis=1).max() for row in rows)
        compressed = scores(tmp_path / name)
        # A MaxSim score sums, over query tokens, the best dot product of a unit query vector with the document's
        # vectors; moving every document vector by at most r moves each best dot product by at most r.
        bound = query_tokens[:, None] * worst_token + 1e-5
        assert (np.abs(compressed - reference) <= bound).all(), name
        if name == "sq8":  # measured: 5% of the spread of scores over documents; the same top 3
            assert np.abs(compressed - reference).max() <= 0.1 * spread
            assert all(set(np.argsort(-c)[:3]) == set(np.argsort(-r)[:3]) for c, r in zip(compressed, reference))
    capsys.readouterr()
    assert sidecar_main(["info", str(tmp_path / "sq4")]) == 0
    out = capsys.readouterr().out
    dim = reference_reader.dim
    assert f"dim {dim}, codec sq4 (trained on {reference_reader.num_tokens:,} tokens), {dim // 2} bytes/token" in out
    assert sidecar_main(["info", str(tmp_path / "fp16")]) == 0
    assert f"dim {dim}, float16, {2 * dim} bytes/token" in capsys.readouterr().out


def test_build_command_refuses_bad_codec_settings(tiny_index, tiny_maxsim_dir, tmp_path, capsys):
    assert _build(tiny_index, tiny_maxsim_dir, tmp_path / "pq", "--codec", "pq", "--pq-subquantizers", "5") == 2
    assert "pq needs a number of sub-quantisers M that divides the dim" in capsys.readouterr().err
    assert _build(tiny_index, tiny_maxsim_dir, tmp_path / "sq", "--codec", "sq8", "--pq-subquantizers", "4") == 2
    assert "pq_subquantizers applies to the pq codec, not sq8" in capsys.readouterr().err
    assert _build(tiny_index, tiny_maxsim_dir, tmp_path / "sh", "--codec", "sq8", "--shards", "2", "--shard", "1") == 2
    assert ("shard 1 of 2 adopts the sq8 codec trained once for its whole build, but "
            f"{tmp_path / 'trained-codec.json'} does not exist") in capsys.readouterr().err


def test_the_benchmark_reads_compressed_sidecars(tmp_path):
    from pyserini_mores.bench.runner import BenchConfig, run_benchmark

    config = BenchConfig(backbones=["tiny"], doc_lens=[16], models=["mores:1xIB-s2"], precisions=["fp32"],
                         candidates=20, repetitions=1, work_dir=str(tmp_path), peak_sizes=(64,), peak_repetitions=1,
                         codec="sq8")
    (record,) = run_benchmark(config)["results"]
    # MORES 1xIB S2 of the 32-wide tiny backbone stores 2 x 32 values per token: 64 one-byte codes
    assert record["store_dtype"] == "sq8" and record["bytes_per_doc"] == 16 * 64
    assert record["sidecar_read_ms_median"] > 0 and record["ms_per_query_median"] > 0


def test_codes_added_as_codes_store_what_adding_their_vectors_stores(tmp_path):
    """``adopt_codec`` takes a codec trained elsewhere (same codes as that codec makes) and ``add_codes`` writes codes
    as they are: the store equals the one written from the vectors, byte for byte, checksums included."""
    docs = _documents()
    codec = TokenCodec("pq", DIM, pq_subquantizers=4)
    codec.train(_vectors(2000, seed=1))
    by_vectors = SidecarWriter(tmp_path / "vectors", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="pq",
                               codec_options={"pq_subquantizers": 4})
    by_vectors.adopt_codec(codec.parameters(), trained_on=2000)
    by_vectors.add(docs)
    by_vectors.finalize()
    by_codes = SidecarWriter(tmp_path / "codes", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="pq",
                             codec_options={"pq_subquantizers": 4})
    by_codes.adopt_codec(codec.parameters(), trained_on=2000)
    assert by_codes.add_codes(LENGTHS[:10], codec.encode(np.concatenate(docs[:10]))) == 10
    assert by_codes.add_codes(LENGTHS[10:], codec.encode(np.concatenate(docs[10:]))) == len(LENGTHS)
    by_codes.finalize()
    for name in ("tokens.bin", "offsets.bin", "codec.bin", "checksums.bin"):
        assert (tmp_path / "codes" / name).read_bytes() == (tmp_path / "vectors" / name).read_bytes(), name
    with open_sidecar(tmp_path / "codes") as store:
        assert store.manifest.codec["trained_on_tokens"] == 2000
        assert np.array_equal(store.get(2), codec.decode(codec.encode(docs[2])))
    assert verify_sidecar(tmp_path / "codes") == []


def test_add_codes_refuses_codes_it_cannot_store(tmp_path):
    codec = TokenCodec("pq", DIM, pq_subquantizers=4)
    codec.train(_vectors(2000, seed=1))
    writer = SidecarWriter(tmp_path / "s", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, codec="pq",
                           codec_options={"pq_subquantizers": 4})
    codes = np.zeros((5, 4), dtype=np.uint8)
    with pytest.raises(ValueError, match="add_codes needs a compressed codec trained before any document"):
        writer.add_codes([5], codes)
    writer.adopt_codec(codec.parameters())
    with pytest.raises(ValueError, match=r"expected codes of shape \[6, 4\] and dtype uint8, got \[5, 4\] uint8"):
        writer.add_codes([6], codes)
    with pytest.raises(ValueError, match=r"expected codes of shape \[5, 4\] and dtype uint8, got \[5, 4\] int64"):
        writer.add_codes([5], codes.astype(np.int64))
    with pytest.raises(ValueError, match="document lengths must not be negative"):
        writer.add_codes([6, -1], codes)
    with pytest.raises(ValueError, match="but the sidecar has only 60 rows"):
        writer.add_codes([0] * 61, codes[:0])
    with pytest.raises(ValueError, match="adopt_codec needs an untrained codec"):
        writer.adopt_codec(codec.parameters())
    assert writer.rows_done == 0
    fp16 = SidecarWriter(tmp_path / "f", dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX)
    with pytest.raises(ValueError, match="add_codes needs a compressed codec"):
        fp16.add_codes([5], codes)
