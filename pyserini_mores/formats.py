"""Readers and writers for the MS MARCO / TREC text formats: topics, qrels, runs and document collections.

Pure Python (no pyserini, no JVM), so evaluation and training-data loading work without Java. Every reader reports a
bad line as a :class:`FormatError` naming the file and the 1-based line number; readers accept gzip-compressed files
(recognised by their magic bytes) and a UTF-8 byte-order mark. Blank lines at the end of a file are ignored; a blank
line followed by more data is an error, because it usually means two files were concatenated or one was truncated.

Files must be UTF-8. A byte sequence that is not is a :class:`FormatError` naming the file, the line and the column,
never decoded with replacement: a replaced character inside a docid or qid would make it silently match nothing.
"""
from __future__ import annotations

import gzip
import itertools
import json
import logging
import math
import numbers
import os
import re
import zlib
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal, Union

from ._io import atomic_writer

logger = logging.getLogger(__name__)

__all__ = [
    "FormatError",
    "read_topics",
    "read_qrels",
    "read_run",
    "read_ranked_run",
    "read_collection",
    "numbered_lines",
    "write_run",
    "write_topics",
    "write_qrels",
    "format_run_lines",
    "results_to_run",
    "atomic_writer",
]

PathLike = Union[str, "os.PathLike[str]"]
RunFormat = Literal["trec", "msmarco"]
RUN_FORMATS: tuple[str, ...] = ("trec", "msmarco")

_GZIP_MAGIC = b"\x1f\x8b"
_SHOWN_CHARS = 80  # longer offending lines are truncated in error messages
_WHITESPACE = re.compile(r"\s")
_RANK_MIN, _RANK_MAX = -(2**63), 2**63 - 1  # what read_ranked_run keeps a rank in


class FormatError(ValueError):
    """A malformed line (or file) in a topics, qrels, run or collection file.

    Attributes:
        path: the file, as given.
        line_number: 1-based line number of the problem, or ``None`` when it concerns the whole file.
        line: the offending line (untruncated), if any.
    """

    def __init__(self, path: PathLike, line_number: int | None, message: str, line: str | None = None):
        self.path = os.fspath(path)
        self.line_number = line_number
        self.line = line
        location = self.path if line_number is None else f"{self.path}, line {line_number}"
        text = f"{location}: {message}"
        if line is not None:
            text += f": {_shorten(line)!r}"
        super().__init__(text)


def _shorten(line: str) -> str:
    return line if len(line) <= _SHOWN_CHARS else line[: _SHOWN_CHARS - 3] + "..."


def _open_binary(path: PathLike) -> IO[bytes]:
    """The file's bytes, decompressed when it starts with the gzip magic (whatever its name)."""
    with open(path, "rb") as probe:
        compressed = probe.read(2) == _GZIP_MAGIC
    return gzip.open(path, "rb") if compressed else open(path, "rb")


def numbered_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, line without its end of line)`` for every non-blank line of a UTF-8 text file.

    The line rules of every reader here (see the module docstring: gzip, byte-order mark, UTF-8, blank lines), for
    readers of other line formats (training triples) to share.

    Raises:
        FormatError: bad UTF-8, a blank line followed by more data, or truncated or corrupt gzip data.
    """
    blank_line: int | None = None
    line_number = 0
    with _open_binary(path) as stream:
        try:
            for line_number, raw in enumerate(stream, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise FormatError(
                        path, line_number,
                        f"not valid UTF-8 (byte {raw[error.start:error.start + 1]!r} at column {error.start + 1})",
                        raw.decode("utf-8", errors="replace").rstrip("\r\n"),
                    ) from None
                if line_number == 1 and line.startswith("\ufeff"):
                    line = line[1:]
                line = line.rstrip("\r\n")
                if not line.strip():
                    if blank_line is None:
                        blank_line = line_number
                    continue
                if blank_line is not None:
                    raise FormatError(path, blank_line, "blank line in the middle of the file "
                                                        "(only blank lines at the end are allowed)")
                yield line_number, line
        except (EOFError, zlib.error, gzip.BadGzipFile) as error:
            raise FormatError(path, line_number + 1, f"compressed data is truncated or corrupt ({error})") from None


def _fields_at(line: str, *indices: int) -> tuple[str | None, ...]:
    fields = line.split()
    return tuple(fields[index] if index < len(fields) else None for index in indices)


def _first_line_where(path: PathLike, predicate) -> int | None:
    """Line number of the first line satisfying ``predicate(line)``.

    Used only to report duplicates: rescanning the file on error is cheaper than remembering the line of each of the
    millions of entries in an MS MARCO run.
    """
    for line_number, line in numbered_lines(path):
        if predicate(line):
            return line_number
    return None


# --------------------------------------------------------------------------------------------------------- topics


def read_topics(path: PathLike) -> dict[str, str]:
    """Read a ``qid<TAB>text`` file (MS MARCO ``queries.*.tsv``).

    Args:
        path: the TSV file (optionally gzipped).

    Returns:
        Query id → query text, in file order. Surrounding whitespace of ids and texts is removed.

    Raises:
        FormatError: a line without exactly one tab, with an empty id or text, a duplicate id, or bad UTF-8.
    """
    topics: dict[str, str] = {}
    first_line: dict[str, int] = {}  # topics are small: remembering lines for duplicate messages is cheap
    for line_number, line in numbered_lines(path):
        fields = line.split("\t")
        if len(fields) != 2:
            found = "no tab" if len(fields) == 1 else f"{len(fields)} tab-separated fields"
            raise FormatError(path, line_number, f"expected 'qid<TAB>text', found {found}", line)
        qid, text = fields[0].strip(), fields[1].strip()
        if not qid:
            raise FormatError(path, line_number, "empty query id", line)
        if not text:
            raise FormatError(path, line_number, f"empty text for query {qid!r}", line)
        if qid in topics:
            raise FormatError(path, line_number, f"duplicate query id {qid!r} (first on line {first_line[qid]})",
                              line)
        topics[qid] = text
        first_line[qid] = line_number
    return topics


# ---------------------------------------------------------------------------------------------------------- qrels


def read_qrels(path: PathLike) -> dict[str, dict[str, int]]:
    """Read TREC qrels: ``qid iteration docid relevance`` separated by any whitespace.

    The iteration field (usually ``0``) is ignored, as trec_eval does.

    Returns:
        Query id → {docid → relevance}, in file order (the shape pytrec_eval takes).

    Raises:
        FormatError: a line without 4 fields, a non-integer relevance, a duplicate (qid, docid), or bad UTF-8.
    """
    qrels: dict[str, dict[str, int]] = {}
    for line_number, line in numbered_lines(path):
        fields = line.split()
        if len(fields) != 4:
            raise FormatError(path, line_number, "expected 'qid iteration docid relevance' (4 fields), "
                                                 f"found {len(fields)} field{'s' if len(fields) != 1 else ''}", line)
        qid, _, docid, relevance_text = fields
        try:
            relevance = int(relevance_text)
        except ValueError:
            raise FormatError(path, line_number, f"relevance {relevance_text!r} is not an integer", line) from None
        judgments = qrels.setdefault(qid, {})
        if docid in judgments:
            first = _first_line_where(path, lambda other: _fields_at(other, 0, 2) == (qid, docid))
            raise FormatError(path, line_number, f"duplicate judgment for query {qid!r}, document {docid!r} "
                                                 f"(first on line {first})", line)
        judgments[docid] = relevance
    return qrels


# ----------------------------------------------------------------------------------------------------------- runs


def _detect_run_format(fields: Sequence[str]) -> RunFormat | None:
    if len(fields) == 6:
        return "trec"
    if len(fields) == 3:
        return "msmarco"
    return None


def read_run(path: PathLike, *, run_format: RunFormat | None = None) -> dict[str, dict[str, float]]:
    """Read a TREC run (``qid Q0 docid rank score tag``) or an MS MARCO run (``qid<TAB>docid<TAB>rank``) as scores.

    The format is detected from the first line (6 fields → TREC, 3 → MS MARCO) and every other line must match it.
    MS MARCO runs carry no score, so the score is ``-rank``: higher is better, and sorting by score reproduces the
    rank order. The rank column is checked but not returned: :func:`read_ranked_run` reads a run in its order.

    Args:
        path: the run file (optionally gzipped).
        run_format: ``"trec"`` or ``"msmarco"`` to skip detection.

    Returns:
        Query id → {docid → score}, in file order (the shape pytrec_eval takes).

    Raises:
        FormatError: wrong field count, a rank that is not a 64-bit integer, non-numeric or NaN score, a docid
            repeated within a query, a rank repeated within a query of an MS MARCO run (its only order), or bad
            UTF-8. A query's lines need not be contiguous (trec_eval merges them too).
    """
    return _read_run(path, run_format)


def read_ranked_run(path: PathLike, *, run_format: RunFormat | None = None) -> dict[str, list[tuple[str, float]]]:
    """A run file (as :func:`read_run` reads and checks it) as each query's ranking: qid → ``[(docid, score), ...]``,
    best first. This is the package's one rule for the order of a run file:

    - **The rank column, ascending.** It is the order the run's producer states, and the one MS MARCO's official
      ``msmarco_eval.py`` evaluates (it puts each docid at position ``rank``). Only the order of the ranks counts:
      they may start at 0 or 1 and have gaps.
    - **Equal ranks** (which only a TREC run can have; in an MS MARCO run they are an error): higher score first, then
      docid in decreasing order, as trec_eval orders them. A TREC run whose rank column says nothing (the same rank
      on every line, as some tools write) is thus ranked exactly as trec_eval ranks it.

    The ranking depends on the lines alone, not on their order in the file: a run whose lines were shuffled or whose
    queries are interleaved reads the same. Queries come in file order.

    trec_eval, pytrec_eval and Pyserini's ``trec_eval`` ignore the rank column: they order by score, then docid, both
    decreasing. Their order differs from this one where the rank column contradicts the scores, or orders documents
    of equal score (frequent after rounding to a TREC file's 6 decimals) other than by decreasing docid: a metric
    pytrec_eval computes from the scores can then differ from the same metric over this ranking (MRR@10 of
    :mod:`pyserini_mores.eval.metrics`, which follows this ranking, against trec_eval's ``recip_rank``).

    Raises:
        FormatError: as :func:`read_run`.
    """
    ranks: dict[str, array] = {}
    return {qid: _in_rank_order(hits, ranks[qid])
            for qid, hits in _read_run(path, run_format, ranks).items()}


def _read_run(path: PathLike, run_format: RunFormat | None,
              ranks: dict[str, array] | None = None) -> dict[str, dict[str, float]]:
    """qid → {docid → score} in file order; with ``ranks``, also each query's ranks in the same order into it."""
    if run_format is not None and run_format not in RUN_FORMATS:
        raise ValueError(f"run_format must be one of {RUN_FORMATS}, not {run_format!r}")
    run: dict[str, dict[str, float]] = {}
    detected_on: int | None = None
    for line_number, line in numbered_lines(path):
        fields = line.split()
        if run_format is None:
            run_format = _detect_run_format(fields)
            detected_on = line_number
            if run_format is None:
                raise FormatError(path, line_number, "neither a TREC run line ('qid Q0 docid rank score tag', "
                                                     "6 fields) nor an MS MARCO one ('qid docid rank', 3 fields)",
                                  line)
        expected = 6 if run_format == "trec" else 3
        if len(fields) != expected:
            origin = f"detected from line {detected_on}" if detected_on is not None else "as requested"
            layout = "'qid Q0 docid rank score tag'" if run_format == "trec" else "'qid<TAB>docid<TAB>rank'"
            raise FormatError(path, line_number, f"expected {expected} fields {layout} of a {run_format} run "
                                                 f"({origin}), found {len(fields)}", line)
        if run_format == "trec":
            qid, _, docid, rank_text, score_text, _ = fields
        else:
            qid, docid, rank_text = fields
            score_text = None
        try:
            rank = int(rank_text)
        except ValueError:
            raise FormatError(path, line_number, f"rank {rank_text!r} is not an integer", line) from None
        if not _RANK_MIN <= rank <= _RANK_MAX:
            raise FormatError(path, line_number, f"rank {rank_text!r} is out of range (a 64-bit integer)", line)
        if score_text is None:
            score = -float(rank)
        else:
            try:
                score = float(score_text)
            except ValueError:
                raise FormatError(path, line_number, f"score {score_text!r} is not a number", line) from None
            if math.isnan(score):
                # NaN compares false with everything, so the ranking it implies would be arbitrary.
                raise FormatError(path, line_number, "score is NaN", line)
        hits = run.setdefault(qid, {})
        if docid in hits:
            docid_field = 2 if run_format == "trec" else 1
            first = _first_line_where(path, lambda other: _fields_at(other, 0, docid_field) == (qid, docid))
            raise FormatError(path, line_number, f"document {docid!r} appears twice for query {qid!r} "
                                                 f"(first on line {first})", line)
        hits[docid] = score
        if ranks is not None:
            # 8 bytes a rank rather than an int object and a pointer: the millions of lines of an MS MARCO run add up.
            (ranks.get(qid) or ranks.setdefault(qid, array("q"))).append(rank)
    if run_format == "msmarco":
        # Checked once per query at the end (a transient set of its scores, which are -rank) rather than per line,
        # which would keep a set of ranks for each of the millions of lines of an MS MARCO run.
        tied = {qid for qid, hits in run.items() if len(set(hits.values())) < len(hits)}
        if tied:
            _raise_repeated_rank(path, tied)
    return run


def _in_rank_order(hits: dict[str, float], ranks: array) -> list[tuple[str, float]]:
    """``hits`` (in file order) ordered as :func:`read_ranked_run` says; ``ranks[i]`` is the rank of the i-th hit."""
    entries = list(hits.items())
    if all(earlier < later for earlier, later in itertools.pairwise(ranks)):  # the usual case: a sorted file
        return entries
    order = sorted(range(len(entries)), key=lambda index: (ranks[index], _trec_eval_order(entries[index])))
    return [entries[index] for index in order]


def _trec_eval_order(hit: tuple[str, float]) -> tuple[float, tuple[int, ...]]:
    docid, score = hit
    # Decreasing docid as a key of an ascending sort: its code points negated (a prefix sorts after a longer docid,
    # as in trec_eval's strcmp order reversed).
    return -score, tuple(-ord(character) for character in docid) + (1,)


def _raise_repeated_rank(path: PathLike, qids: set[str]) -> None:
    """Raise the :class:`FormatError` of the first line of an MS MARCO run that repeats a rank of one of ``qids``."""
    first_line: dict[tuple[str, int], int] = {}
    for line_number, line in numbered_lines(path):
        qid, _, rank_text = line.split()
        if qid not in qids:
            continue
        key = (qid, int(rank_text))
        if key in first_line:
            raise FormatError(path, line_number, f"rank {key[1]} appears twice for query {qid!r} (first on line "
                                                 f"{first_line[key]}); an MS MARCO run is ordered by rank alone", line)
        first_line[key] = line_number


def _check_token(kind: str, value: str, file_kind: str = "run file") -> str:
    # A space or tab inside an id would shift every later field of the line and corrupt the file silently.
    if not value or _WHITESPACE.search(value):
        raise ValueError(f"{kind} {value!r} cannot be written to a {file_kind}: it is empty or contains whitespace")
    if value.startswith("\ufeff"):
        raise ValueError(f"{kind} {value!r} cannot be written to a {file_kind}: it starts with U+FEFF, which readers "
                         "take for a byte-order mark on the first line")
    return value


def _iter_results(results: Mapping[str, Sequence[Any]] | Iterable[tuple[str, Sequence[Any]]]):
    return results.items() if isinstance(results, Mapping) else results


def format_run_lines(
    results: Mapping[str, Sequence[Any]] | Iterable[tuple[str, Sequence[Any]]],
    *,
    output_format: RunFormat = "trec",
    tag: str = "pyserini_mores",
) -> Iterator[str]:
    """Yield the lines (without newline) of a run file, as Pyserini's output writers format them.

    Args:
        results: ``(qid, hits)`` pairs, or a mapping qid → hits (what ``batch_search`` returns). A hit has
            ``.docid`` and ``.score``; hits are ranked 1..n in list order.
        output_format: ``"trec"`` (``qid Q0 docid rank score tag``, score with 6 decimals) or ``"msmarco"``
            (``qid<TAB>docid<TAB>rank``).
        tag: the run tag of TREC lines.

    Raises:
        ValueError: an unknown format, an id or tag containing whitespace, a query given twice, a docid
            repeated within a query (trec_eval rejects such files), or a NaN score.
    """
    if output_format not in RUN_FORMATS:
        raise ValueError(f"output_format must be one of {RUN_FORMATS}, not {output_format!r}")
    if output_format == "trec":
        _check_token("run tag", tag)
    seen_queries: set[str] = set()
    for qid, hits in _iter_results(results):
        qid = _check_token("query id", str(qid))
        if qid in seen_queries:
            raise ValueError(f"query {qid!r} appears twice in the results")
        seen_queries.add(qid)
        seen_docs: set[str] = set()
        for rank, hit in enumerate(hits, start=1):
            docid = str(hit.docid)
            if docid in seen_docs:
                raise ValueError(f"document {docid!r} appears twice in the results of query {qid!r}")
            seen_docs.add(_check_token("docid", docid))
            if output_format == "trec":
                score = float(hit.score)
                if math.isnan(score):  # read_run refuses it: NaN would make the ranking arbitrary
                    raise ValueError(f"score of document {docid!r} for query {qid!r} is NaN")
                yield f"{qid} Q0 {docid} {rank} {score:.6f} {tag}"
            else:
                yield f"{qid}\t{docid}\t{rank}"


def write_run(
    path: PathLike,
    results: Mapping[str, Sequence[Any]] | Iterable[tuple[str, Sequence[Any]]],
    *,
    output_format: RunFormat = "trec",
    tag: str = "pyserini_mores",
) -> int:
    """Write a run file atomically (see :func:`format_run_lines` for the arguments and line layout).

    ``results`` may be a generator: lines are written as they come, and the file only appears once all are written.

    Returns:
        The number of lines (hits) written.
    """
    count = 0
    with atomic_writer(path) as stream:
        for line in format_run_lines(results, output_format=output_format, tag=tag):
            stream.write(line)
            stream.write("\n")
            count += 1
    logger.info("wrote %d hits to %s (%s format)", count, path, output_format)
    return count


def write_topics(path: PathLike, topics: Mapping[str, str] | Iterable[tuple[str, str]]) -> int:
    """Write a ``qid<TAB>text`` topics file atomically; :func:`read_topics` reads it back (texts stripped).

    Returns:
        The number of topics written.

    Raises:
        ValueError: a query id that is empty or contains whitespace, a blank text or one with a tab or a line break,
            or a query given twice: what the file could not hold as given.
    """
    seen: set[str] = set()
    with atomic_writer(path) as stream:
        for qid, text in _iter_results(topics):
            qid = _check_token("query id", str(qid), "topics file")
            if qid in seen:
                raise ValueError(f"query {qid!r} appears twice in the topics")
            seen.add(qid)
            if not text.strip():
                raise ValueError(f"text of query {qid!r} is blank")
            if "\t" in text or "\n" in text or "\r" in text:
                raise ValueError(f"text of query {qid!r} contains a tab or a line break: {_shorten(text)!r}")
            stream.write(f"{qid}\t{text}\n")
    return len(seen)


def write_qrels(path: PathLike, qrels: Mapping[str, Mapping[str, int]]) -> int:
    """Write TREC qrels (``qid 0 docid relevance``) atomically; :func:`read_qrels` reads them back.

    Returns:
        The number of judgments written.

    Raises:
        ValueError: an id that is empty or contains whitespace, or a relevance that is not an int.
    """
    count = 0
    with atomic_writer(path) as stream:
        for qid, judgments in qrels.items():
            qid = _check_token("query id", str(qid), "qrels file")
            for docid, relevance in judgments.items():
                docid = _check_token("docid", str(docid), "qrels file")
                if isinstance(relevance, bool) or not isinstance(relevance, numbers.Integral):
                    raise ValueError(f"relevance of document {docid!r} for query {qid!r} must be an int, not "
                                     f"{relevance!r}")
                stream.write(f"{qid} 0 {docid} {relevance}\n")
                count += 1
    return count


def results_to_run(
    results: Mapping[str, Sequence[Any]] | Iterable[tuple[str, Sequence[Any]]],
    *,
    output_format: RunFormat = "trec",
) -> dict[str, dict[str, float]]:
    """The run :func:`read_run` would return for the file :func:`write_run` would write, without the file.

    Scores are rounded to the 6 decimals of a TREC file (or replaced by ``-rank`` for MS MARCO), so metrics computed
    in memory equal those computed from the written file even when scores tie after rounding.
    """
    run: dict[str, dict[str, float]] = {}
    for line in format_run_lines(results, output_format=output_format):
        if output_format == "trec":
            qid, _, docid, _, score, _ = line.split(" ")
            run.setdefault(qid, {})[docid] = float(score)
        else:
            qid, docid, rank = line.split("\t")
            run.setdefault(qid, {})[docid] = -float(rank)
    return run


# ---------------------------------------------------------------------------------------------------- collections

_COLLECTION_SUFFIXES = (".jsonl", ".json", ".tsv")


def _collection_format_from_name(path: Path) -> str | None:
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".tsv"):
        return "tsv"
    return None


def read_collection(path: PathLike) -> Iterator[tuple[str, str]]:
    """Iterate over ``(docid, text)`` of a document collection.

    Accepted layouts: MS MARCO TSV (``pid<TAB>text``), or JSON lines with ``id`` and ``contents`` (Pyserini's
    JsonCollection; other fields are ignored), each optionally gzipped. The layout is chosen by extension
    (``.tsv``, ``.jsonl``, ``.json``, each optionally ``.gz``), else by whether the first line starts with ``{``.
    A directory is read as Pyserini reads a JsonCollection: its collection files in name order. Duplicate docids are
    not detected (that would mean holding every id of an 8.8M-passage collection in memory).

    Raises:
        FileNotFoundError: immediately, when ``path`` does not exist.
        FormatError: during iteration, for a malformed line or bytes that are not UTF-8 (with its line number).
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(child for child in path.iterdir() if child.is_file() and not child.name.startswith(".")
                       and child.name.removesuffix(".gz").endswith(_COLLECTION_SUFFIXES))
        if not files:
            raise FileNotFoundError(f"{path}: no collection files in directory (*.jsonl, *.json, *.tsv, or .gz)")
    elif path.exists():
        files = [path]
    else:
        raise FileNotFoundError(f"{path}: no such collection file or directory")
    return _iter_collection_files(files)


def _iter_collection_files(files: list[Path]) -> Iterator[tuple[str, str]]:
    for file in files:
        yield from _iter_collection_file(file)


def _iter_collection_file(path: Path) -> Iterator[tuple[str, str]]:
    collection_format = _collection_format_from_name(path)
    for line_number, line in numbered_lines(path):
        if collection_format is None:
            collection_format = "jsonl" if line.lstrip().startswith("{") else "tsv"
            logger.debug("%s: read as %s (from its first line)", path, collection_format)
        if collection_format == "jsonl":
            yield _parse_json_document(path, line_number, line)
        else:
            fields = line.split("\t")
            if len(fields) != 2:
                found = "no tab" if len(fields) == 1 else f"{len(fields)} tab-separated fields"
                raise FormatError(path, line_number, f"expected 'docid<TAB>text', found {found}", line)
            docid = fields[0].strip()
            if not docid:
                raise FormatError(path, line_number, "empty docid", line)
            yield docid, fields[1]


def _parse_json_document(path: Path, line_number: int, line: str) -> tuple[str, str]:
    # Pyserini also reads .json files holding one JSON array; that cannot be streamed line by line, so say so.
    hint = " (a JSON array is not supported: write one document per line)" if (
        line_number == 1 and line.lstrip().startswith("[")) else ""
    try:
        document = json.loads(line)
    except json.JSONDecodeError as error:
        raise FormatError(path, line_number, f"invalid JSON: {error.msg} at column {error.colno}{hint}", line) \
            from None
    if not isinstance(document, dict):
        raise FormatError(path, line_number, f"expected a JSON object with 'id' and 'contents'{hint}", line)
    docid = document.get("id")
    # bool is an int subclass; an id of `true` is surely a mistake.
    if isinstance(docid, bool) or not isinstance(docid, (str, int)) or str(docid).strip() == "":
        raise FormatError(path, line_number, "missing or invalid 'id' (a non-empty string or an integer)", line)
    contents = document.get("contents")
    if not isinstance(contents, str):
        raise FormatError(path, line_number, "missing 'contents' string", line)
    return str(docid).strip(), contents
