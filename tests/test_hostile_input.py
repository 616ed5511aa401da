"""Hostile and odd input, each case with the behaviour a user gets and the message they read: blank and
over-long documents, blank queries, bytes that are not UTF-8, huge and duplicated topic files, docids the index does
not hold, a disk that fills up during a sidecar build, broken checkpoint directories, concurrent readers."""
from __future__ import annotations

import builtins
import errno
import gzip
import json
import math
import multiprocessing
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from pyserini_mores import Query, Text, get_reranker
from pyserini_mores import _io as io_module
from pyserini_mores.formats import FormatError, read_collection, read_qrels, read_run, read_topics, write_run
from pyserini_mores.index import build_lucene_index, fetch_texts, index_docids, open_searcher
from pyserini_mores.search import RerankingSearcher
from pyserini_mores.search.__main__ import main as search_main
from pyserini_mores.sidecar import SidecarCorruptError, SidecarReader, SidecarWriter, open_sidecar, verify_sidecar
from pyserini_mores.sidecar import build as build_module
from pyserini_mores.sidecar import format as format_module
from pyserini_mores.sidecar import writer as writer_module
from pyserini_mores.sidecar.__main__ import main as sidecar_main
from pyserini_mores.types import RerankedHit

from conftest import RESOURCES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_LENGTH = 16  # document cap in WordPieces, [CLS] and [SEP] included
# "word" is one WordPiece, so "word " * n is n + 2 tokens with the specials: 14 words fill the cap exactly.
HOSTILE_DOCUMENTS = {
    "normal": "vim is a text editor for the terminal",
    "nbsp": "\u00a0\u00a0",  # not blank to Lucene (Java's trim keeps U+00A0), blank to WordPiece
    "zero-width": "\u200b \u200b",  # likewise: format characters, dropped by BERT's text cleaning
    "exact": "word " * (MAX_LENGTH - 2),
    "over": "word " * (MAX_LENGTH - 1),
    "huge": "editor " * 50_000,
    "empty": "",
    "spaces": "  \t ",
}
INDEXED = ["normal", "nbsp", "zero-width", "exact", "over", "huge"]  # Anserini skips empty and whitespace-only docs


@pytest.fixture(scope="module")
def hostile_index(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile_index")
    (root / "jsonl").mkdir()
    lines = [json.dumps({"id": docid, "contents": text}) for docid, text in HOSTILE_DOCUMENTS.items()]
    (root / "jsonl" / "docs.jsonl").write_text("\n".join(lines) + "\n")
    return build_lucene_index(root / "jsonl", root / "index")


def _build(index, model_dir, output, *extra) -> int:
    return sidecar_main(["build", "--index", str(index), "--reranker", "maxsim", "--model", str(model_dir),
                         "--output", str(output), "--batch-size", "2", *extra])


# ---- blank and over-long documents ---------------------------------------------------------------------------------
def test_blank_and_over_long_documents_are_stored_with_valid_lengths(hostile_index, tiny_maxsim_dir, tokenizer,
                                                                      tmp_path):
    searcher = open_searcher(hostile_index)
    assert index_docids(searcher) == INDEXED, "Anserini drops empty and whitespace-only documents at indexing"
    searcher.close()
    output = tmp_path / "sidecar"
    assert _build(hostile_index, tiny_maxsim_dir, output, "--max-length", str(MAX_LENGTH), "--dtype", "float32") == 0
    assert verify_sidecar(output) == []
    reader = open_sidecar(output)
    lengths = dict(zip(INDEXED, reader.lengths().tolist()))
    # Blank-to-WordPiece documents keep their [CLS] and [SEP]: a real, scorable 2-token document.
    normal = len(tokenizer(HOSTILE_DOCUMENTS["normal"])["input_ids"])
    assert lengths == {"normal": normal, "nbsp": 2, "zero-width": 2, "exact": MAX_LENGTH, "over": MAX_LENGTH,
                       "huge": MAX_LENGTH}
    assert reader.manifest.build["max_length"] == MAX_LENGTH


def test_blank_texts_from_a_collection_file_are_stored_and_scored(hostile_index, tiny_maxsim_dir, tmp_path):
    collection = tmp_path / "collection.tsv"
    blank = {"normal": "", "nbsp": "   ", "zero-width": "\u3000"}  # empty, spaces, an ideographic space
    collection.write_text("".join(f"{docid}\t{blank.get(docid, HOSTILE_DOCUMENTS[docid])}\n" for docid in INDEXED))
    output = tmp_path / "sidecar"
    assert _build(hostile_index, tiny_maxsim_dir, output, "--collection", str(collection), "--dtype", "float32") == 0
    reader = open_sidecar(output)
    assert reader.lengths([0, 1, 2]).tolist() == [2, 2, 2]
    reranker = get_reranker("maxsim", model=tiny_maxsim_dir, sidecar=output)
    for query in ("text editor", "", "   "):
        ranked = reranker.rerank(Query(query), [Text(None, {"docid": docid}) for docid in INDEXED])
        scores = [text.score for text in ranked]
        assert len(scores) == len(INDEXED) and all(math.isfinite(score) for score in scores), (query, scores)
    reranker.close()


@pytest.fixture(scope="module")
def store_models(tokenizer):
    """One tiny random model per family that stores document representations."""
    from pyserini_mores.models._layers import BertDims
    from pyserini_mores.models.dual_encoder import DualEncoder, DualEncoderConfig
    from pyserini_mores.models.mores import MoresConfig, MoresModel
    from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel
    from pyserini_mores.models.tk import TKConfig, TKModel

    dims = BertDims(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)
    torch.manual_seed(0)
    return {
        "maxsim": DualEncoder(DualEncoderConfig(encoder=dims, doc_max_length=MAX_LENGTH), tokenizer),
        "mores-s1": MoresModel(MoresConfig(encoder=dims, doc_max_length=MAX_LENGTH, reuse="s1"), tokenizer),
        "mores-s2": MoresModel(MoresConfig(encoder=dims, doc_max_length=MAX_LENGTH, reuse="s2"), tokenizer),
        "prettr": PreTTRModel(PreTTRConfig(encoder=dims, doc_max_length=MAX_LENGTH), tokenizer),
        "tk": TKModel(TKConfig(embedding_dim=32, vocab_size=len(tokenizer), num_layers=2, num_heads=4, head_dim=8,
                               ffn_dim=16, doc_max_length=MAX_LENGTH), tokenizer),
    }


# "over" is one token too long with [CLS] and [SEP] (PreTTR counts both against its cap, whatever it stores); TK's
# documents carry no special tokens, so only "huge" goes past its cap.
@pytest.mark.parametrize("family, cut", [("maxsim", {"over", "huge"}), ("prettr", {"over", "huge"}),
                                         ("tk", {"huge"})])
def test_truncated_documents_are_counted_in_the_manifest(hostile_index, store_models, family, cut, tmp_path):
    model = store_models[family].eval()
    searcher = open_searcher(hostile_index)
    path = build_module.build_sidecar(searcher, model, tmp_path / family, reranker_name=family, dtype="float32",
                                      batch_size=2, progress=False)
    searcher.close()
    assert open_sidecar(path).manifest.build["truncated_documents"] == len(cut)
    texts = [HOSTILE_DOCUMENTS[docid] for docid in INDEXED]
    judged = build_module._truncated(model, texts, model.tokenize_documents(texts))
    assert {docid for docid, truncated in zip(INDEXED, judged) if truncated} == cut


@pytest.mark.parametrize("family", ["maxsim", "mores-s1", "mores-s2", "prettr", "tk"])
def test_every_model_scores_blank_documents_and_blank_queries_finitely(store_models, family, tmp_path):
    """Through a real sidecar: blank documents (TK stores none of their tokens: length 0), a batch of only blank
    documents (``Lmax`` = 0), and blank queries."""
    model = store_models[family].eval()
    texts = ["", "   ", "\u00a0", "\u200b", "text editor for the terminal", "word " * 100]
    with torch.inference_mode():
        reps = model.encode_documents(model.tokenize_documents(texts))
    docids = [f"d{i}" for i in range(len(texts))]
    model_info = {"model_type": model.model_type, "store_variant": model.store_variant,
                  "fingerprint": model.store_fingerprint()}
    with SidecarWriter(tmp_path / family, dim=model.store_width, dtype="float32", docids=docids, model=model_info,
                       index={"num_docs": len(docids)}) as writer:
        writer.add([rep.float() for rep in reps])
    reader = open_sidecar(tmp_path / family)
    blank_length = 0 if family == "tk" else 1 if family == "prettr" else 2
    assert reader.lengths().tolist()[:4] == [blank_length] * 4
    assert reader.lengths().tolist()[5] == MAX_LENGTH - (1 if family == "prettr" else 0)
    with torch.inference_mode():
        for query in ("text editor", "", " \t "):
            state = model.encode_query(model.tokenize_queries([query]))
            for rows in ([0, 1, 2, 3], [0, 4, 5, 3]):
                scores = model.score(state, *reader.get_batch(rows))
                assert scores.shape == (len(rows),) and torch.isfinite(scores).all(), (query, rows, scores)


# ---- blank queries -------------------------------------------------------------------------------------------------
def test_blank_queries_get_no_hits_like_pyserini(tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    """Pyserini's LuceneSearcher returns no hits for a query without terms; so does the reranking searcher, for one
    query and inside a batch, without calling the reranker on an empty candidate list."""
    lucene = open_searcher(tiny_index)
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=10)
    assert searcher.sidecar_path == maxsim_sidecar
    for query in ("", "   ", "\t", "the of and"):  # the last: only stopwords, no BM25 terms
        assert lucene.search(query, k=10) == []
        hits, stats = searcher.search_with_stats(query, k=10)
        assert hits == [] and (stats.depth, stats.rerank_ms) == (0, 0.0)
    results = searcher.batch_search(["", "text editor", "  "], ["q0", "q1", "q2"], k=5)
    assert results["q0"] == [] and results["q2"] == []
    assert sorted(hit.docid for hit in results["q1"]) == sorted(hit.docid for hit in lucene.search("text editor", 5))
    assert results["q1"]
    searcher.close()
    lucene.close()


def test_cli_runs_queries_without_hits_and_rejects_blank_topic_text(tiny_index, tmp_path, capsys):
    topics = tmp_path / "topics.tsv"
    topics.write_text("q1\ttext editor\nq2\tthe of and\nq3\tweb server\n")
    run = tmp_path / "run.trec"
    assert search_main(["--index", str(tiny_index), "--topics", str(topics), "--output", str(run), "--hits", "3",
                        "--qrels", str(RESOURCES / "tiny_qrels.txt")]) == 0
    assert {line.split()[0] for line in run.read_text().splitlines()} == {"q1", "q3"}, "q2 has no hits, no lines"
    capsys.readouterr()
    topics.write_text("q1\ttext editor\nq2\t   \n")
    assert search_main(["--index", str(tiny_index), "--topics", str(topics), "--output", str(run)]) == 2
    assert f"{topics}, line 2: empty text for query 'q2'" in capsys.readouterr().err


# ---- bytes that are not UTF-8 --------------------------------------------------------------------------------------
LATIN1_LINE = "caf\xe9".encode("latin-1")  # é in Latin-1: 0xE9 starts a 3-byte UTF-8 sequence that never comes
NON_UTF8_FILES = {
    "topics.tsv": (read_topics, b"q1\tone\nq2\ttwo\nq3\t" + LATIN1_LINE + b"\n"),
    "qrels.txt": (read_qrels, b"q1 0 d1 1\nq1 0 d2 0\nq2 0 " + LATIN1_LINE + b" 1\n"),
    "run.trec": (read_run, b"q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\nq1 Q0 " + LATIN1_LINE + b" 3 0.5 t\n"),
    "run.tsv": (read_run, b"q1\td1\t1\nq1\td2\t2\nq1\t" + LATIN1_LINE + b"\t3\n"),
    "collection.tsv": (read_collection, b"d1\tone\nd2\ttwo\nd3\t" + LATIN1_LINE + b"\n"),
    "collection.jsonl": (read_collection, b'{"id": "d1", "contents": "one"}\n{"id": "d2", "contents": "two"}\n'
                                          b'{"id": "d3", "contents": "' + LATIN1_LINE + b'"}\n'),
}


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("name", list(NON_UTF8_FILES))
def test_bytes_that_are_not_utf8_are_an_error_naming_file_line_and_column(tmp_path, name, compressed):
    """Never decoded with replacement: a replaced byte inside an id would silently match nothing."""
    reader, content = NON_UTF8_FILES[name]
    path = tmp_path / (name + ".gz" if compressed else name)
    path.write_bytes(gzip.compress(content) if compressed else content)
    with pytest.raises(FormatError) as caught:
        result = reader(path)
        list(result) if not isinstance(result, dict) else None  # read_collection is lazy
    message = str(caught.value)
    assert message.startswith(f"{path}, line 3: not valid UTF-8 (byte b'\\xe9' at column ")
    assert caught.value.line_number == 3 and "caf\ufffd" in message  # the line is shown, with U+FFFD


def test_cli_names_the_file_and_line_of_a_non_utf8_byte(tiny_index, tmp_path, capsys):
    topics = tmp_path / "topics.tsv"
    topics.write_bytes(b"q1\ttext editor\nq2\t" + LATIN1_LINE + b"\n")
    assert search_main(["--index", str(tiny_index), "--topics", str(topics)]) == 2
    assert f"error: {topics}, line 2: not valid UTF-8 (byte b'\\xe9' at column 7)" in capsys.readouterr().err


# ---- very long and duplicated files ---------------------------------------------------------------------------------
def test_fifty_thousand_topics_and_a_duplicate_on_the_last_line(tmp_path):
    count = 50_000
    lines = [f"{qid}\tquery number {qid} about text editors" for qid in range(count)]
    path = tmp_path / "topics.tsv"
    path.write_text("\n".join(lines) + "\n")
    topics = read_topics(path)
    assert len(topics) == count and list(topics)[:3] == ["0", "1", "2"] and topics["49999"].endswith("editors")

    path.write_text("\n".join(lines) + "\n7\tthe same id again\n")
    with pytest.raises(FormatError) as caught:
        read_topics(path)
    assert str(caught.value) == (f"{path}, line {count + 1}: duplicate query id '7' (first on line 8): "
                                 "'7\\tthe same id again'")

    run = tmp_path / "run.trec"
    hits = {str(qid): [RerankedHit(f"d{qid}-{rank}", 10.0 - rank) for rank in range(3)] for qid in range(count)}
    assert write_run(run, hits) == 3 * count
    read = read_run(run)
    assert len(read) == count and read["49999"] == {"d49999-0": 10.0, "d49999-1": 9.0, "d49999-2": 8.0}


def test_duplicate_queries_in_run_files(tmp_path):
    """A query's lines may come in separate blocks (trec_eval merges them, so do we); the same document twice for a
    query is an error naming both lines; in an MS MARCO run, whose only order is the rank, so is a repeated rank
    (two runs of the same query concatenated)."""
    split = tmp_path / "split.trec"
    split.write_text("q1 Q0 a 1 3.0 t\nq2 Q0 b 1 2.0 t\nq1 Q0 c 2 1.0 t\n")
    assert read_run(split) == {"q1": {"a": 3.0, "c": 1.0}, "q2": {"b": 2.0}}

    twice = tmp_path / "twice.trec"
    twice.write_text("q1 Q0 a 1 3.0 t\nq1 Q0 b 2 2.0 t\nq2 Q0 a 1 1.0 t\nq1 Q0 a 1 3.0 t\n")
    with pytest.raises(FormatError, match=r"twice\.trec, line 4: document 'a' appears twice for query 'q1' "
                                          r"\(first on line 1\)"):
        read_run(twice)

    ranks = tmp_path / "ranks.tsv"
    ranks.write_text("q1\ta\t1\nq1\tb\t2\nq2\ta\t1\nq1\tc\t1\nq1\td\t2\n")
    with pytest.raises(FormatError) as caught:
        read_run(ranks)
    assert str(caught.value) == (f"{ranks}, line 4: rank 1 appears twice for query 'q1' (first on line 1); an MS "
                                 "MARCO run is ordered by rank alone: 'q1\\tc\\t1'")

    with pytest.raises(ValueError, match="query 'q1' appears twice in the results"):
        write_run(tmp_path / "out.trec", [("q1", [RerankedHit("a", 1.0)]), ("q1", [RerankedHit("b", 0.5)])])


# ---- docids the index does not hold ---------------------------------------------------------------------------------
def test_reranking_candidates_that_are_not_in_the_sidecar_is_an_error_counting_them(tiny_maxsim_dir, maxsim_sidecar):
    """Skipping them would evaluate another ranking than the one given; the error counts them and names a few."""
    reranker = get_reranker("maxsim", model=tiny_maxsim_dir, sidecar=maxsim_sidecar)
    candidates = [Text(None, {"docid": docid}) for docid in ("d01", "zz1", "d02", "zz2", "zz3")]
    with pytest.raises(KeyError, match=r"3 candidate\(s\) are not in the sidecar \(e\.g\. zz1, zz2, zz3\)"):
        reranker.rerank(Query("text editor"), candidates)
    reranker.close()


def test_a_run_with_docids_not_in_the_index_is_an_error_counting_them(tiny_index, tmp_path):
    from pyserini_mores.train.dev import gather_dev_candidates

    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d04 1 3.0 t\nq1 Q0 ghost-1 2 2.0 t\nq1 Q0 d05 3 1.0 t\nq1 Q0 ghost-2 4 0.5 t\n")
    with pytest.raises(KeyError) as caught:
        gather_dev_candidates(RESOURCES / "tiny_topics.tsv", RESOURCES / "tiny_qrels.txt", index=tiny_index,
                              run=run, depth=10)
    assert caught.value.args[0] == "2 of 4 documents are not in the index (e.g. ghost-1, ghost-2)"
    searcher = open_searcher(tiny_index)
    assert fetch_texts(searcher, ["d04", "d05"])[0].startswith("Vim")
    searcher.close()


def test_qrels_judging_documents_not_in_the_index_count_as_never_retrieved(tmp_path):
    """As in trec_eval: a judged document nobody could retrieve lowers recall; the qrels are not rejected."""
    from pyserini_mores.eval.metrics import evaluate

    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 d04 1\nq1 0 not-indexed 1\n")
    result = evaluate({"q1": {"d04": 2.0, "d01": 1.0}}, qrels, ["MRR@10", "R@100"])
    assert result.aggregate == {"MRR@10": 1.0, "R@100": 0.5}


# ---- a disk that fills up during a sidecar build ----------------------------------------------------------------------
class FullDisk:
    """A disk with ``free`` bytes left, shared by every file the sidecar writer opens for writing (data files,
    journal, manifest): a write that does not fit writes what fits and raises ENOSPC, as ``write(2)`` does on a full
    disk. ``writes`` records ``(file name, n-th opening of that name, bytes written before, bytes)`` of every write
    that fitted."""

    def __init__(self, free: float = math.inf):
        self.free = free
        self.written = 0
        self.writes: list[tuple[str, int, int, int]] = []
        self.openings: Counter[str] = Counter()

    def open(self, file, mode="r", *args, **kwargs):
        stream = builtins.open(file, mode, *args, **kwargs)
        if not any(flag in mode for flag in "wax+"):
            return stream
        self.openings[Path(file).name] += 1
        return _FillingStream(stream, self, Path(file).name, self.openings[Path(file).name])


class _FillingStream:
    def __init__(self, stream, disk: FullDisk, name: str, opening: int):
        self._stream, self._disk, self._name, self._opening = stream, disk, name, opening

    def write(self, data):
        raw = data.encode("utf-8") if isinstance(data, str) else memoryview(data).cast("B")
        if len(raw) > self._disk.free:
            fits = int(self._disk.free)
            if fits and not isinstance(data, str):
                self._stream.write(raw[:fits])
            self._disk.free = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._disk.writes.append((self._name, self._opening, self._disk.written, len(raw)))
        self._disk.free -= len(raw)
        self._disk.written += len(raw)
        return self._stream.write(data)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self._stream.close()


def _use_disk(monkeypatch, disk: FullDisk) -> None:
    monkeypatch.setattr(writer_module, "open", disk.open, raising=False)
    monkeypatch.setattr(io_module, "open", disk.open, raising=False)  # journal state, manifest, block logs


@pytest.fixture(scope="module")
def uninterrupted_build(tiny_index, tiny_maxsim_dir, tmp_path_factory):
    """A build that had room, and the trace of what it wrote."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(build_module, "WINDOW_BATCHES", 2)  # windows of 4 documents: 5 commits
    disk = FullDisk()
    _use_disk(monkeypatch, disk)
    output = tmp_path_factory.mktemp("disk") / "whole"
    assert _build(tiny_index, tiny_maxsim_dir, output, "--dtype", "float32") == 0
    monkeypatch.undo()
    return output, disk.writes


# The disk fills up halfway through the n-th write to a data file (one write per window of 4 documents), or the
# n-th time the journal's state or the manifest is written (JSON goes out in many small pieces); then the documents
# committed before are kept.
FULL_DURING = [  # (file, "write" or "opening", n, documents committed when the disk is full)
    ("docids.bin", "write", 1, 0),  # before the first commit
    ("tokens.bin", "write", 3, 8),
    ("offsets.bin", "write", 3, 4),  # its first write is the leading 0 offset
    ("state.json.tmp", "opening", 4, 8),  # the first commit is at row 0
    ("manifest.json.tmp", "opening", 1, 20),
]


@pytest.mark.parametrize("file, unit, nth, committed", FULL_DURING,
                         ids=[f"{file}-{unit}-{nth}" for file, unit, nth, _ in FULL_DURING])
def test_a_full_disk_stops_the_build_resumably_and_says_so(tiny_index, tiny_maxsim_dir, uninterrupted_build,
                                                           tmp_path, monkeypatch, capsys, file, unit, nth, committed):
    whole, writes = uninterrupted_build
    if unit == "write":
        _, _, before, size = [write for write in writes if write[0] == file][nth - 1]
    else:
        pieces = [write for write in writes if write[:2] == (file, nth)]
        before, size = pieces[0][2], sum(piece[3] for piece in pieces)
    monkeypatch.setattr(build_module, "WINDOW_BATCHES", 2)  # the same command as the uninterrupted build
    output = tmp_path / "sidecar"
    with monkeypatch.context() as full:
        _use_disk(full, FullDisk(free=before + size // 2))
        assert _build(tiny_index, tiny_maxsim_dir, output, "--dtype", "float32") == 2
    error = capsys.readouterr().err
    partial = tmp_path / "sidecar.partial"
    assert f"error: the disk is full: writing {partial}" in error and "No space left on device" in error
    assert f"free space on its disk and run the same build again to resume it" in error
    assert not output.exists() and partial.is_dir()
    with pytest.raises(Exception, match="incomplete build"):
        SidecarReader(output)
    state = partial / "_journal" / "state.json"
    assert (json.loads(state.read_text())["rows_done"] if state.exists() else 0) == committed
    encoded = []
    real_encode = build_module._encode_window
    monkeypatch.setattr(build_module, "_encode_window",
                        lambda model, texts, *rest: encoded.append(len(texts)) or real_encode(model, texts, *rest))

    # Space was freed (the context above ended): the same command resumes.
    assert _build(tiny_index, tiny_maxsim_dir, output, "--dtype", "float32") == 0
    assert verify_sidecar(output) == [] and not partial.exists()
    assert sum(encoded) == 20 - committed, "committed documents are kept, not encoded again"
    resumed, reference = (json.loads((path / "manifest.json").read_text()) for path in (output, whole))
    for manifest in (resumed, reference):
        del manifest["created"], manifest["build"]["encode_seconds"], manifest["manifest_sha256"]
    assert resumed == reference
    for data_file in format_module.DATA_FILES:
        assert (output / data_file).read_bytes() == (whole / data_file).read_bytes(), data_file


def test_a_full_disk_during_a_direct_write_keeps_committed_documents(tmp_path, monkeypatch):
    docs = [np.full((length, 4), length, np.float32) for length in (3, 0, 5, 2, 4, 1)]
    options = dict(dim=4, docids=[f"d{i}" for i in range(6)], model={"model_type": "maxsim", "store_variant": "s",
                   "fingerprint": "ab" * 32}, index={"num_docs": 6})
    disk = FullDisk()
    _use_disk(monkeypatch, disk)
    writer = SidecarWriter(tmp_path / "sidecar", **options)
    writer.add(docs[:2])
    disk.free = 10  # the next tokens (5 × 4 float16 = 40 bytes) do not fit
    with pytest.raises(writer_module.SidecarDiskFullError) as caught:
        writer.add(docs[2:4])
    assert isinstance(caught.value, OSError) and caught.value.errno == errno.ENOSPC
    assert str(caught.value).startswith(f"the disk is full: writing {tmp_path / 'sidecar.partial' / 'tokens.bin'} "
                                        "failed (No space left on device)")
    with pytest.raises(Exception, match="create a new writer to resume"):
        writer.add(docs[2:4])
    monkeypatch.undo()
    writer = SidecarWriter(tmp_path / "sidecar", **options)
    assert writer.rows_done == 2
    writer.add(docs[2:])
    reader = open_sidecar(writer.finalize())
    assert reader.lengths().tolist() == [3, 0, 5, 2, 4, 1]
    assert [float(reader.get(row).max()) for row in (0, 2, 5)] == [3.0, 5.0, 1.0]


# ---- checkpoint directories with missing files -----------------------------------------------------------------------
@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"])
def test_a_checkpoint_missing_a_file_names_it(tiny_maxsim_dir, tmp_path, missing):
    """Without tokenizer.json, transformers would quietly build a 5-token vocabulary (every word [UNK]); without
    tokenizer_config.json, a tokenizer without lower-casing. Both must fail, not load a different model."""
    from pyserini_mores.models import load_model

    broken = tmp_path / "checkpoint"
    shutil.copytree(tiny_maxsim_dir, broken)
    assert (broken / missing).is_file()
    (broken / missing).unlink()
    with pytest.raises(FileNotFoundError) as caught:
        load_model("maxsim", broken)
    assert missing in str(caught.value) and str(broken) in str(caught.value)
    with pytest.raises(FileNotFoundError, match=missing):
        get_reranker("maxsim", model=broken)


# ---- concurrent readers and a sidecar replaced under them -------------------------------------------------------------
@pytest.fixture(scope="module")
def big_sidecar(tmp_path_factory) -> Path:
    rng = np.random.default_rng(7)
    num_docs, dim = 3000, 16
    lengths = rng.integers(0, 90, size=num_docs)
    path = tmp_path_factory.mktemp("concurrent") / "sidecar"
    with SidecarWriter(path, dim=dim, docids=[f"doc{i}" for i in range(num_docs)], index={"num_docs": num_docs},
                       model={"model_type": "maxsim", "store_variant": "s", "fingerprint": "cd" * 32}) as writer:
        for start in range(0, num_docs, 500):
            writer.add([rng.standard_normal((length, dim)).astype(np.float32) for length in lengths[start:start + 500]])
    return path


def test_concurrent_readers_in_other_processes_read_what_one_process_reads(big_sidecar):
    """Several processes open the same sidecar at once and read random batches; every document they read equals
    what this process reads through ``get_batch``."""
    from _concurrent_reads import random_reads

    seeds = [11, 12, 13]
    # spawn, not fork: forking a process that may already run a JVM (other tests start one) can deadlock.
    with multiprocessing.get_context("spawn").Pool(len(seeds)) as pool:
        parallel = pool.map_async(random_reads, [(str(big_sidecar), seed, 20) for seed in seeds]).get(timeout=300)
    reader = SidecarReader(big_sidecar)
    for seed, reads in zip(seeds, parallel):
        assert reads == random_reads((str(big_sidecar), seed, 20)), seed
        for rows, documents in reads:
            docs, lengths = reader.get_batch(rows, dtype=None)
            assert [docs[i, :length].numpy().tobytes() for i, length in enumerate(lengths.tolist())] == documents
        assert sum(len(rows) for rows, _ in reads) > 300


def test_a_sidecar_replaced_after_open_is_never_mixed_with_the_old_manifest(tmp_path):
    """An open reader keeps the files it mapped; a file it had not mapped yet belongs to the new build now, so it
    refuses to map it (the manifest it holds describes the old one) instead of reading the new vectors as old."""
    def write(seed: int, lengths: list[int]) -> Path:
        rng = np.random.default_rng(seed)
        with SidecarWriter(tmp_path / "sidecar", dim=4, docids=["a", "b", "c"], index={"num_docs": 3},
                           model={"model_type": "maxsim", "store_variant": "s", "fingerprint": "ef" * 32},
                           overwrite=True) as writer:
            writer.add([rng.standard_normal((length, 4)).astype(np.float32) for length in lengths])
        return tmp_path / "sidecar"

    path = write(0, [2, 3, 1])
    mapped, unmapped = SidecarReader(path), SidecarReader(path)
    before, _ = mapped.get_batch([0, 1, 2])
    write(1, [2, 3, 1])  # same shapes, other vectors: only the identity of the files tells them apart
    after, _ = mapped.get_batch([0, 1, 2])
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    with pytest.raises(SidecarCorruptError, match=r"sidecar .*sidecar was replaced after it was opened "
                                                  r"\(offsets\.bin is another file now\); open it again"):
        unmapped.get_batch([0])
    fresh, _ = SidecarReader(path).get_batch([0, 1, 2])
    assert not torch.equal(fresh, before)


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps")
def test_token_vectors_are_mapped_for_random_access(big_sidecar):
    """Candidates are scattered rows: without MADV_RANDOM each page fault of a cold read also pulls the device's
    readahead window (8 MiB here): a cold fetch of 1000 candidates of a 1M-document sidecar read 6.4 GB, not 30 MB."""
    reader = SidecarReader(big_sidecar)
    reader.get_batch([0, 2999])
    lines = Path("/proc/self/smaps").read_text().splitlines()
    tokens = os.path.realpath(big_sidecar / "tokens.bin")
    start = next(i for i, line in enumerate(lines) if line.endswith(tokens))
    flags = next(line for line in lines[start + 1:] if line.startswith("VmFlags:"))
    assert "rr" in flags.split(), flags  # rr: the kernel's flag for MADV_RANDOM
    reader.close()
