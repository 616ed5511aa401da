"""The sidecar store: exact round-trips per dtype, docid lookup, atomic and resumable writing, refusals, verify, CLI."""
from __future__ import annotations

import gc
import json
import multiprocessing
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pyserini_mores.sidecar import (
    BatchBuffer,
    SidecarCorruptError,
    SidecarExistsError,
    SidecarMismatchError,
    SidecarNotFoundError,
    SidecarReader,
    SidecarWriter,
    open_sidecar,
    read_manifest,
    verify_sidecar,
)
from pyserini_mores.sidecar.__main__ import main
from pyserini_mores.sidecar.format import DATA_FILES, FORMAT_VERSION, WINDOW_FILES, file_checksum

DIM = 6
FINGERPRINT = "0123456789abcdef" * 4
OTHER_FINGERPRINT = "fedcba9876543210" * 4
MODEL = {"model_type": "mores", "store_variant": "s1", "fingerprint": FINGERPRINT}
LENGTHS = [3, 0, 5, 1, 0, 7, 2, 4, 6, 1, 3, 5]  # includes empty documents
DOCIDS = ["D12", "D3", "doc-7", "D100", "é-1", "D1", "D30", "x", "D2", "D20", "D200", "D10"]
INDEX = {"num_docs": len(DOCIDS), "signature": "lucene:tiny:v1"}


def _documents(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((length, DIM)) * 3).astype(np.float32) for length in LENGTHS]


def _write(path: Path, docs: list[np.ndarray], *, batch: int = 5, **kwargs) -> Path:
    options = dict(dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, build={"max_length": 8}, block_bytes=64)
    options.update(kwargs)
    writer = SidecarWriter(path, **options)
    for start in range(writer.rows_done, len(docs), batch):
        writer.add(docs[start:start + batch])
    return writer.finalize(build={"seconds": 1.5})


def _stored(doc: np.ndarray, dtype: str) -> np.ndarray:
    """What the sidecar must give back: the input rounded to the storage dtype, as float32."""
    return torch.from_numpy(doc).to(getattr(torch, dtype)).float().numpy()


@pytest.fixture
def sidecar(tmp_path) -> Path:
    return _write(tmp_path / "sidecar", _documents())


# ---- round trips -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_trip_is_exact_in_the_stored_dtype(tmp_path, dtype):
    docs = _documents()
    # Half the documents arrive as torch tensors, as encode_documents returns them.
    inputs = [torch.from_numpy(doc) if i % 2 else doc for i, doc in enumerate(docs)]
    path = _write(tmp_path / dtype, inputs, dtype=dtype)
    with SidecarReader(path, expect_dtype=dtype, expect_dim=DIM) as reader:
        assert (reader.num_docs, reader.dim, reader.dtype) == (len(docs), DIM, dtype)
        assert reader.num_tokens == sum(LENGTHS)
        assert reader.lengths().tolist() == LENGTHS
        rows = [5, 1, 0, 5, 11, 4, 2]  # unordered, repeated, empty documents
        batch, lengths = reader.get_batch(rows)
        assert batch.dtype == torch.float32 and lengths.dtype == torch.int64
        assert batch.shape == (len(rows), max(LENGTHS[row] for row in rows), DIM)
        assert lengths.tolist() == [LENGTHS[row] for row in rows] == reader.lengths(rows).tolist()
        for i, row in enumerate(rows):
            np.testing.assert_array_equal(batch[i, :LENGTHS[row]].numpy(), _stored(docs[row], dtype))
            assert not batch[i, LENGTHS[row]:].any(), "padding must be zeros"
            np.testing.assert_array_equal(np.asarray(reader.get(row), dtype=np.float32), _stored(docs[row], dtype))
        native, _ = reader.get_batch(rows, dtype=None)
        assert native.dtype == getattr(torch, dtype)
        torch.testing.assert_close(native.float(), batch, rtol=0, atol=0)
        assert reader.bytes_per_doc == sum(LENGTHS) * DIM * {"float32": 4}.get(dtype, 2) / len(docs)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_batches_in_a_reused_buffer_hold_the_rows_and_zero_padding(tmp_path, dtype):
    """A buffer full of garbage from a longer batch: padding is zeroed, and the conversion lands in the buffer too."""
    path = _write(tmp_path / dtype, _documents(), dtype=dtype)
    buffer = BatchBuffer()
    with SidecarReader(path) as reader:
        stored = reader.get_batch([0], dtype=None)[0].dtype
        buffer.take("stored", (64, 64, DIM), stored).fill_(float("nan"))
        buffer.take("converted", (64, 64, DIM), torch.float32).fill_(float("nan"))
        for rows in ([11, 3, 7, 0, 2], [5, 1, 0, 5, 11, 4, 2], [4], [1, 6]):
            for target in ("float32", None):
                batch, lengths = reader.get_batch(rows, dtype=target, buffer=buffer)
                assert batch.dtype == (torch.float32 if target else stored)
                assert lengths.tolist() == [LENGTHS[row] for row in rows]
                for i, row in enumerate(rows):
                    np.testing.assert_array_equal(batch[i, :LENGTHS[row]].float().numpy(), reader.get(row))
                    assert not batch[i, LENGTHS[row]:].any(), "padding must be zeros"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_head_major_batches_are_the_token_major_batch_split_into_heads(tmp_path, dtype):
    """heads=3 on 6-wide rows: [B, 3, Lmax, 2], head h of slot j = columns 2h..2h+1 of row j, padding zero — also
    through a reused buffer full of garbage from a longer batch."""
    path = _write(tmp_path / dtype, _documents(), dtype=dtype)
    buffer = BatchBuffer()
    with SidecarReader(path) as reader:
        buffer.take("stored", (64, 64, DIM), reader.get_batch([0], dtype=None)[0].dtype).fill_(float("nan"))
        for rows in ([11, 3, 7, 0, 2], [5, 1, 0, 5, 11, 4, 2], [1, 4]):
            token_major, lengths = reader.get_batch(rows, dtype=None)
            batch, head_lengths = reader.get_batch(rows, dtype=None, buffer=buffer, heads=3)
            assert batch.shape == (len(rows), 3, token_major.shape[1], DIM // 3)
            assert torch.equal(head_lengths, lengths)
            for i, row in enumerate(rows):
                for head in range(3):
                    expected = token_major[i, :, 2 * head:2 * head + 2]
                    assert torch.equal(batch[i, head], expected), (row, head)
                assert not batch[i, :, LENGTHS[row]:].any(), "padding must be zeros"
        with pytest.raises(ValueError, match="cannot split 6-wide stored vectors into 4 equal heads"):
            reader.get_batch([0], heads=4)


def test_batches_of_only_empty_documents_and_an_all_empty_sidecar(tmp_path):
    docs = [np.zeros((0, DIM), np.float32)] * len(DOCIDS)
    path = _write(tmp_path / "empty", docs)
    with open_sidecar(path) as reader:
        batch, lengths = reader.get_batch([3, 0])
        assert batch.shape == (2, 0, DIM) and lengths.tolist() == [0, 0]
        assert reader.get(4).shape == (0, DIM)
    assert verify_sidecar(path) == []


def test_docid_lookup(sidecar):
    with SidecarReader(sidecar) as reader:
        assert [reader.docid(row) for row in range(len(DOCIDS))] == DOCIDS
        assert reader.docids([4, 0]) == ["é-1", "D12"]
        queries = ["D1", "doc-7", "unknown", "D", "doc-7-extra", "é-1", "D200", ""]
        assert reader.rows_for_docids(queries).tolist() == [5, 2, -1, -1, -1, 4, 10, -1]
        assert reader.rows_for_docids([]).dtype == np.int64
        with pytest.raises(IndexError, match="-1 marks a docid that is not in the sidecar"):
            reader.get_batch(reader.rows_for_docids(["unknown"]))


def test_readers_in_other_processes(sidecar):
    reader = SidecarReader(sidecar, expect_model_fingerprint=FINGERPRINT)
    clone = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(clone.get(5), reader.get(5))
    # spawn, not fork: forking a process that may already run a JVM (other tests start one) can deadlock.
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        sums = pool.map_async(_row_sum, [(reader, row) for row in range(len(DOCIDS))]).get(timeout=120)
    assert sums == [float(reader.get(row).astype(np.float64).sum()) for row in range(len(DOCIDS))]


def _row_sum(job: tuple[SidecarReader, int]) -> float:
    reader, row = job
    return float(reader.get(row).astype(np.float64).sum())


def test_reading_the_manifest_and_opening_do_not_import_torch(sidecar):
    code = ("import sys; from pyserini_mores.sidecar import open_sidecar, read_manifest; "
            f"read_manifest({str(sidecar)!r}); r = open_sidecar({str(sidecar)!r}); r.get(2); r.rows_for_docids(['x']); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- writing: atomicity, resume, validation ----------------------------------------------------------------------
def test_nothing_appears_before_finalize(tmp_path):
    path = tmp_path / "sidecar"
    docs = _documents()
    writer = SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX)
    writer.add(docs[:4])
    assert not path.exists() and (tmp_path / "sidecar.partial").is_dir()
    with pytest.raises(SidecarNotFoundError, match=r"does not exist: only the incomplete build .*sidecar\.partial"):
        SidecarReader(path)
    with pytest.raises(SidecarNotFoundError, match="incomplete sidecar build"):
        SidecarReader(tmp_path / "sidecar.partial")
    with pytest.raises(Exception, match="4 of 12 documents written"):
        writer.finalize()
    writer.add(docs[4:])
    writer.finalize()
    assert path.is_dir() and not (tmp_path / "sidecar.partial").exists()
    assert sorted(p.name for p in path.iterdir()) == sorted([*DATA_FILES, *WINDOW_FILES, "manifest.json"])


@pytest.mark.parametrize("crash", ["committed every add", "uncommitted tail", "lost block log"])
def test_resume_after_a_crash_gives_the_uninterrupted_result(tmp_path, crash):
    docs = _documents()
    reference = _write(tmp_path / "reference", docs, batch=3)
    path = tmp_path / "resumed"
    commit_every = 4 if crash == "uncommitted tail" else 1
    writer = SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, build={"max_length": 8},
                           block_bytes=64, commit_every_docs=commit_every)
    for start in range(0, 7, 2):
        writer.add(docs[start:start + 2])  # 8 rows added, committed at 2/4/6/8 or at 4/8
    writer.add(docs[8:9])  # committed only when every add commits
    del writer  # the process "dies": no close(), no finalize()
    gc.collect()  # its files are closed now, so no late buffer flush can land after the resume below
    partial = tmp_path / "resumed.partial"
    with open(partial / "tokens.bin", "ab") as torn:
        torn.write(b"\x7f" * 37)  # a torn write after the last commit
    if crash == "lost block log":
        (partial / "_journal" / "tokens.bin.blocks").unlink()

    writer = SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, build={"max_length": 8},
                           block_bytes=64)
    assert writer.rows_done == (8 if crash == "uncommitted tail" else 9)
    assert writer.num_tokens == sum(LENGTHS[:writer.rows_done])
    for start in range(writer.rows_done, len(docs), 3):
        writer.add(docs[start:start + 3])
    writer.finalize(build={"seconds": 1.5})

    expected, actual = read_manifest(reference), read_manifest(path)
    for name in DATA_FILES:
        assert (path / name).read_bytes() == (reference / name).read_bytes(), name
        assert actual.files[name] == expected.files[name], name
        assert file_checksum(path / name, 64) == actual.files[name].sha256, name
    assert actual.build == expected.build == {"max_length": 8, "seconds": 1.5}
    assert verify_sidecar(path) == []


def test_context_manager_keeps_a_failed_build_resumable_and_finalizes_a_complete_one(tmp_path):
    path, docs = tmp_path / "sidecar", _documents()
    with pytest.raises(RuntimeError):
        with SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX) as writer:
            writer.add(docs[:6])
            writer.update_build({"truncated_documents": 2})
            raise RuntimeError("encoder crashed")
    with SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX, build={"reranker": "mores"}) as writer:
        assert writer.rows_done == 6
        assert writer.build_info == {"truncated_documents": 2, "reranker": "mores"}, "build info survives a resume"
        writer.add(docs[6:])
    reader = SidecarReader(path)
    assert reader.num_tokens == sum(LENGTHS)
    assert reader.manifest.build == {"truncated_documents": 2, "reranker": "mores"}


def test_a_partial_build_with_other_parameters_is_refused_unless_restarted(tmp_path):
    path, docs = tmp_path / "sidecar", _documents()
    writer = SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX)
    writer.add(docs[:3])
    writer.close()
    other_model = {**MODEL, "fingerprint": OTHER_FINGERPRINT}
    with pytest.raises(SidecarMismatchError, match=r"partial build with other parameters \(differing: model\).*"
                                                   r"restart=True"):
        SidecarWriter(path, dim=DIM, docids=DOCIDS, model=other_model, index=INDEX)
    with pytest.raises(SidecarMismatchError, match="differing: dtype"):
        SidecarWriter(path, dim=DIM, dtype="float32", docids=DOCIDS, model=MODEL, index=INDEX)
    restarted = SidecarWriter(path, dim=DIM, docids=DOCIDS, model=other_model, index=INDEX, restart=True)
    assert restarted.rows_done == 0
    restarted.abort()
    assert not (tmp_path / "sidecar.partial").exists()


def test_an_existing_sidecar_is_replaced_only_with_overwrite(sidecar):
    with pytest.raises(SidecarExistsError, match="already exists; pass overwrite=True"):
        SidecarWriter(sidecar, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX)
    _write(sidecar, _documents(seed=1), dtype="float32", overwrite=True)
    reader = SidecarReader(sidecar)
    assert reader.dtype == "float32"
    np.testing.assert_array_equal(reader.get(2), _documents(seed=1)[2])


def test_writer_rejects_bad_input(tmp_path):
    path, docs = tmp_path / "sidecar", _documents()
    with pytest.raises(ValueError, match="docids must be unique: 'D1' appears more than once"):
        SidecarWriter(path, dim=DIM, docids=["D1", "D2", "D1"], model=MODEL, index={"num_docs": 3})
    with pytest.raises(ValueError, match="12 docids given but the index has 13 documents"):
        SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index={"num_docs": 13})
    with pytest.raises(ValueError, match="model info lacks fingerprint"):
        SidecarWriter(path, dim=DIM, docids=DOCIDS, model={"model_type": "mores", "store_variant": "s1"}, index={})
    writer = SidecarWriter(path, dim=DIM, docids=DOCIDS, model=MODEL, index=INDEX)
    with pytest.raises(ValueError, match=r"row 1: expected a \[len, 6\] matrix, got shape \(2, 5\)"):
        writer.add([docs[0], np.zeros((2, 5), np.float32)])
    with pytest.raises(ValueError, match=r"row 1 has non-finite values .*float16 overflows"):
        writer.add([docs[0], np.full((2, DIM), 1e6, np.float32)])
    assert writer.rows_done == 0, "a rejected batch writes nothing"
    with pytest.raises(ValueError, match="only 12 rows"):
        writer.add(docs + docs[:1])
    writer.abort()


# ---- refusals at open --------------------------------------------------------------------------------------------
def test_refuses_a_sidecar_of_another_model(sidecar):
    with pytest.raises(SidecarMismatchError) as error:
        SidecarReader(sidecar, expect_model_fingerprint=OTHER_FINGERPRINT)
    message = str(error.value)
    assert "built for another model" in message and "must be rebuilt" in message
    assert FINGERPRINT[:12] in message and OTHER_FINGERPRINT[:12] in message
    assert SidecarReader(sidecar, expect_model_fingerprint=FINGERPRINT).num_docs == len(DOCIDS)


def test_refuses_a_sidecar_of_another_index(sidecar):
    with pytest.raises(SidecarMismatchError, match="built for another index.*lucene:tiny:v2"):
        SidecarReader(sidecar, expect_index={**INDEX, "signature": "lucene:tiny:v2"})
    assert SidecarReader(sidecar, expect_index=dict(INDEX)).num_docs == len(DOCIDS)


def test_refuses_another_dtype_or_dim(sidecar):
    with pytest.raises(SidecarMismatchError, match="stores dtype float16 but bfloat16 was expected"):
        SidecarReader(sidecar, expect_dtype="bfloat16")
    with pytest.raises(SidecarMismatchError, match="dim 6 but dim 8 was expected"):
        SidecarReader(sidecar, expect_dim=8)


def test_refuses_a_truncated_file(sidecar):
    size = (sidecar / "tokens.bin").stat().st_size
    with open(sidecar / "tokens.bin", "r+b") as tokens:
        tokens.truncate(size - 10)
    with pytest.raises(SidecarCorruptError, match=rf"tokens\.bin: file is truncated: expected {size} bytes, "
                                                  rf"found {size - 10} bytes"):
        SidecarReader(sidecar)


def test_refuses_a_missing_directory_and_another_format_version(tmp_path, sidecar):
    with pytest.raises(SidecarNotFoundError, match="does not exist"):
        SidecarReader(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError):  # callers may catch the builtin
        open_sidecar(tmp_path / "nowhere")
    manifest = json.loads((sidecar / "manifest.json").read_text())
    manifest["format_version"] = 99
    (sidecar / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SidecarMismatchError,
                       match=f"format_version is 99, this pyserini_mores reads version {FORMAT_VERSION}; upgrade"):
        SidecarReader(sidecar)


# ---- verify and CLI ----------------------------------------------------------------------------------------------
def test_verify_finds_a_flipped_byte_and_bad_offsets(sidecar):
    assert verify_sidecar(sidecar) == []
    with open(sidecar / "tokens.bin", "r+b") as tokens:
        tokens.seek(100)
        byte = tokens.read(1)
        tokens.seek(100)
        tokens.write(bytes([byte[0] ^ 0x01]))
    problems = verify_sidecar(sidecar)
    assert len(problems) == 1 and problems[0].startswith("tokens.bin: checksum mismatch")
    offsets = np.fromfile(sidecar / "offsets.bin", dtype="<i8")
    offsets[3] = offsets[4] + 1
    offsets.tofile(sidecar / "offsets.bin")
    problems = verify_sidecar(sidecar)
    assert any(p.startswith("offsets.bin: checksum mismatch") for p in problems)
    assert any(p.startswith("offsets.bin: offsets decrease at row 3") for p in problems)
    (sidecar / "docids_sorted.bin").unlink()
    assert any(p.startswith("docids_sorted.bin: file is missing") for p in verify_sidecar(sidecar))


def test_cli_info_and_verify(sidecar, capsys):
    assert main(["info", str(sidecar)]) == 0
    out = capsys.readouterr().out
    for expected in ("mores (variant s1)", FINGERPRINT[:12], "dim 6, float16", "12 (37 tokens",
                     "signature=lucene:tiny:v1", "max_length=8", "seconds=1.5"):
        assert expected in out, expected
    assert main(["info", "--json", str(sidecar)]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((sidecar / "manifest.json").read_text())
    assert main(["verify", str(sidecar)]) == 0
    assert capsys.readouterr().out.startswith("OK")
    with open(sidecar / "tokens.bin", "r+b") as tokens:
        tokens.write(b"\xff\xff")
    assert main(["verify", str(sidecar)]) == 1
    assert "tokens.bin: checksum mismatch" in capsys.readouterr().out
    assert main(["info", str(sidecar.with_name("nowhere"))]) == 2
    assert "does not exist" in capsys.readouterr().err
