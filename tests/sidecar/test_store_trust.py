"""What the store refuses before a stored byte reaches a score: vectors of texts the index no longer holds, damaged
bytes (block checksums), an edited or absurd manifest; and what the indexer says about documents it left out."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from sidecar_forge import to_format_1, to_format_2

from pyserini_mores.index.__main__ import main as index_main
from pyserini_mores.search.__main__ import main as search_main
from pyserini_mores.sidecar import SidecarReader, SidecarWriter
from pyserini_mores.sidecar.__main__ import main as sidecar_main

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
DOCUMENTS = [json.loads(line) for line in (RESOURCES / "tiny_collection.jsonl").read_text().splitlines()]


def _write_collection(path: Path, texts: dict[str, str] | None = None) -> Path:
    """The tiny collection as MS MARCO TSV, with ``texts`` replacing some documents' text."""
    texts = texts or {}
    path.write_text("".join(f"{doc['id']}\t{texts.get(doc['id'], doc['contents'])}\n" for doc in DOCUMENTS))
    return path


def _build_sidecar(index: Path, model_dir: Path, output: Path) -> Path:
    from pyserini_mores import get_reranker
    from pyserini_mores.index import open_searcher
    from pyserini_mores.sidecar.build import build_sidecar

    reranker = get_reranker("maxsim", model=model_dir)
    searcher = open_searcher(index)
    try:
        return build_sidecar(searcher, reranker.model, output, reranker_name="maxsim", dtype="float16",
                             batch_size=4, progress=False)
    finally:
        searcher.close()


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, tiny_maxsim_dir) -> tuple[Path, Path]:
    """(index, sidecar): the tiny collection indexed by the package's indexer and a MaxSim sidecar of it."""
    root = tmp_path_factory.mktemp("trust")
    assert index_main(["--collection", str(_write_collection(root / "docs.tsv")), "--index",
                       str(root / "index")]) == 0
    return root / "index", _build_sidecar(root / "index", tiny_maxsim_dir, root / "sidecar")


def _search(index: Path, model_dir: Path, sidecar: Path, tmp_path: Path, *extra: str) -> int:
    """Rerank every document for one query from a run (so every row of the sidecar is read)."""
    topics = tmp_path / "topics.tsv"
    topics.write_text("q1\tpackage manager\n")
    run = tmp_path / "run.trec"
    run.write_text("".join(f"q1 Q0 {doc['id']} {rank + 1} {100 - rank} bm25\n" for rank, doc in enumerate(DOCUMENTS)))
    return search_main(["--index", str(index), "--topics", str(topics), "--run", str(run), "--reranker", "maxsim",
                        "--model", str(model_dir), "--sidecar", str(sidecar), "--rerank-depth", "20",
                        "--output", str(tmp_path / "out.trec"), *extra])


def _one_error_line(err: str) -> str:
    """The one ``error:`` line of ``err`` (a progress bar may share its terminal line), and no traceback."""
    assert err.count("error: ") == 1 and "Traceback" not in err, err
    return "error: " + err.split("error: ", 1)[1].split("\n", 1)[0]


def _flip(file: Path, position: int) -> None:
    data = bytearray(file.read_bytes())
    data[position] ^= 0x01
    file.write_bytes(bytes(data))


# ---- stale vectors: the index identity covers every document's text -------------------------------------------
def test_a_reindex_with_changed_text_is_refused_naming_the_document(tmp_path, tiny_maxsim_dir, capsys):
    index, sidecar = tmp_path / "index", tmp_path / "sidecar"
    assert index_main(["--collection", str(_write_collection(tmp_path / "a.tsv")), "--index", str(index)]) == 0
    _build_sidecar(index, tiny_maxsim_dir, sidecar)
    assert _search(index, tiny_maxsim_dir, sidecar, tmp_path) == 0
    # The same docids in the same order, one text edited: docids and row order alone cannot tell.
    shutil.rmtree(index)
    edited = {"d07": "an edited text about package managers"}
    assert index_main(["--collection", str(_write_collection(tmp_path / "b.tsv", edited)), "--index",
                       str(index)]) == 0
    capsys.readouterr()

    assert _search(index, tiny_maxsim_dir, sidecar, tmp_path) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "1 of 20 documents changed (d07)" in line and "stale" in line
    assert f"python -m pyserini_mores.sidecar build --index {index.resolve()} --reranker maxsim" in line
    assert f"--output {sidecar} --overwrite" in line

    assert sidecar_main(["verify", str(sidecar), "--index", str(index)]) == 1
    out = capsys.readouterr().out
    assert "1 of 20 documents have other texts in the index than the sidecar's vectors were encoded from (d07)" in out


# ---- damaged bytes never reach a score -------------------------------------------------------------------------
@pytest.mark.parametrize("name, position", [
    ("tokens.bin", 64 * 10 + 1),  # a byte inside the first document's vectors
    ("offsets.bin", 8 * 5),  # the low byte of a document boundary
    ("docids_sorted.bin", 3 * 3 + 2),  # the last character of a docid ("d04" -> "d05"?): it cannot be looked up
])
def test_a_flipped_byte_is_refused_with_one_line_naming_the_file(indexed, tiny_maxsim_dir, tmp_path, capsys, name,
                                                                  position):
    index, sidecar = indexed
    copy = tmp_path / "copy"
    shutil.copytree(sidecar, copy)
    _flip(copy / name, position)
    assert _search(index, tiny_maxsim_dir, copy, tmp_path, "--skip-unknown-docids") == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{copy / name} bytes [0, " in line and "do not match their checksum" in line
    assert "not in the index" not in line
    assert sidecar_main(["verify", str(copy)]) == 1
    assert f"{name}: checksum mismatch" in capsys.readouterr().out


def test_an_edited_dtype_is_refused_by_search_verify_and_info(indexed, tiny_maxsim_dir, tmp_path, capsys):
    index, sidecar = indexed
    copy = tmp_path / "copy"
    shutil.copytree(sidecar, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["dtype"] == "float16"
    manifest["dtype"] = "bfloat16"  # the same bytes per value: every size still matches
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert _search(index, tiny_maxsim_dir, copy, tmp_path) == 2
    assert "manifest's checksum (manifest_sha256) does not match" in _one_error_line(capsys.readouterr().err)
    assert sidecar_main(["verify", str(copy)]) == 1
    assert "manifest_sha256" in _one_error_line(capsys.readouterr().err)
    assert sidecar_main(["info", str(copy)]) == 2
    assert "manifest_sha256" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("field, value, message", [
    ("num_docs", 10 ** 20, "field 'num_docs' is 100000000000000000000, outside [0, 1099511627776]"),
    ("docid_width", 10 ** 12, "field 'docid_width' is 1000000000000, outside [1, 4096]"),
    ("num_tokens", -1, "field 'num_tokens' is -1, outside"),
    ("dim", True, "field 'dim' is missing or not an integer"),
    ("checksum", {"algorithm": "sha256-blocks", "block_bytes": "67108864"},
     "field 'checksum.block_bytes' is '67108864', not an integer"),
    ("checksum", {"algorithm": "sha256-blocks", "block_bytes": 67108864, "read_algorithm": "md5"},
     "field 'checksum.read_algorithm' is 'md5', not one of 'xxh3_64', 'crc32'"),
    ("checksum", {"algorithm": "sha256-blocks", "block_bytes": 67108864, "read_algorithm": 32},
     "field 'checksum.read_algorithm' is 32, not one of 'xxh3_64', 'crc32'"),
])
def test_absurd_manifest_values_are_one_error_line(indexed, tiny_maxsim_dir, tmp_path, capsys, field, value,
                                                   message):
    index, sidecar = indexed
    copy = tmp_path / "copy"
    shutil.copytree(sidecar, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest[field] = value
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert sidecar_main(["verify", str(copy)]) == 1
    assert message in _one_error_line(capsys.readouterr().err)
    assert sidecar_main(["info", str(copy)]) == 2
    assert message in _one_error_line(capsys.readouterr().err)
    assert _search(index, tiny_maxsim_dir, copy, tmp_path) == 2
    assert message in _one_error_line(capsys.readouterr().err)


# ---- format 1 sidecars open, and say what they lack ------------------------------------------------------------
def _format_1_copy(sidecar: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "v1"
    shutil.copytree(sidecar, copy)
    to_format_1(copy)
    return copy


def _legacy_warnings(caplog, path: Path) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno == logging.WARNING and f"sidecar {path} is format 1" in record.getMessage()]


def test_a_format_1_sidecar_reranks_like_format_2_and_warns_once(indexed, tiny_maxsim_dir, tmp_path, caplog,
                                                                 capsys):
    index, sidecar = indexed
    legacy = _format_1_copy(sidecar, tmp_path)
    manifest = json.loads((legacy / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and sorted(manifest["files"]) == sorted(
        ["tokens.bin", "offsets.bin", "docids.bin", "docids_sorted.bin", "docids_sorted_rows.bin"])
    assert sorted(manifest["index"]) == ["num_docs", "signature"] and "manifest_sha256" not in manifest
    assert sorted(path.name for path in legacy.iterdir()) == sorted([*manifest["files"], "manifest.json"])

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _search(index, tiny_maxsim_dir, sidecar, tmp_path / "a") == 0
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert _search(index, tiny_maxsim_dir, legacy, tmp_path / "b") == 0
        SidecarReader(legacy).get_batch([0, 19])  # a second open in the same process says nothing more
    expected = (tmp_path / "a" / "out.trec").read_text()
    assert len(expected.splitlines()) == 20
    assert (tmp_path / "b" / "out.trec").read_text() == expected  # same docids, same scores, same order
    warnings = _legacy_warnings(caplog, legacy)
    assert warnings == [
        f"sidecar {legacy} is format 1: it has no block checksums, manifest checksum, document text hashes or "
        f"windows, so damaged bytes and changed document texts are not detected at search time and windowed "
        f"aggregations read one window per document; `python -m pyserini_mores.sidecar verify {legacy} --index "
        f"INDEX` checks its files whole, `python -m pyserini_mores.sidecar build ... --output {legacy} --max-windows "
        f"N --overwrite` rebuilds it in format 3"]
    assert not _legacy_warnings(caplog, sidecar)

    assert sidecar_main(["info", str(legacy)]) == 0
    out = capsys.readouterr().out
    assert "format      pyserini-mores-sidecar v1," in out
    assert ("integrity   this sidecar is format 1: it has no block checksums, manifest checksum, document text "
            "hashes or windows") in out
    assert sidecar_main(["info", str(sidecar)]) == 0
    assert ("integrity   block checksums checked on first read, manifest checksum, document text hashes"
            in capsys.readouterr().out)
    assert sidecar_main(["verify", str(legacy), "--index", str(index)]) == 0
    assert f"OK {legacy}" in capsys.readouterr().out


def test_the_warning_reaches_a_search_without_verbose(indexed, tiny_maxsim_dir, tmp_path):
    import subprocess
    import sys

    index, sidecar = indexed
    legacy = _format_1_copy(sidecar, tmp_path)
    topics = tmp_path / "topics.tsv"
    topics.write_text("q1\tpackage manager\n")
    done = subprocess.run([sys.executable, "-m", "pyserini_mores.search", "--index", str(index), "--topics",
                           str(topics), "--reranker", "maxsim", "--model", str(tiny_maxsim_dir), "--sidecar",
                           str(legacy), "--hits", "5", "--output", str(tmp_path / "out.trec")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if f"sidecar {legacy} is format 1" in line]
    assert len(lines) == 1 and lines[0].startswith("WARNING "), done.stderr


def test_verify_of_a_format_1_sidecar_finds_a_flipped_byte_by_its_whole_file_checksum(indexed, tmp_path, capsys):
    legacy = _format_1_copy(indexed[1], tmp_path)
    assert sidecar_main(["verify", str(legacy)]) == 0
    _flip(legacy / "tokens.bin", 64 * 10 + 1)
    assert sidecar_main(["verify", str(legacy)]) == 1
    out = capsys.readouterr().out
    assert "1 problem(s)" in out and "tokens.bin: checksum mismatch" in out
    # At search time nothing can notice it: format 1 has no block checksums (what the warning says).
    SidecarReader(legacy).get_batch([0])


def test_a_format_2_manifest_edited_to_format_1_is_refused(indexed, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(indexed[1], copy)
    to_format_2(copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format_version"] = 1  # which would skip the manifest checksum and the block checks
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert sidecar_main(["info", str(copy)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert ("format_version is 1 but the manifest holds manifest_sha256, index.content, files.checksums.bin, "
            "files.content_hashes.bin, checksum.read_algorithm, checksum.read_block_bytes, which format 1 does not "
            "have: its version was edited") in line


@pytest.mark.parametrize("version, message", [
    (4, "sidecar format_version is 4, this pyserini_mores reads version 3; upgrade pyserini_mores to read it"),
    (0, "field 'format_version' is 0, not a sidecar format version (1, 2 or 3)"),
])
def test_a_format_this_package_does_not_read_is_refused(indexed, tiny_maxsim_dir, tmp_path, capsys, version,
                                                         message):
    index, sidecar = indexed
    legacy = _format_1_copy(sidecar, tmp_path)
    manifest = json.loads((legacy / "manifest.json").read_text())
    manifest["format_version"] = version
    (legacy / "manifest.json").write_text(json.dumps(manifest))
    assert sidecar_main(["info", str(legacy)]) == 2
    assert message in _one_error_line(capsys.readouterr().err)
    assert _search(index, tiny_maxsim_dir, legacy, tmp_path) == 2
    assert message in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("field, value, message", [
    ("num_docs", 10 ** 20, "field 'num_docs' is 100000000000000000000, outside [0, 1099511627776]"),
    ("dim", 1 << 20, "field 'dim' is 1048576, outside [1, 65536]"),
    ("checksum", {"algorithm": "sha256-blocks", "block_bytes": 0},
     "field 'checksum.block_bytes' is 0, not an integer in [1, 1099511627776]"),
])
def test_absurd_values_in_a_format_1_manifest_are_one_error_line(indexed, tiny_maxsim_dir, tmp_path, capsys, field,
                                                                  value, message):
    index, sidecar = indexed
    legacy = _format_1_copy(sidecar, tmp_path)
    manifest = json.loads((legacy / "manifest.json").read_text())
    manifest[field] = value
    (legacy / "manifest.json").write_text(json.dumps(manifest))
    assert sidecar_main(["verify", str(legacy)]) == 1
    assert message in _one_error_line(capsys.readouterr().err)
    assert sidecar_main(["info", str(legacy)]) == 2
    assert message in _one_error_line(capsys.readouterr().err)
    assert _search(index, tiny_maxsim_dir, legacy, tmp_path) == 2
    assert message in _one_error_line(capsys.readouterr().err)


def test_a_sidecar_written_by_the_format_1_writer_opens_and_verifies(tmp_path, caplog):
    """``tests/resources/sidecar_format_1`` was written by the format 1 ``SidecarWriter`` (before format 2) from the
    vectors below: 20 documents of 0 to 8 tokens, dim 8, stored as float16."""
    from pyserini_mores.sidecar import SidecarMismatchError, verify_sidecar

    rng = np.random.default_rng(0)
    docids = [f"d{row:02d}" for row in range(20)]
    docs = [rng.standard_normal((int(rng.integers(0, 9)), 8)).astype(np.float32) for _ in docids]
    legacy = tmp_path / "v1"
    shutil.copytree(RESOURCES / "sidecar_format_1", legacy)
    identity = {"num_docs": 20, "signature": "s" * 64, "content": "c" * 64}  # as a text-storing index has now
    with caplog.at_level(logging.INFO):
        reader = SidecarReader(legacy, expect_index=identity, expect_dtype="float16", expect_dim=8)
    assert reader.format_version == 1 and len(_legacy_warnings(caplog, legacy)) == 1
    assert [len(reader.get(row)) for row in range(20)] == [len(doc) for doc in docs]
    for row, doc in enumerate(docs):
        assert np.array_equal(reader.get(row), doc.astype(np.float16))
    assert reader.docids(range(20)) == docids and reader.rows_for_docids(["d07", "x"]).tolist() == [7, -1]
    with pytest.raises(SidecarMismatchError, match="built for another index"):
        SidecarReader(legacy, expect_index={**identity, "signature": "t" * 64})
    assert verify_sidecar(legacy) == []
    _flip(legacy / "docids_sorted_rows.bin", 8 * 3)
    assert [problem.split(":")[:2] for problem in verify_sidecar(legacy)][0] == ["docids_sorted_rows.bin",
                                                                               " checksum mismatch"]


def test_blocks_are_checked_on_first_read_and_remembered(tmp_path):
    from pyserini_mores.sidecar import SidecarIntegrityError

    docids = [f"doc{i}" for i in range(64)]
    rng = np.random.default_rng(0)
    docs = [rng.standard_normal((100, 64)).astype(np.float32) for _ in docids]  # 12.8 KB per document
    with SidecarWriter(tmp_path / "s", dim=64, docids=docids, model={"model_type": "t", "store_variant": "v",
                                                                      "fingerprint": "f" * 64},
                       index={"num_docs": 64}) as writer:
        writer.add(docs)
    path = tmp_path / "s"
    _flip(path / "tokens.bin", 40 * 12800 + 7)  # inside document 40
    reader = SidecarReader(path)
    assert np.array_equal(reader.get(3), docs[3].astype(np.float16))
    reader.get_batch([0, 1, 2, 63])  # blocks far from the damage are served
    with pytest.raises(SidecarIntegrityError, match=r"tokens.bin bytes \[507904, 524288\) do not match"):
        reader.get_batch([1, 40])
    with pytest.raises(SidecarIntegrityError):  # a failed block is not remembered as good
        reader.get(40)
    # Damage after a block was checked in this process is not looked for again (one check per block per process).
    _flip(path / "tokens.bin", 3 * 12800 + 5)
    reader.get(3)
    with pytest.raises(SidecarIntegrityError):
        SidecarReader(path).get(3)


def _blocks_sidecar(path: Path, algorithm: str) -> list[np.ndarray]:
    """64 documents of 100 float16 tokens of dim 64 (12,800 bytes each: 50 blocks of 16 KiB in all), with block
    checksums of ``algorithm`` (crc32: as sidecars written before xxh3_64 have them); the documents."""
    from sidecar_forge import reseal

    docids = [f"doc{i}" for i in range(64)]
    rng = np.random.default_rng(0)
    docs = [rng.standard_normal((100, 64)).astype(np.float32) for _ in docids]
    with SidecarWriter(path, dim=64, docids=docids, model={"model_type": "t", "store_variant": "v",
                                                            "fingerprint": "f" * 64},
                       index={"num_docs": 64}) as writer:
        writer.add(docs)
    if algorithm != "xxh3_64":
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["checksum"]["read_algorithm"] = algorithm
        (path / "manifest.json").write_text(json.dumps(manifest))
        reseal(path)
    return docs


@pytest.mark.parametrize("algorithm, dtype", [("xxh3_64", "<u8"), ("crc32", "<u4")])
def test_a_flipped_bit_in_a_batched_first_read_is_refused_whatever_the_block_hash(tmp_path, capsys, algorithm,
                                                                                  dtype):
    """A read of many blocks at once (every document in one batch) hashes them together, and one flipped bit anywhere
    in them is refused with the block's byte range, the blocks before it remembered as good and it not; sidecars
    with crc32 block checksums (written before xxh3_64) open, read and verify as before."""
    from pyserini_mores.sidecar import SidecarIntegrityError, verify_sidecar

    path = tmp_path / "s"
    docs = _blocks_sidecar(path, algorithm)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["checksum"]["read_algorithm"] == algorithm and manifest["files"]["checksums.bin"]["dtype"] == dtype
    intact = (path / "tokens.bin").read_bytes()
    assert len(intact) == 64 * 12800 and verify_sidecar(path) == []
    assert sidecar_main(["verify", str(path)]) == 0
    capsys.readouterr()
    docs_read, lengths = SidecarReader(path).get_batch(np.arange(64))
    assert lengths.tolist() == [100] * 64 and np.array_equal(docs_read.numpy(), np.stack(docs).astype(np.float16))
    # Every bit of the first and the last byte of block 31, and of a byte inside it: the same block, the same line.
    for position in (31 * 16384, 31 * 16384 + 5000, 32 * 16384 - 1):
        for bit in range(8):
            damaged = bytearray(intact)
            damaged[position] ^= 1 << bit
            (path / "tokens.bin").write_bytes(bytes(damaged))
            reader = SidecarReader(path)
            with pytest.raises(SidecarIntegrityError) as refused:
                reader.get_batch(np.arange(64))
            assert str(refused.value) == (
                f"sidecar {path} is damaged: {path / 'tokens.bin'} bytes [507904, 524288) do not match their "
                f"checksum in checksums.bin; rebuild the sidecar (`python -m pyserini_mores.sidecar verify {path}` "
                f"lists every problem)"), (position, bit)
            verified = reader._blocks._verified["tokens.bin"]
            assert verified[:31].all() and not verified[31:].any()
            with pytest.raises(SidecarIntegrityError):  # not remembered as good
                reader.get_spans(np.array([31 * 16384 // 128]), np.array([1]))
            reader.get_batch(np.arange(39))  # rows 0-38 end in block 30 (39 * 12800 < 31 * 16384): served
    assert [problem.split(":")[:2] for problem in verify_sidecar(path)] == [["tokens.bin", " checksum mismatch"]]
    # A manifest whose whole-file checksum was recomputed over the damage (as a writer's bug would): verify still
    # finds the block, by the block hashes.
    from pyserini_mores.sidecar.format import file_checksum, manifest_digest

    manifest["files"]["tokens.bin"]["sha256"] = file_checksum(path / "tokens.bin", manifest["checksum"]["block_bytes"])
    manifest["manifest_sha256"] = manifest_digest(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert verify_sidecar(path) == ["tokens.bin: 1 block(s) of 16384 bytes do not match checksums.bin (blocks 31)"]
    assert sidecar_main(["verify", str(path)]) == 1
    assert "tokens.bin: 1 block(s) of 16384 bytes do not match checksums.bin (blocks 31)" in capsys.readouterr().out


# ---- the indexer reports what it does not index ------------------------------------------------------------------
def test_the_indexer_reports_blank_documents_and_strict_refuses(tmp_path, capsys):
    collection = _write_collection(tmp_path / "docs.tsv", {"d03": "", "d11": "   "})
    assert index_main(["--collection", str(collection), "--index", str(tmp_path / "strict"), "--strict"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "2 document(s)" in line and "(d03, d11)" in line and "nothing was written" in line
    assert not (tmp_path / "strict").exists() and not (tmp_path / "strict.partial").exists()

    assert index_main(["--collection", str(collection), "--index", str(tmp_path / "index")]) == 0
    captured = capsys.readouterr()
    assert f"indexed 18 documents into {tmp_path / 'index'}" in captured.out
    assert "not indexed: 2 document(s) with empty or whitespace-only text: d03, d11" in captured.err
    from pyserini_mores.index import open_searcher

    searcher = open_searcher(tmp_path / "index")
    assert searcher.num_docs == 18
    searcher.close()


def test_a_docid_hidden_by_damage_elsewhere_in_the_sorted_table_is_damage_not_unknown(tmp_path):
    from pyserini_mores.sidecar import SidecarIntegrityError

    docids = [f"d{row:07d}" for row in range(4095)]  # 8 bytes each: docids_sorted.bin spans two 16 KiB blocks
    with SidecarWriter(tmp_path / "s", dim=4, docids=docids, model={"model_type": "t", "store_variant": "v",
                                                                     "fingerprint": "f" * 64},
                       index={"num_docs": len(docids)}) as writer:
        writer.add([np.ones((1, 4), np.float32)] * len(docids))
    path = tmp_path / "s"
    assert SidecarReader(path).rows_for_docids(["d0000100", "x"]).tolist() == [100, -1]
    # The binary search's first pivot (entry 2047, the last of block 0) now sorts before every docid: the search for
    # an entry of block 0 turns right and ends at entry 2048, in block 1, which is intact, without finding it.
    data = bytearray((path / "docids_sorted.bin").read_bytes())
    data[2047 * 8] = ord("c")
    (path / "docids_sorted.bin").write_bytes(bytes(data))
    with pytest.raises(SidecarIntegrityError, match=r"docids_sorted.bin bytes \[0, 16384\) do not match their "
                                                    r"checksum.*; 1 docid\(s\) could not be looked up in it"):
        SidecarReader(path).rows_for_docids(["d0000100"])
