"""Long documents stored as windows (format 3): the window map, the build that writes it, and the readers, verify,
info, sharded builds and transcode that carry it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from pyserini_mores.index import build_lucene_index, open_searcher
from pyserini_mores.sidecar import build as build_module
from pyserini_mores.sidecar import open_sidecar, verify_sidecar
from pyserini_mores.sidecar.__main__ import main as sidecar_main
from pyserini_mores.sidecar.build import build_sidecar
from pyserini_mores.sidecar.format import SidecarCorruptError
from pyserini_mores.sidecar.integrity import SidecarIntegrityError
from pyserini_mores.sidecar.reader import SidecarReader
from pyserini_mores.sidecar.transcode import transcode_sidecar
from pyserini_mores.sidecar.writer import SidecarWriter
from pyserini_mores.windows import WindowOptions, document_capacity, full_window_count, split_text, token_spans

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
OPTIONS = WindowOptions(window=16, stride=10, max_windows=4)


def _long_texts() -> list[str]:
    """Six documents of 1 to about 190 words, cut from the tiny collection's texts."""
    texts = [json.loads(line)["contents"] for line in (RESOURCES / "tiny_collection.jsonl").read_text().splitlines()]
    words = " ".join(texts).split()
    return [" ".join(words[start:start + size]) for start, size in
            ((0, 190), (5, 1), (30, 60), (60, 14), (90, 120), (7, 35))]


@pytest.fixture(scope="module")
def long_index(tmp_path_factory) -> Path:
    """A real Lucene index (stored text) of the long documents."""
    root = tmp_path_factory.mktemp("long_index")
    (root / "jsonl").mkdir()
    (root / "jsonl" / "docs.jsonl").write_text("".join(
        json.dumps({"id": f"w{i}", "contents": text}) + "\n" for i, text in enumerate(_long_texts())))
    return build_lucene_index(root / "jsonl", root / "index")


def _row_texts(index: Path) -> list[str]:
    """The documents' texts in row order, as the build reads them."""
    from pyserini_mores.index import iter_index_documents

    searcher = open_searcher(index)
    try:
        return [text for _, _, text in iter_index_documents(searcher, 0)]
    finally:
        searcher.close()


def _model(kind: str, tokenizer):
    from pyserini_mores.models._layers import BertDims
    from pyserini_mores.models.dual_encoder import DualEncoder, DualEncoderConfig
    from pyserini_mores.models.mores import MoresConfig, MoresModel
    from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel
    from pyserini_mores.models.tk import TKConfig, TKModel

    torch.manual_seed(0)
    dims = BertDims(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)
    if kind.startswith("mores"):
        model = MoresModel(MoresConfig(encoder=dims, n_interaction_blocks=1, reuse=kind[-2:], doc_max_length=24),
                           tokenizer)
    elif kind.startswith("prettr"):
        compression = {"compression_dim": 8} if kind.endswith("compressed") else {}
        model = PreTTRModel(PreTTRConfig(encoder=dims, join_layer=2, doc_max_length=24, **compression), tokenizer)
    elif kind == "tk":
        model = TKModel(TKConfig(embedding_dim=32, vocab_size=len(tokenizer), num_layers=1, num_heads=4, head_dim=8,
                                 ffn_dim=16, doc_max_length=24), tokenizer)
    else:
        model = DualEncoder(DualEncoderConfig(encoder=dims, doc_max_length=24), tokenizer)
    return model.eval()


def _build(index: Path, model, output: Path, options: WindowOptions = OPTIONS, **settings) -> Path:
    searcher = open_searcher(index)
    try:
        return build_sidecar(searcher, model, output, reranker_name="test", dtype="float32", progress=False,
                             windows=options, **{"batch_size": 1, **settings})
    finally:
        searcher.close()


def _windows_of(reader, row: int) -> list[np.ndarray]:
    """Row ``row``'s stored windows, through window_spans and get_spans."""
    starts, lengths, owners = reader.window_spans([row])
    assert owners.tolist() == [0] * len(starts)
    docs, spans = reader.get_spans(starts, lengths)
    return [docs[k, :int(spans[k])].numpy() for k in range(len(starts))]


@pytest.mark.parametrize("kind", ["mores-s1", "mores-s2", "prettr", "prettr-compressed", "tk", "maxsim"])
def test_stored_windows_are_the_windows_encoded_as_short_documents(long_index, tokenizer, tmp_path, kind):
    model = _model(kind, tokenizer)
    path = _build(long_index, model, tmp_path / kind)
    capacity = document_capacity(model)
    reader = SidecarReader(path)
    expected_counts, capped = [], 0
    for row, text in enumerate(_row_texts(long_index)):
        pieces = split_text(text, model.tokenizer, capacity, OPTIONS)
        with torch.inference_mode():
            expected = [model.encode_documents(model.tokenize_documents([piece]))[0].float().numpy()
                        for piece in pieces]
        stored = _windows_of(reader, row)
        assert len(stored) == len(expected) == reader.window_counts([row])[0]
        for window, (got, want) in enumerate(zip(stored, expected)):
            assert np.array_equal(got, want), (kind, row, window)
        assert np.array_equal(reader.get(row), np.concatenate(expected))  # a row is its windows one after another
        expected_counts.append(len(pieces))
        capped += full_window_count(len(token_spans(model.tokenizer, text)), 16, 10) > OPTIONS.max_windows
    assert reader.window_counts().tolist() == expected_counts and max(expected_counts) == 4
    assert min(expected_counts) == 1 and capped >= 2
    assert reader.windows == OPTIONS
    assert reader.manifest.windows == {"window": 16, "stride": 10, "max_windows": 4, "capacity": capacity,
                                       "num_windows": sum(expected_counts), "capped_documents": capped}
    assert reader.manifest.build["capped_documents"] == capped
    assert reader.manifest.build["windows_stored"] == sum(expected_counts)
    first_starts, first_lengths, owners = reader.window_spans([3, 0, 3], first_only=True)
    assert owners.tolist() == [0, 1, 2] and first_starts.tolist() == reader.offsets[[3, 0, 3]].tolist()
    assert verify_sidecar(path) == []


def test_windows_as_long_as_the_model_reads_start_with_its_truncation(long_index, tokenizer, tmp_path):
    model = _model("maxsim", tokenizer)
    windowed = SidecarReader(_build(long_index, model, tmp_path / "w", WindowOptions(max_windows=3)))
    plain = SidecarReader(_build(long_index, model, tmp_path / "p", WindowOptions()))
    starts, lengths, owners = windowed.window_spans(np.arange(6), first_only=True)
    firsts, _ = windowed.get_spans(starts, lengths)
    rows, _ = plain.get_batch(np.arange(6))
    assert torch.equal(firsts, rows)  # window 0 of each document is what a build without windows stores
    assert windowed.window_counts().max() == 3 and plain.window_counts().tolist() == [1] * 6
    assert plain.manifest.windows["capped_documents"] == 0 and plain.windows == WindowOptions()
    assert (plain.manifest.windows["window"], plain.manifest.windows["stride"]) == (22, 22)


def _todays_store(index: Path, model, output: Path, batch_size: int) -> tuple[Path, int]:
    """The store of the build loop without windows (documents encoded by grid chunks, one matrix each) and its count
    of truncated documents."""
    texts = _row_texts(index)
    searcher = open_searcher(index)
    from pyserini_mores.index import index_identity

    identity = index_identity(searcher)
    docids = [searcher.doc(row).docid() for row in range(len(texts))]
    searcher.close()
    chunk = batch_size * build_module.WINDOW_BATCHES
    truncated = 0
    with SidecarWriter(output, dim=model.store_width, dtype="float32", docids=docids,
                       model={"model_type": "t", "store_variant": "v", "fingerprint": "f" * 64}, index=identity,
                       content_hashes=identity.content_hashes()) as writer, torch.inference_mode():
        for start in range(0, len(texts), chunk):
            reps, flags, _ = build_module._encode_window(model, texts[start:start + chunk], batch_size)
            writer.add([rep.float().numpy() for rep in reps])
            truncated += int(flags.sum())
    return output, truncated


def test_one_window_stores_byte_for_byte_what_a_build_without_windows_stored(long_index, tokenizer, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(build_module, "WINDOW_BATCHES", 2)  # several grid chunks of 4 documents
    model = _model("mores-s1", tokenizer)
    path = _build(long_index, model, tmp_path / "one", WindowOptions(), batch_size=2)
    today, truncated = _todays_store(long_index, model, tmp_path / "today", batch_size=2)
    for name in ("tokens.bin", "offsets.bin"):
        assert (path / name).read_bytes() == (today / name).read_bytes(), name
    reader = SidecarReader(path)
    assert reader.window_counts().tolist() == [1] * 6
    assert reader.manifest.build["truncated_documents"] == truncated == 4


def _cli_build(index, model_dir, output, *extra):
    return sidecar_main(["build", "--index", str(index), "--reranker", "maxsim", "--model", str(model_dir),
                         "--output", str(output), "--batch-size", "2", "--dtype", "float32", *extra])


def test_a_sharded_windowed_build_equals_a_single_one(long_index, tiny_maxsim_dir, tmp_path, capsys):
    flags = ("--window", "30", "--stride", "20", "--max-windows", "3")
    assert _cli_build(long_index, tiny_maxsim_dir, tmp_path / "single", *flags) == 0
    out = capsys.readouterr().out
    single = open_sidecar(tmp_path / "single")
    windows = single.manifest.windows
    assert (f"stored 6 documents as {windows['num_windows']} windows" in out
            and f"{windows['capped_documents']} documents capped by --max-windows" in out)
    assert windows["capped_documents"] >= 1 and windows["num_windows"] > 6
    assert _cli_build(long_index, tiny_maxsim_dir, tmp_path / "sharded", *flags, "--shards", "3") == 0
    sharded = open_sidecar(tmp_path / "sharded")
    assert type(sharded).__name__ == "ShardedSidecarReader"
    assert sharded.window_counts().tolist() == single.window_counts().tolist()
    assert sharded.windows == single.windows == WindowOptions(30, 20, 3)
    rows = np.array([5, 0, 3, 1, 4, 2, 0])  # spanning every shard, a repeat
    spans, sharded_spans = single.window_spans(rows), sharded.window_spans(rows)
    assert np.array_equal(spans[1], sharded_spans[1]) and np.array_equal(spans[2], sharded_spans[2])
    for got, want in zip(sharded.get_spans(*sharded_spans[:2]), single.get_spans(*spans[:2])):
        assert torch.equal(got, want)
    for row in range(6):
        assert np.array_equal(sharded.get(row), single.get(row))
    assert verify_sidecar(tmp_path / "sharded") == []
    assert sidecar_main(["info", str(tmp_path / "sharded")]) == 0
    assert "windows     per shard: " in capsys.readouterr().out


def test_an_interrupted_windowed_build_resumes_to_the_same_bytes(long_index, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(build_module, "WINDOW_BATCHES", 1)  # one grid chunk of 2 documents at a time
    model = _model("maxsim", tokenizer)
    whole = _build(long_index, model, tmp_path / "whole", batch_size=2)
    real_encode = build_module._encode_window
    calls = {"n": 0}

    def crash_on_third_chunk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill")
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(build_module, "_encode_window", crash_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        _build(long_index, model, tmp_path / "resumed", batch_size=2)
    monkeypatch.setattr(build_module, "_encode_window", real_encode)
    resumed = _build(long_index, model, tmp_path / "resumed", batch_size=2)
    for name in ("tokens.bin", "offsets.bin", "windows.bin", "window_offsets.bin", "checksums.bin"):
        assert (resumed / name).read_bytes() == (whole / name).read_bytes(), name
    a, b = SidecarReader(whole).manifest, SidecarReader(resumed).manifest
    assert a.windows == b.windows and a.build["windows_stored"] == b.build["windows_stored"]


@pytest.fixture(scope="module")
def windowed(long_index, tmp_path_factory, tokenizer) -> Path:
    return _build(long_index, _model("maxsim", tokenizer), tmp_path_factory.mktemp("windowed") / "s")


def _copy(path: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    return copy


def _poke(file: Path, position: int, value: int) -> None:
    array = np.fromfile(file, dtype="<i8")
    array[position] = value
    array.tofile(file)


@pytest.mark.parametrize("name, position, value, problem", [
    ("windows.bin", 2, 0, "windows.bin: row 1 has no window"),
    ("windows.bin", -1, 5, "windows.bin: last entry is 5 but the manifest has windows.num_windows="),
    ("window_offsets.bin", 3, 10_000, "window_offsets.bin: offsets decrease at window 3"),
    ("window_offsets.bin", 0, 1, "window_offsets.bin: first offset is not 0"),
])
def test_a_damaged_window_map_is_refused_naming_the_file(windowed, tmp_path, name, position, value, problem):
    copy = _copy(windowed, tmp_path)
    _poke(copy / name, position, value)
    with pytest.raises(SidecarCorruptError, match=f"is damaged \\(.*{name}.*\\): .*{problem}"):
        SidecarReader(copy)
    assert any(problem in line for line in verify_sidecar(copy))


def test_a_window_map_that_disagrees_with_the_offsets_is_refused(windowed, tmp_path):
    copy = _copy(windowed, tmp_path)
    windows = np.fromfile(copy / "windows.bin", dtype="<i8")
    row = int(np.flatnonzero(np.diff(windows) > 1)[0]) + 1  # the row after one of several windows
    _poke(copy / "windows.bin", row, int(windows[row]) - 1)  # that row now starts a window early
    with pytest.raises(SidecarCorruptError, match=f"window_offsets.bin: row {row}'s windows start at token .* but "
                                                  f"offsets.bin puts the row at"):
        SidecarReader(copy)


def test_a_window_map_edit_that_keeps_its_shape_is_caught_by_its_checksums(windowed, tmp_path):
    copy = _copy(windowed, tmp_path)
    offsets = np.fromfile(copy / "window_offsets.bin", dtype="<i8")
    windows = np.fromfile(copy / "windows.bin", dtype="<i8")
    inner = int(np.flatnonzero(np.diff(windows) > 1)[0])  # a row of several windows: move its second window's start
    second = windows[inner] + 1
    assert offsets[second - 1] < offsets[second] - 1
    _poke(copy / "window_offsets.bin", second, int(offsets[second]) - 1)
    with pytest.raises(SidecarIntegrityError, match="window_offsets.bin bytes .* do not match their checksum"):
        SidecarReader(copy)
    assert any(line.startswith("window_offsets.bin: checksum mismatch") for line in verify_sidecar(copy))


def test_a_format_2_sidecar_opens_with_one_window_per_row(tmp_path, caplog, capsys):
    """``tests/resources/sidecar_format_2`` was written by the format 2 ``SidecarWriter`` (before windows) from the
    vectors below: 20 documents of 0 to 8 tokens, dim 8, stored as float16."""
    import logging

    rng = np.random.default_rng(0)
    docs = [rng.standard_normal((int(rng.integers(0, 9)), 8)).astype(np.float32) for _ in range(20)]
    legacy = tmp_path / "v2"
    shutil.copytree(RESOURCES / "sidecar_format_2", legacy)
    with caplog.at_level(logging.WARNING):
        reader = SidecarReader(legacy, expect_dtype="float16", expect_dim=8)
    assert not caplog.records  # it lacks only windows, which matter only to a windowed aggregation
    assert reader.format_version == 2 and reader.windows is None and reader.lacks == "windows"
    assert "no windows, so windowed aggregations (maxp, sump, avgcls) read one window per document" in (
        reader.legacy_notice())
    assert reader.window_counts().tolist() == [1] * 20 and reader.window_counts([3, 3]).tolist() == [1, 1]
    starts, lengths, owners = reader.window_spans([7, 2, 7])
    assert owners.tolist() == [0, 1, 2] and starts.tolist() == reader.offsets[[7, 2, 7]].tolist()
    spans, span_lengths = reader.get_spans(starts, lengths)
    for k, row in enumerate([7, 2, 7]):
        assert np.array_equal(spans[k, :int(span_lengths[k])].numpy(), docs[row].astype(np.float16).astype(np.float32))
    assert verify_sidecar(legacy) == []
    assert sidecar_main(["info", str(legacy)]) == 0
    assert "windows     none (format 2: one window per document" in capsys.readouterr().out


def _edit_manifest(path: Path, edit) -> None:
    data = json.loads((path / "manifest.json").read_text())
    edit(data)
    (path / "manifest.json").write_text(json.dumps(data))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("windows"), "field 'windows' is missing (format 3 records how documents were cut)"),
    (lambda d: d["windows"].update(window=0), "field 'windows.window' is 0, outside [1, "),
    (lambda d: d["windows"].update(max_windows=True), "field 'windows.max_windows' is True, outside [1, "),
    (lambda d: d["windows"].update(num_windows=2), "field 'windows.num_windows' is 2, outside [6, "),
    (lambda d: d["windows"].update(num_windows=10 ** 20), "field 'windows.num_windows' is 100000000000000000000"),
    (lambda d: d["windows"].update(capped_documents=7), "field 'windows.capped_documents' is 7, outside [0, 6]"),
    (lambda d: d["windows"].update(stride=17), "a window is at most the capacity long and a stride at most a window"),
    (lambda d: d["windows"].update(num_windows=25), "field 'windows.num_windows' is 25, more than max_windows 4 per"),
    (lambda d: d.__setitem__("windows", []), "field 'windows' is not a JSON object"),
])
def test_absurd_window_values_in_the_manifest_are_one_error_line(windowed, tmp_path, capsys, edit, message):
    copy = _copy(windowed, tmp_path)
    _edit_manifest(copy, edit)
    assert sidecar_main(["info", str(copy)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_a_format_3_manifest_edited_to_format_2_is_refused(windowed, tmp_path, capsys):
    copy = _copy(windowed, tmp_path)
    _edit_manifest(copy, lambda d: d.__setitem__("format_version", 2))
    assert sidecar_main(["info", str(copy)]) == 2
    assert ("format_version is 2 but the manifest holds windows, files.windows.bin, files.window_offsets.bin, which "
            "format 2 does not have: its version was edited") in capsys.readouterr().err


def test_an_edited_window_setting_is_caught_by_the_manifest_checksum(windowed, tmp_path):
    copy = _copy(windowed, tmp_path)
    _edit_manifest(copy, lambda d: d["windows"].update(stride=12))
    with pytest.raises(SidecarCorruptError, match="manifest_sha256"):
        SidecarReader(copy)


@pytest.mark.parametrize("flags, message", [
    (("--window", "0"), "error: --window must be a positive number of tokens, not 0"),
    (("--stride", "-3"), "error: --stride must be a positive number of tokens, not -3"),
    (("--max-windows", "0"), "error: --max-windows must be a positive integer, not 0"),
    (("--window", "8", "--stride", "9"), "error: --stride 9 is longer than --window 8"),
    (("--window", "63", "--max-windows", "2"), "error: --window 63 is longer than the 62 tokens the model reads"),
])
def test_bad_window_flags_are_refused_before_any_work(tiny_index, tiny_maxsim_dir, tmp_path, capsys, flags,
                                                      message):
    with pytest.raises(SystemExit) as stop:
        assert _cli_build(tiny_index, tiny_maxsim_dir, tmp_path / "s", *flags) == 2
        raise SystemExit(2)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines
    assert not (tmp_path / "s").exists() and not (tmp_path / "s.partial").exists()


def test_transcode_and_info_carry_the_window_map(windowed, tmp_path, capsys):
    copy = transcode_sidecar(windowed, tmp_path / "f16", dtype="float16", progress=False)
    source, target = SidecarReader(windowed), SidecarReader(copy)
    assert target.manifest.windows == source.manifest.windows
    for name in ("windows.bin", "window_offsets.bin", "offsets.bin"):
        assert (copy / name).read_bytes() == (windowed / name).read_bytes(), name
    for row in range(6):
        for got, want in zip(_windows_of(target, row), _windows_of(source, row)):
            assert np.array_equal(got, want.astype(np.float16).astype(np.float32))
    assert sidecar_main(["info", str(copy)]) == 0
    windows = source.manifest.windows
    assert (f"windows     {windows['num_windows']} of up to 4 per document, 16 tokens every 10 (the model reads 22), "
            f"{windows['capped_documents']} documents capped by --max-windows") in capsys.readouterr().out


def test_the_writer_refuses_window_counts_that_do_not_add_up(tmp_path):
    model = {"model_type": "t", "store_variant": "v", "fingerprint": "f" * 64}
    writer = SidecarWriter(tmp_path / "s", dim=2, docids=["a", "b"], model=model, index={"num_docs": 2},
                           windows={"max_windows": 2})
    reps = [np.zeros((1, 2), np.float32)] * 3
    with pytest.raises(ValueError, match="3 windows added for window counts summing to 2"):
        writer.add(reps, windows=[1, 1])
    with pytest.raises(ValueError, match="a document of 3 windows, but the sidecar stores at most max_windows=2"):
        writer.add(reps, windows=[3])
    writer.add(reps, windows=[2, 1])
    path = writer.finalize()
    assert SidecarReader(path).window_counts().tolist() == [2, 1]
    assert SidecarReader(path).windows == WindowOptions(max_windows=2)
