"""Sharded sidecars: shard builds, assemble, a reader equal byte for byte to the unsharded one, refusals, verify, and
the Ray build engine on a local Ray instance (retries, resume, finished shards skipped)."""
from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from sidecar_forge import reseal, sharded_to_format_1

from pyserini_mores._jvm import JVM_FAULT_SIGNALS
from pyserini_mores.sidecar import (
    ShardedSidecarReader,
    SidecarMismatchError,
    SidecarNotFoundError,
    SidecarReader,
    assemble_shards,
    open_sidecar,
    verify_sidecar,
)
from pyserini_mores.sidecar import build as build_module
from pyserini_mores.sidecar.__main__ import main as sidecar_main
from pyserini_mores.sidecar.shards import coverage_problems, shard_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Encoded values depend in their last bits on the batch neighbours and on torch's thread count: every sidecar compared
# bitwise here is built with these options under one torch thread (the conftest's maxsim_sidecar may have been built
# under two, so it is compared within a tolerance).
SAME_AS_FIXTURE = ("--dtype", "float32", "--batch-size", "3")


def _build(tiny_index, tiny_maxsim_dir, *extra) -> int:
    return sidecar_main(["build", "--index", str(tiny_index), "--reranker", "maxsim", "--model", str(tiny_maxsim_dir),
                         *SAME_AS_FIXTURE, *extra])


def _files(path: Path, name: str = "tokens.bin") -> bytes:
    return (path / name).read_bytes()


@pytest.fixture(scope="module")
def unsharded(tiny_index, tiny_maxsim_dir, tmp_path_factory, one_torch_thread) -> Path:
    output = tmp_path_factory.mktemp("unsharded") / "sidecar"
    assert _build(tiny_index, tiny_maxsim_dir, "--output", str(output)) == 0
    return output


@pytest.fixture(scope="module")
def shards(tiny_index, tiny_maxsim_dir, tmp_path_factory, one_torch_thread) -> list[Path]:
    """Shards 0, 1, 2 of 3 (rows [0, 7), [7, 14), [14, 20)), built one command each; shard 1 on "another disk"."""
    output = tmp_path_factory.mktemp("sharded") / "sidecar"
    elsewhere = tmp_path_factory.mktemp("other_disk")
    paths = [output / "shard-0", elsewhere / "shard-1", output / "shard-2"]
    for number, path in enumerate(paths):
        assert _build(tiny_index, tiny_maxsim_dir, "--shards", "3", "--shard", str(number), "--output", str(path)) == 0
    return paths


@pytest.fixture(scope="module")
def sharded(shards) -> Path:
    output = shards[0].parent
    assert sidecar_main(["assemble", "--output", str(output), *map(str, reversed(shards))]) == 0
    return output


def _copy_sharded(shards: list[Path], tmp_path: Path) -> tuple[Path, list[Path]]:
    """A private assembled copy (every shard inside it) that a test may damage."""
    output = tmp_path / "copy"
    copies = [output / path.name for path in shards]
    for path, copy in zip(shards, copies):
        shutil.copytree(path, copy)
    assemble_shards(output, copies)
    return output, copies


# ---- reading -----------------------------------------------------------------------------------------------------
def test_sharded_reads_equal_the_unsharded_sidecar_byte_for_byte(sharded, shards, unsharded, maxsim_sidecar,
                                                                 tiny_index):
    from pyserini_mores.index import index_identity, open_searcher

    whole = open_sidecar(unsharded)
    np.testing.assert_allclose(whole.tokens, open_sidecar(maxsim_sidecar).tokens, rtol=0, atol=1e-6)
    searcher = open_searcher(tiny_index)
    identity = index_identity(searcher)
    searcher.close()
    reader = open_sidecar(sharded, expect_model_fingerprint=whole.model["fingerprint"], expect_index=identity,
                          expect_dtype="float32", expect_dim=whole.dim)
    assert isinstance(reader, ShardedSidecarReader) and len(reader.shards) == 3
    assert (reader.num_docs, reader.num_tokens, reader.dim, reader.dtype) == (20, whole.num_tokens, whole.dim,
                                                                              "float32")
    assert reader.bytes_per_doc == pytest.approx(whole.bytes_per_doc)
    # The shards' token files are the unsharded token file cut at row boundaries.
    assert b"".join(_files(path) for path in shards) == _files(unsharded)
    np.testing.assert_array_equal(reader.lengths(), whole.lengths())
    rows = [19, 0, 7, 6, 13, 14, 7, 3]  # every shard, both sides of each boundary, out of order, a repeat
    for dtype in ("float32", None, torch.bfloat16):
        for heads in (None, 4):
            docs, lengths = reader.get_batch(rows, dtype=dtype, heads=heads)
            expected_docs, expected_lengths = whole.get_batch(rows, dtype=dtype, heads=heads)
            assert docs.dtype == expected_docs.dtype and docs.shape == expected_docs.shape
            assert torch.equal(docs, expected_docs) and torch.equal(lengths, expected_lengths)
    for heads in (None, 4):  # inside shard 1 only: returned as that shard read it
        one_shard = reader.get_batch([9, 8, 12], heads=heads)
        assert all(torch.equal(a, b) for a, b in zip(one_shard, whole.get_batch([9, 8, 12], heads=heads)))
    empty = reader.get_batch([])
    assert empty[0].shape == (0, 0, whole.dim) and empty[1].shape == (0,)
    reader.evict_from_page_cache()
    reader.prefetch(rows)  # each shard's own rows; then the same vectors
    assert torch.equal(reader.get_batch(rows)[0], whole.get_batch(rows)[0])
    with pytest.raises(IndexError, match="row 20 is out of range"):
        reader.prefetch([20])
    assert np.array_equal(reader.get(14), whole.get(14))
    docids = whole.docids(range(20))
    assert reader.docids(rows) == [docids[row] for row in rows] and reader.docid(7) == docids[7]
    assert reader.rows_for_docids([docids[15], "no-such-doc", docids[0], docids[8]]).tolist() == [15, -1, 0, 8]
    assert reader.lengths(rows).tolist() == whole.lengths(rows).tolist()
    with pytest.raises(IndexError, match="row 20 is out of range"):
        reader.get_batch([3, 20])
    assert pickle.loads(pickle.dumps(reader.shards[1])).get(0).tolist() == whole.get(7).tolist()
    clone = pickle.loads(pickle.dumps(reader))  # worker processes reopen it by path
    assert isinstance(clone, ShardedSidecarReader) and torch.equal(clone.get_batch(rows)[0], whole.get_batch(rows)[0])
    with pytest.raises(SidecarMismatchError, match="dim 32 but dim 8 was expected"):
        open_sidecar(sharded, expect_dim=8)


def test_search_reranks_the_same_through_a_sharded_sidecar(tiny_index, tiny_maxsim_dir, sharded, unsharded):
    from pyserini_mores.search import RerankingSearcher

    through_shards = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, sidecar=sharded)
    whole = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, sidecar=unsharded)
    assert isinstance(through_shards.reranker.sidecar, ShardedSidecarReader)
    for query in ("server data file code system", "python linux web server editor database network"):
        a, b = through_shards.search(query, k=20), whole.search(query, k=20)
        assert len(a) >= 9  # candidates from all three shards
        assert [(hit.docid, hit.score) for hit in a] == [(hit.docid, hit.score) for hit in b]


def test_manifest_records_shard_paths_and_rows(sharded, shards):
    manifest = json.loads((sharded / "manifest.json").read_text())
    assert manifest["format"] == "pyserini-mores-sidecar-sharded" and manifest["num_docs"] == 20
    # Shards inside the sidecar directory are relative (the tree can move), the one on another disk absolute.
    assert [entry["path"] for entry in manifest["shards"]] == ["shard-0", str(shards[1].resolve()), "shard-2"]
    assert [(entry["row_start"], entry["row_end"]) for entry in manifest["shards"]] == [(0, 7), (7, 14), (14, 20)]
    shard_manifest = json.loads((shards[1] / "manifest.json").read_text())
    assert shard_manifest["shard"] == {"build_id": manifest["build_id"], "index": 1, "count": 3, "row_start": 7,
                                       "row_end": 14, "num_docs": 20}
    assert shard_manifest["num_docs"] == 7 and shard_manifest["index"]["num_docs"] == 20


def test_rows_split_like_the_issue_says():
    assert [shard_rows(20, 3, i) for i in range(3)] == [(0, 7), (7, 14), (14, 20)]
    assert [shard_rows(20, 8, i) for i in range(8)][-2:] == [(18, 20), (20, 20)]  # the last shard may be empty
    with pytest.raises(ValueError, match="shard 3 does not exist: shards are numbered 0 to 2"):
        shard_rows(20, 3, 3)


def test_info_and_verify_of_a_sharded_sidecar(sharded, capsys):
    assert sidecar_main(["info", str(sharded)]) == 0
    out = capsys.readouterr().out
    assert "sharded: 3 shards" in out and "shard 1     rows [7, 14)" in out
    assert verify_sidecar(sharded) == []
    assert sidecar_main(["verify", str(sharded)]) == 0


def test_a_sharded_sidecar_of_format_1_shards_reranks_the_same_and_says_so_once(tiny_index, tiny_maxsim_dir, shards,
                                                                                sharded, tmp_path, caplog, capsys):
    from pyserini_mores.search import RerankingSearcher

    legacy, copies = _copy_sharded(shards, tmp_path)
    sharded_to_format_1(legacy)
    assert [json.loads((copy / "manifest.json").read_text())["format_version"] for copy in copies] == [1, 1, 1]
    with caplog.at_level(logging.INFO):
        through_legacy = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, sidecar=legacy)
        current = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, sidecar=sharded)
        assert through_legacy.reranker.sidecar.format_version == 1 and current.reranker.sidecar.format_version == 3
        for query in ("server data file code system", "python linux web server editor database network"):
            a, b = through_legacy.search(query, k=20), current.search(query, k=20)
            assert len(a) >= 9
            assert [(hit.docid, hit.score) for hit in a] == [(hit.docid, hit.score) for hit in b]
        open_sidecar(legacy).get_batch([0, 19])
    messages = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    said = [message for message in messages if "format 1" in message]
    assert said == [f"sharded sidecar {legacy} has 3 of 3 shards in format 1: they have no block checksums, manifest "
                    f"checksum, document text hashes or windows, so damaged bytes and changed document texts are "
                    f"not detected at search time and windowed aggregations read one window per document; `python -m "
                    f"pyserini_mores.sidecar verify {legacy} --index INDEX` checks its files whole, `python -m "
                    f"pyserini_mores.sidecar build ... --output {legacy} --max-windows N --overwrite` rebuilds it in "
                    f"format 3"]

    assert sidecar_main(["info", str(legacy)]) == 0
    out = capsys.readouterr().out
    assert "integrity   3 of 3 shards are format 1: they have no block checksums" in out
    assert f"rows [7, 14), {out.split('rows [7, 14), ')[1].split(',')[0]}, format 1: " in out
    assert sidecar_main(["verify", str(legacy), "--index", str(tiny_index)]) == 0
    data = bytearray((copies[1] / "tokens.bin").read_bytes())
    data[5] ^= 0x01
    (copies[1] / "tokens.bin").write_bytes(bytes(data))
    assert sidecar_main(["verify", str(legacy)]) == 1
    assert "tokens.bin: checksum mismatch" in capsys.readouterr().out


def test_a_lone_shard_is_not_a_sidecar(shards, capsys):
    assert sidecar_main(["info", str(shards[1])]) == 0
    assert "shard       1 of 3, rows [7, 14) of 20" in capsys.readouterr().out
    with pytest.raises(SidecarMismatchError, match=r"is shard 1 of 3 \(rows \[7, 14\)\) of a sharded sidecar"):
        open_sidecar(shards[1])
    with pytest.raises(SidecarMismatchError, match="is shard 2 of 3"):
        SidecarReader(shards[2])


# ---- assemble refusals -------------------------------------------------------------------------------------------
def test_assemble_refuses_a_missing_shard(shards, tmp_path):
    with pytest.raises(SidecarNotFoundError, match=r"1 of 3 shards are missing: shard 1 \(rows \[7, 14\)\)"):
        assemble_shards(tmp_path / "gap", [shards[0], shards[2]])
    assert not (tmp_path / "gap" / "manifest.json").exists()


def test_assemble_refuses_a_shard_given_twice_and_overlapping_rows(shards, tmp_path, capsys):
    assert sidecar_main(["merge", "--output", str(tmp_path / "twice"), *map(str, shards), str(shards[1])]) == 2
    assert "shard 1 of 3 is given twice" in capsys.readouterr().err
    # A shard whose manifest claims to be shard 2 while holding shard 1's rows: overlap, and rows 14-19 uncovered.
    impostor = tmp_path / "impostor"
    shutil.copytree(shards[1], impostor)
    manifest = json.loads((impostor / "manifest.json").read_text())
    manifest["shard"]["index"] = 2
    (impostor / "manifest.json").write_text(json.dumps(manifest))
    reseal(impostor)
    with pytest.raises(SidecarMismatchError) as error:
        assemble_shards(tmp_path / "overlap", [shards[0], shards[1], impostor])
    assert "overlaps" in str(error.value) and "rows [14, 20) are in no shard" in str(error.value)


def test_coverage_problems_name_gaps_and_overlaps():
    assert coverage_problems([("a", 0, 7), ("b", 7, 20)], 20) == []
    assert coverage_problems([("a", 0, 7), ("c", 9, 20)], 20) == [
        "rows [7, 9) are in no shard: a ends at row 7 and c starts at row 9"]
    assert coverage_problems([("a", 0, 8), ("b", 7, 20)], 20) == ["b (rows [7, 20)) overlaps a (which ends at row 8)"]
    assert coverage_problems([("b", 3, 20)], 20) == ["rows [0, 3) are in no shard: b starts at row 3"]
    assert coverage_problems([("a", 0, 7)], 20) == ["rows [7, 20) are in no shard (the index has 20 documents)"]


def test_assemble_refuses_foreign_and_whole_sidecars(tiny_index, tiny_maxsim_dir, shards, maxsim_sidecar, tmp_path):
    # Same model, index and dtype, but another precision: another build.
    foreign = tmp_path / "bf16-shard-1"
    assert _build(tiny_index, tiny_maxsim_dir, "--shards", "3", "--shard", "1", "--precision", "bf16",
                  "--output", str(foreign)) == 0
    with pytest.raises(SidecarMismatchError, match=f"{foreign} is a shard of another build: its build id is"):
        assemble_shards(tmp_path / "mixed", [shards[0], foreign, shards[2]])
    with pytest.raises(SidecarMismatchError, match="is a whole sidecar, not a shard"):
        assemble_shards(tmp_path / "whole", [maxsim_sidecar, *shards])


def test_an_unfinished_shard_is_refused_then_resumed(tiny_index, tiny_maxsim_dir, shards, tmp_path, monkeypatch):
    # Windows of 3 documents: shard 1 (rows [7, 14)) meets windows [6, 9), [9, 12) and [12, 15).
    monkeypatch.setattr(build_module, "WINDOW_BATCHES", 1)
    real_encode = build_module._encode_window
    calls = {"n": 0}

    def killed_in_second_window(*args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("simulated kill")
        return real_encode(*args)

    def counted(*args):
        calls["n"] += 1
        return real_encode(*args)

    monkeypatch.setattr(build_module, "_encode_window", killed_in_second_window)
    shard = tmp_path / "shard-1"
    with pytest.raises(KeyboardInterrupt):
        _build(tiny_index, tiny_maxsim_dir, "--shards", "3", "--shard", "1", "--output", str(shard))
    with pytest.raises(SidecarNotFoundError, match=r"only the incomplete build .*shard-1\.partial"):
        assemble_shards(tmp_path / "out", [shards[0], shard, shards[2]])
    with pytest.raises(SidecarNotFoundError, match="is an incomplete sidecar build"):
        assemble_shards(tmp_path / "out", [shards[0], shard.with_name("shard-1.partial"), shards[2]])
    calls["n"] = 0
    monkeypatch.setattr(build_module, "_encode_window", counted)
    assert _build(tiny_index, tiny_maxsim_dir, "--shards", "3", "--shard", "1", "--output", str(shard)) == 0
    assert calls["n"] == 2  # the first window, committed before the kill, was kept and not encoded again
    uninterrupted = tmp_path / "uninterrupted"
    assert _build(tiny_index, tiny_maxsim_dir, "--shards", "3", "--shard", "1", "--output", str(uninterrupted)) == 0
    for name in ("tokens.bin", "offsets.bin", "docids.bin"):
        assert _files(shard, name) == _files(uninterrupted, name)
    assert assemble_shards(tmp_path / "out", [shards[0], shard, shards[2]]) == tmp_path / "out"


# ---- verify and the reader's refusals ----------------------------------------------------------------------------
def test_verify_finds_a_flipped_byte_in_one_shard(shards, tmp_path, capsys):
    output, copies = _copy_sharded(shards, tmp_path)
    data = bytearray((copies[1] / "tokens.bin").read_bytes())
    data[100] ^= 0x01
    (copies[1] / "tokens.bin").write_bytes(bytes(data))
    problems = verify_sidecar(output)
    assert len(problems) == 1 and problems[0].startswith(f"{copies[1]}: tokens.bin: checksum mismatch")
    assert sidecar_main(["verify", str(output)]) == 1
    assert "tokens.bin: checksum mismatch" in capsys.readouterr().out


def test_reader_refuses_a_shard_of_another_build_a_changed_or_missing_shard(tiny_index, tiny_maxsim_dir, shards,
                                                                            tmp_path):
    output, copies = _copy_sharded(shards, tmp_path)
    shutil.rmtree(copies[1])
    assert _build(tiny_index, tiny_maxsim_dir, "--shards", "3", "--shard", "1", "--dtype", "float16",
                  "--output", str(copies[1])) == 0
    message = (rf"shard 1 \(rows \[7, 14\)\) of sharded sidecar {output}: {copies[1] / 'manifest.json'} is a shard "
               r"of another build: its build id is")
    with pytest.raises(SidecarMismatchError, match=message):
        open_sidecar(output)
    assert any("is a shard of another build" in problem for problem in verify_sidecar(output))

    shutil.rmtree(copies[1])
    shutil.copytree(shards[1], copies[1])
    manifest = json.loads((copies[1] / "manifest.json").read_text())
    manifest["files"]["tokens.bin"]["sha256"] = "0" * 64
    (copies[1] / "manifest.json").write_text(json.dumps(manifest))
    reseal(copies[1])
    with pytest.raises(SidecarMismatchError, match="changed since the shards were assembled"):
        open_sidecar(output)

    shutil.rmtree(copies[1])
    shutil.copytree(shards[1], copies[1])
    assert open_sidecar(output).num_docs == 20
    shutil.rmtree(copies[2])
    with pytest.raises(SidecarNotFoundError,
                       match=rf"shard 2 \(rows \[14, 20\)\) of sharded sidecar {output} is missing: sidecar "
                             rf"{copies[2]} does not exist"):
        open_sidecar(output)


# ---- whole sharded builds ----------------------------------------------------------------------------------------
def test_local_sharded_build_with_an_empty_shard(tiny_index, tiny_maxsim_dir, unsharded, tmp_path, monkeypatch):
    output = tmp_path / "eight"
    assert _build(tiny_index, tiny_maxsim_dir, "--shards", "8", "--output", str(output)) == 0
    reader = open_sidecar(output)
    assert [shard.num_docs for shard in reader.shards] == [3, 3, 3, 3, 3, 3, 2, 0]
    whole = open_sidecar(unsharded)
    assert torch.equal(reader.get_batch(range(20))[0], whole.get_batch(range(20))[0])
    assert verify_sidecar(output) == []
    # Once assembled, the same command has nothing to do.
    monkeypatch.setattr(build_module, "_encode_window", lambda *args: pytest.fail("encoded again"))
    assert _build(tiny_index, tiny_maxsim_dir, "--shards", "8", "--output", str(output)) == 0


def test_shard_arguments_are_checked(tiny_index, tiny_maxsim_dir, tmp_path):
    with pytest.raises(SystemExit, match="--shard needs --shards"):
        _build(tiny_index, tiny_maxsim_dir, "--shard", "1", "--output", str(tmp_path / "x"))
    with pytest.raises(SystemExit, match="--shard must be between 0 and 2, not 3"):
        _build(tiny_index, tiny_maxsim_dir, "--shards", "3", "--shard", "3", "--output", str(tmp_path / "x"))
    with pytest.raises(SystemExit, match="--engine ray needs --shards N"):
        _build(tiny_index, tiny_maxsim_dir, "--engine", "ray", "--output", str(tmp_path / "x"))


def test_ray_engine_without_ray_says_what_to_install(tiny_index, tiny_maxsim_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    with pytest.raises(SystemExit, match=r"pip install 'pyserini-mores\[ray\]'"):
        _build(tiny_index, tiny_maxsim_dir, "--engine", "ray", "--shards", "2", "--output", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


# ---- Ray ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local_ray():
    from pyserini_mores._jvm import jvm_signal_handlers_kept

    ray = pytest.importorskip("ray")
    with jvm_signal_handlers_kept():  # else the rest of the suite runs Lucene without the JVM's fault handlers
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    with jvm_signal_handlers_kept():
        ray.shutdown()


def test_ray_build_retries_a_dead_worker_resumes_its_shard_and_skips_finished_shards(
        local_ray, tiny_index, tiny_maxsim_dir, tmp_path, monkeypatch, capsys):
    """Batches of 1 make windows of 16 documents: shard 1 of 2 (rows [10, 20)) spans two windows. Its first worker
    dies (os._exit) after committing the first window; Ray retries the task, which resumes the partial shard."""
    log = tmp_path / "tasks.log"

    def flaky_build_shard(args, shard, output, build_id):  # runs in Ray workers (pickled by value)
        import pyserini_mores.sidecar.build as worker_build  # not monkeypatched there

        if (tmp_path / "fail-now").exists():
            raise RuntimeError("simulated failure")
        attempt = len(list(tmp_path.glob(f"attempt-{shard}-*"))) + 1
        (tmp_path / f"attempt-{shard}-{attempt}").touch()
        real_encode = worker_build._encode_window
        windows_done = []

        def logged_encode(model, texts, *rest):
            with open(log, "a") as out:
                out.write(f"{shard} attempt {attempt} encodes {len(texts)}\n")
            if shard == 1 and attempt == 1 and windows_done:
                os._exit(1)  # the worker dies: no exception, no cleanup, like a lost node
            windows_done.append(len(texts))
            return real_encode(model, texts, *rest)

        worker_build._encode_window = logged_encode
        try:
            return worker_build.build_shard(args, shard, output, build_id)
        finally:
            worker_build._encode_window = real_encode

    monkeypatch.setattr(build_module, "build_shard", flaky_build_shard)
    reference = tmp_path / "local"
    args = ["--batch-size", "1"]
    assert _build(tiny_index, tiny_maxsim_dir, *args, "--output", str(reference)) == 0
    output = tmp_path / "ray"
    assert _build(tiny_index, tiny_maxsim_dir, *args, "--engine", "ray", "--shards", "2", "--max-retries", "2",
                  "--output", str(output)) == 0
    lines = log.read_text().splitlines()
    # Shard 1's first attempt encoded its first window (rows 0-15, keeping 10-15) and died in the second; the retry
    # encoded only the second window (rows 16-19): the committed rows were kept, not recomputed.
    assert sorted(line for line in lines if line.startswith("1 ")) == [
        "1 attempt 1 encodes 16", "1 attempt 1 encodes 4", "1 attempt 2 encodes 4"]
    reader, whole = open_sidecar(output), open_sidecar(reference)
    assert isinstance(reader, ShardedSidecarReader) and reader.num_docs == 20
    assert torch.equal(reader.get_batch(range(20))[0], whole.get_batch(range(20))[0])
    assert b"".join(_files(output / f"shard-{i:05d}-of-00002") for i in range(2)) == _files(reference)
    assert verify_sidecar(output) == []

    # After losing shard 1 (and the top manifest), a run whose task keeps failing reports it and assembles nothing;
    # the next run rebuilds only shard 1.
    shard0_manifest = (output / "shard-00000-of-00002" / "manifest.json").stat().st_mtime_ns
    shutil.rmtree(output / "shard-00001-of-00002")
    (output / "manifest.json").unlink()
    log.unlink()
    (tmp_path / "fail-now").touch()
    assert _build(tiny_index, tiny_maxsim_dir, *args, "--engine", "ray", "--shards", "2", "--max-retries", "0",
                  "--output", str(output)) == 2
    error = capsys.readouterr().err
    assert "1 of 1 shard tasks failed after 0 retries each; shard 1: RuntimeError: simulated failure." in error
    assert "run the same command again" in error and not (output / "manifest.json").exists()
    (tmp_path / "fail-now").unlink()
    assert _build(tiny_index, tiny_maxsim_dir, *args, "--engine", "ray", "--shards", "2", "--output",
                  str(output)) == 0
    assert {line.split()[0] for line in log.read_text().splitlines()} == {"1"}
    assert (output / "shard-00000-of-00002" / "manifest.json").stat().st_mtime_ns == shard0_manifest
    assert torch.equal(open_sidecar(output).get_batch(range(20))[0], whole.get_batch(range(20))[0])


def test_ray_shard_tasks_adopt_the_codec_the_driver_trained(local_ray, tiny_index, tiny_maxsim_dir, tmp_path):
    """The driver trains the build's codec (sq8: per-dimension ranges of the sample) before the tasks start; every
    task adopts it from the build directory: the same codes as the shards built here, one after the other."""
    from pyserini_mores.sidecar.trained_codec import load_trained_codec

    local, on_ray = tmp_path / "local", tmp_path / "ray"
    assert _build(tiny_index, tiny_maxsim_dir, "--codec", "sq8", "--shards", "2", "--output", str(local)) == 0
    assert _build(tiny_index, tiny_maxsim_dir, "--codec", "sq8", "--engine", "ray", "--shards", "2",
                  "--output", str(on_ray)) == 0
    trained = load_trained_codec(on_ray)
    assert np.array_equal(trained.parameters, load_trained_codec(local).parameters)
    reader, here = open_sidecar(on_ray), open_sidecar(local)
    assert reader.dtype == "sq8" and [shard.num_docs for shard in reader.shards] == [10, 10]
    assert all(np.array_equal(shard.codec.parameters(), trained.parameters) for shard in reader.shards)
    for shard in range(2):
        name = f"shard-{shard:05d}-of-00002"
        assert _files(on_ray / name) == _files(local / name)
    assert torch.equal(reader.get_batch(range(20))[0], here.get_batch(range(20))[0])
    assert verify_sidecar(on_ray) == []


def test_ray_shard_tasks_reserve_the_cpus_and_gpus_asked_for(monkeypatch, tmp_path):
    from pyserini_mores.sidecar.ray_engine import build_shards_on_ray
    from pyserini_mores.sidecar.shards import ShardPlan

    reserved, started = {}, []

    class FakeRay:  # what build_shards_on_ray asks of Ray, recorded
        @staticmethod
        def is_initialized():
            return True

        @staticmethod
        def remote(function):
            class Task:
                def options(self, **options):
                    reserved.update(options)
                    return self

                def remote(self, options, shard, path, build_id):
                    started.append(shard)
                    return shard

            return Task()

        @staticmethod
        def wait(refs, num_returns):
            return refs[:num_returns], refs[num_returns:]

        @staticmethod
        def get(ref):
            return ref

    monkeypatch.setitem(sys.modules, "ray", FakeRay)
    plan = ShardPlan(tmp_path, 2, "build", [tmp_path / "shard-0", tmp_path / "shard-1"], [0, 1])
    assert build_shards_on_ray(None, plan, lambda *args: None, cpus_per_task=2.0, gpus_per_task=1.0) == [0, 1]
    assert started == [0, 1] and reserved["num_cpus"] == 2.0 and reserved["num_gpus"] == 1.0
    build_shards_on_ray(None, plan, lambda *args: None)
    assert reserved["num_gpus"] == 0.0


def test_a_ray_build_leaves_the_jvm_its_fault_handlers(tmp_path):
    """ray.init() puts Ray's crash reporter on SIGSEGV & co. and ray.shutdown() resets them to the default action, which
    kills the process at the JVM's next deliberate fault (a null check or safepoint poll of compiled code): a search
    after a Ray build crashed at random. Checked in a fresh process, the handlers of a Ray build's driver before and
    after."""
    pytest.importorskip("ray")
    script = textwrap.dedent(f"""
        import json
        from pathlib import Path
        from pyserini_mores._jvm import ensure_jvm, fault_signal_actions
        from pyserini_mores.sidecar.ray_engine import build_shards_on_ray
        from pyserini_mores.sidecar.shards import ShardPlan

        def library_of(address):
            for line in open("/proc/self/maps"):
                span, *rest = line.split()
                low, high = (int(x, 16) for x in span.split("-"))
                if low <= address < high:
                    return Path(rest[-1]).name if len(rest) == 5 else "?"
            return "the default action" if not address else "?"

        def handlers():
            return {{signum: library_of(action.handler or 0) for signum, action in fault_signal_actions().items()}}

        ensure_jvm()
        before = handlers()
        assert set(before.values()) == {{"libjvm.so"}}, before
        output = Path({str(tmp_path)!r})
        plan = ShardPlan(output, 2, "build", [output / "shard-0", output / "shard-1"], [0, 1])
        assert build_shards_on_ray(None, plan, lambda *args: None) == [0, 1]
        print(json.dumps(handlers()), flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    after = json.loads(done.stdout.strip().splitlines()[-1])
    assert after == {str(int(signum)): "libjvm.so" for signum in JVM_FAULT_SIGNALS}, after
