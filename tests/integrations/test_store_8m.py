"""integrations/scale/store_8m.py at a tiny size: the sharded synthetic store it writes through SidecarWriter opens
assembled, every row decodes to the codes it generated, an interrupted build resumes, and bad input or a disk too
small is refused before any work."""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
if str(REPOSITORY) not in sys.path:
    sys.path.append(str(REPOSITORY))

from integrations.scale import store_8m  # noqa: E402
from pyserini_mores.search.sample import sample_dir  # noqa: E402
from pyserini_mores.sidecar import SidecarWriter, open_sidecar, verify_sidecar  # noqa: E402
from pyserini_mores.sidecar.format import read_manifest  # noqa: E402
from pyserini_mores.sidecar.shards import read_sharded_manifest, shard_rows  # noqa: E402

NUM_DOCS, SHARDS = 2000, 2
SOURCE = sample_dir() / "collection.tsv.gz"
TINY = ["--num-docs", str(NUM_DOCS), "--shards", str(SHARDS), "--depth", "100", "--queries", "3",
        "--codec-sample-tokens", "512", "--length-source", str(SOURCE)]


@pytest.fixture(scope="module")
def source_lengths():
    return store_8m.source_lengths(SOURCE)


def expected_lengths(source_lengths, seed=0):
    return store_8m.document_lengths(source_lengths, NUM_DOCS, 70.0, store_8m.TOKEN_CAP, seed)[0]


def expected_codes(lengths, row, codec="pq", seed=0):
    """The codes the store generated for ``row``, regenerated from the seed."""
    [(_, piece_lengths, codes)] = store_8m.row_codes(lengths, seed, codec, store_8m.StoreConfig.num_centroids, row,
                                                     row + 1)
    assert piece_lengths.tolist() == [lengths[row]]
    return codes


def check_rows_decode_to_what_was_written(output: Path, lengths: np.ndarray, codec: str = "pq") -> None:
    sharded = read_sharded_manifest(output)
    with open_sidecar(output) as store:
        shards = store.shards  # each shard's own reader: its codes and its codec
        assert store.num_docs == NUM_DOCS and len(shards) == SHARDS
        assert np.array_equal(store.lengths(np.arange(NUM_DOCS)), lengths)
        rows = np.array([0, 999, 1000, 1023, 1024, 1999, 1500])  # shard edges and a generator block edge
        docs, got_lengths = store.get_batch(rows)
        for position, row in enumerate(rows.tolist()):
            shard = next(reader for reader, entry in zip(shards, sharded.shards)
                         if entry.row_start <= row < entry.row_end)
            local = row - shard.manifest.shard["row_start"]
            codes = expected_codes(lengths, row, codec)
            stored = np.asarray(shard.tokens[shard.offsets[local]:shard.offsets[local + 1]])
            assert np.array_equal(stored, codes)
            assert store.docid(row) == str(row)
            length = int(got_lengths[position])
            assert length == lengths[row]
            assert np.array_equal(docs[position, :length].numpy(), shard.codec.decode(codes))
            assert not docs[position, length:].any()


def test_a_tiny_sharded_store_is_measured_and_every_row_decodes_to_what_was_written(tmp_path, source_lengths,
                                                                                      capsys):
    output, results = tmp_path / "store", tmp_path / "store.json"
    assert store_8m.main([*TINY, "--output", str(output), "--json", str(results)]) == 0
    printed = capsys.readouterr().out
    assert "read 100 candidates, cold" in printed and "docs/s" in printed
    result = json.loads(results.read_text())
    lengths = expected_lengths(source_lengths)
    setup, build, files, reads = result["setup"], result["build"], result["files"], result["results"]
    assert (setup["num_docs"], setup["shards"], setup["num_tokens"], setup["bytes_per_token"]) == (
        NUM_DOCS, SHARDS, int(lengths.sum()), 48)
    assert setup["length_source_passages"] == 4000 and setup["mean_length_actual"] == pytest.approx(lengths.mean())
    assert abs(setup["mean_length_actual"] - 70) < 2 and lengths.max() <= 128 and lengths.min() >= 3
    assert build["shards_built"] == [0, 1] and build["docs_written"] == NUM_DOCS
    assert build["docs_per_s"] > 0 and build["mb_per_s"] > 0 and build["engine"] == "local"
    assert files["bytes_per_file"]["tokens.bin"] == int(lengths.sum()) * 48
    on_disk = sum(file.stat().st_size for file in output.rglob("*") if file.is_file())
    assert files["total_bytes"] == on_disk <= store_8m.expected_bytes(lengths, SHARDS)
    assert (reads["depth"], reads["queries"], reads["num_docs"]) == (100, 3, NUM_DOCS)
    for warmth in ("cold", "warm"):
        values = reads["query_read_ms"][warmth]
        assert 0 < values["p50"] <= values["p99"] <= values["max"]
    assert reads["open_ms"] > 0 and "rss_increase_after_open_bytes" in reads
    assert verify_sidecar(output) == []
    check_rows_decode_to_what_was_written(output, lengths)

    # A second run finds the finished store and only measures it; another store's settings are refused.
    assert store_8m.main([*TINY, "--output", str(output), "--json", str(results)]) == 0
    assert json.loads(results.read_text())["build"] is None
    assert store_8m.main([*TINY, "--output", str(output), "--seed", "1"]) == 2
    assert capsys.readouterr().err == (f"error: --output {output} holds another store (other --num-docs, --shards, "
                                       "--codec, --rows, --seed or lengths); pass --restart to replace it\n")


def test_rows_written_as_vectors_are_encoded_back_to_the_same_codes(tmp_path, source_lengths):
    output = tmp_path / "store"
    assert store_8m.main([*TINY, "--rows", "vectors", "--output", str(output), "--queries", "1"]) == 0
    check_rows_decode_to_what_was_written(output, expected_lengths(source_lengths))


def test_a_residual_store_holds_valid_centroid_ids_and_decodes_to_what_was_written(tmp_path, source_lengths):
    output, results = tmp_path / "store", tmp_path / "store.json"
    assert store_8m.main([*TINY, "--codec", "residual", "--codec-sample-tokens", "1024", "--output", str(output),
                          "--queries", "1", "--json", str(results)]) == 0
    setup = json.loads(results.read_text())["setup"]
    assert setup["codec_options"] == {"sample_tokens": 1024, "num_centroids": 1024}
    with open_sidecar(output) as store:
        assert all(shard.codec.code_size == 48 for shard in store.shards)
    check_rows_decode_to_what_was_written(output, expected_lengths(source_lengths), codec="residual")


def test_an_interrupted_build_resumes_from_the_rows_it_committed(tmp_path, source_lengths, monkeypatch, capsys):
    """Shard 1 holds rows [1000, 2000): its first piece (rows up to the generator block edge at 1024) is committed,
    then the build is interrupted; the next run skips shard 0 and resumes shard 1 at row 1024."""
    output = tmp_path / "store"
    real_add_codes, calls = SidecarWriter.add_codes, []

    def interrupted(writer, lengths, codes):
        calls.append(writer.rows_done)
        if writer.shard["index"] == 1 and writer.rows_done:
            raise KeyboardInterrupt
        return real_add_codes(writer, lengths, codes)

    monkeypatch.setattr(SidecarWriter, "add_codes", interrupted)
    arguments = [*TINY, "--output", str(output), "--commit-every-docs", "1", "--queries", "1"]
    assert store_8m.main(arguments) == 130
    assert "run the same command again to resume" in capsys.readouterr().err
    assert (output / "shard-00000-of-00002" / "manifest.json").is_file()
    assert (output / "shard-00001-of-00002.partial").is_dir() and not (output / "manifest.json").exists()
    monkeypatch.setattr(SidecarWriter, "add_codes", real_add_codes)
    results = tmp_path / "resumed.json"
    assert store_8m.main([*arguments, "--json", str(results)]) == 0
    build = json.loads(results.read_text())["build"]
    assert build["shards_built"] == [1] and build["docs_written"] == 2000 - 1024
    assert read_manifest(output / "shard-00001-of-00002").build["resumed_from_row"] == 1024
    assert shard_rows(NUM_DOCS, SHARDS, 1) == (1000, 2000)
    check_rows_decode_to_what_was_written(output, expected_lengths(source_lengths))


@pytest.mark.slow
def test_shards_written_as_ray_tasks_make_the_same_store(tmp_path, source_lengths):
    pytest.importorskip("ray")
    output, results = tmp_path / "store", tmp_path / "ray.json"
    assert store_8m.main([*TINY, "--engine", "ray", "--workers", "2", "--output", str(output), "--queries", "1",
                          "--json", str(results)]) == 0
    build = json.loads(results.read_text())["build"]
    assert (build["engine"], build["workers"], build["shards_built"]) == ("ray", 2, [0, 1])
    assert build["ray_start_seconds"] >= 0 and build["docs_written"] == NUM_DOCS
    check_rows_decode_to_what_was_written(output, expected_lengths(source_lengths))


def test_a_disk_too_small_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    output = tmp_path / "deep" / "store"
    real_usage = shutil.disk_usage
    monkeypatch.setattr(store_8m.shutil, "disk_usage",
                        lambda path: real_usage(path)._replace(free=1_000_000))  # 1 MB free
    assert store_8m.main([*TINY, "--output", str(output)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: {tmp_path} has 1,000,000 bytes free but the store needs ")
    assert "\n" not in error and not output.exists() and not (tmp_path / "deep").exists()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--shards", "0", "--shards must be between 1 and --num-docs, not 0"),
    ("--depth", "5000", "--depth must be between 1 and --num-docs, not 5000"),
    ("--mean-length", "200", "--mean-length must be above 2 and at most 128, not 200"),
    ("--codec-sample-tokens", "100", "--codec-sample-tokens must be at least 256 for --codec pq, not 100"),
])
def test_bad_flags_are_refused_with_one_error_line(tmp_path, capsys, flag, value, message):
    assert store_8m.main([*TINY, "--output", str(tmp_path / "store"), flag, value]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not (tmp_path / "store").exists()
