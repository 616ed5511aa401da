"""Topics, qrels, run and collection readers and writers: good input, bad lines (exact line numbers), round trip."""
from __future__ import annotations

import gzip
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from pyserini_mores.formats import (
    FormatError,
    format_run_lines,
    read_collection,
    read_qrels,
    read_ranked_run,
    read_run,
    read_topics,
    results_to_run,
    write_run,
)
from pyserini_mores.types import RerankedHit

RESOURCES = Path(__file__).parent / "resources"


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_bytes(text.encode("utf-8"))
    return path


def error_of(reader, path: Path) -> FormatError:
    with pytest.raises(FormatError) as caught:
        result = reader(path)
        if not isinstance(result, dict):  # read_collection is lazy
            list(result)
    return caught.value


# ----------------------------------------------------------------------------------------------------------- topics


def test_read_topics_keeps_order_and_text():
    assert read_topics(RESOURCES / "tiny_topics.tsv") == {
        "q1": "text editor",
        "q2": "web server reverse proxy",
        "q3": "python scientific arrays",
        "q4": "database engine in a single file",
    }
    assert list(read_topics(RESOURCES / "tiny_topics.tsv")) == ["q1", "q2", "q3", "q4"]


def test_read_topics_tolerates_crlf_bom_and_trailing_blank_lines(tmp_path):
    path = write(tmp_path, "q.tsv", "\ufeff1\tfirst query\r\n2\tsecond query\r\n\r\n  \n\n")
    assert read_topics(path) == {"1": "first query", "2": "second query"}


@pytest.mark.parametrize("bad_line, fragment", [
    ("q3 no tab here", "found no tab"),
    ("\tan empty id", "empty query id"),
    ("q3\t   ", "empty text for query 'q3'"),
    ("q3\ttext\textra", "found 3 tab-separated fields"),
])
def test_read_topics_reports_malformed_line(tmp_path, bad_line, fragment):
    path = write(tmp_path, "queries.tsv", f"q1\tone\nq2\ttwo\n{bad_line}\nq4\tfour\n")
    error = error_of(read_topics, path)
    assert isinstance(error, ValueError)
    assert "queries.tsv, line 3: " in str(error)
    assert fragment in str(error)
    assert error.line_number == 3
    assert repr(bad_line) in str(error)  # the offending line is shown


def test_read_topics_duplicate_names_both_lines(tmp_path):
    path = write(tmp_path, "queries.tsv", "q1\tone\nq2\ttwo\nq3\tthree\nq2\tagain\n")
    message = str(error_of(read_topics, path))
    assert "line 4" in message and "first on line 2" in message and "'q2'" in message


def test_read_topics_interior_blank_line_is_an_error(tmp_path):
    path = write(tmp_path, "queries.tsv", "q1\tone\n\nq2\ttwo\n")
    error = error_of(read_topics, path)
    assert error.line_number == 2 and "blank line" in str(error)


def test_read_topics_undecodable_bytes_name_the_line(tmp_path):
    path = write(tmp_path, "queries.tsv", b"q1\tone\nq2\tcaf\xe9 latin-1\nq3\tthree\n")
    error = error_of(read_topics, path)
    assert "line 2" in str(error) and "UTF-8" in str(error) and "column 7" in str(error)


def test_long_offending_lines_are_truncated(tmp_path):
    path = write(tmp_path, "queries.tsv", "q1 " + "x" * 500 + "\n")
    message = str(error_of(read_topics, path))
    assert "line 1" in message and "..." in message and len(message) < 250


# ------------------------------------------------------------------------------------------------------------ qrels


def test_read_qrels_space_and_tab_separated(tmp_path):
    assert read_qrels(RESOURCES / "tiny_qrels.txt") == {
        "q1": {"d04": 1, "d05": 1}, "q2": {"d08": 1}, "q3": {"d20": 1}, "q4": {"d07": 1}}
    path = write(tmp_path, "qrels.tsv", "1\t0\t7\t2\n1\t0\t8\t0\n2 Q0 9 -1\n")
    assert read_qrels(path) == {"1": {"7": 2, "8": 0}, "2": {"9": -1}}


@pytest.mark.parametrize("bad_line, fragment", [
    ("q2 0 d9", "found 3 fields"),
    ("q2 0 d9 1 extra", "found 5 fields"),
    ("q2 0 d9 1.5", "relevance '1.5' is not an integer"),
    ("q2 0 d9 yes", "relevance 'yes' is not an integer"),
])
def test_read_qrels_reports_malformed_line(tmp_path, bad_line, fragment):
    path = write(tmp_path, "qrels.txt", f"q1 0 d1 1\nq1 0 d2 0\n{bad_line}\n")
    error = error_of(read_qrels, path)
    assert "qrels.txt, line 3: " in str(error) and fragment in str(error)


def test_read_qrels_duplicate_names_both_lines(tmp_path):
    path = write(tmp_path, "qrels.txt", "q1 0 d1 1\nq1 0 d2 0\nq2 0 d1 1\nq1 0 d1 0\n")
    message = str(error_of(read_qrels, path))
    assert "line 4" in message and "first on line 1" in message


# ------------------------------------------------------------------------------------------------------------- runs


def test_read_trec_run(tmp_path):
    path = write(tmp_path, "run.trec", "q1 Q0 d1 1 12.5 bm25\nq1 Q0 d2 2 -3e-1 bm25\nq2 Q0 d1 1 7 bm25\n")
    assert read_run(path) == {"q1": {"d1": 12.5, "d2": -0.3}, "q2": {"d1": 7.0}}


def test_read_msmarco_run_scores_are_minus_rank(tmp_path):
    path = write(tmp_path, "run.tsv", "1048585\t7187158\t1\n1048585\t7187157\t2\n2\t5\t1\n")
    run = read_run(path)
    assert run == {"1048585": {"7187158": -1.0, "7187157": -2.0}, "2": {"5": -1.0}}
    # Sorting by score reproduces the file's order.
    assert sorted(run["1048585"], key=run["1048585"].get, reverse=True) == ["7187158", "7187157"]


def test_run_format_is_detected_per_file(tmp_path):
    trec = write(tmp_path, "a.txt", "q1 Q0 d1 1 2.0 t\n")
    msmarco = write(tmp_path, "b.txt", "q1\td1\t1\n")
    assert read_run(trec) == {"q1": {"d1": 2.0}}
    assert read_run(msmarco) == {"q1": {"d1": -1.0}}
    # A forced format overrides detection.
    assert "expected 6 fields" in str(error_of(lambda p: read_run(p, run_format="trec"), msmarco))


def test_run_mixing_formats_names_line_and_detection(tmp_path):
    path = write(tmp_path, "run.trec", "q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\nq1 Q0 d3 3 0.5 t\nq2\td1\t1\n")
    message = str(error_of(read_run, path))
    assert "run.trec, line 4: " in message and "detected from line 1" in message and "found 3" in message


@pytest.mark.parametrize("bad_line, fragment", [
    ("q1 Q0 d9 two 1.0 t", "rank 'two' is not an integer"),
    ("q1 Q0 d9 3 high t", "score 'high' is not a number"),
    ("q1 Q0 d9 3 nan t", "score is NaN"),
    ("q1 Q0 d9 3", "found 4"),
])
def test_read_run_reports_malformed_line(tmp_path, bad_line, fragment):
    path = write(tmp_path, "run.trec", f"q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\n{bad_line}\n")
    error = error_of(read_run, path)
    assert "line 3: " in str(error) and fragment in str(error)


def test_read_run_first_line_in_no_known_format(tmp_path):
    path = write(tmp_path, "run.txt", "q1 d1 1 2.0\n")
    error = error_of(read_run, path)
    assert error.line_number == 1 and "neither a TREC" in str(error)


def test_read_run_duplicate_document_names_both_lines(tmp_path):
    path = write(tmp_path, "run.tsv", "q1\td1\t1\nq1\td2\t2\nq2\td1\t1\nq1\td1\t3\n")
    message = str(error_of(read_run, path))
    assert "line 4" in message and "first on line 1" in message


def test_read_gzipped_run(tmp_path):
    path = tmp_path / "run.trec.gz"
    path.write_bytes(gzip.compress(b"q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\n"))
    assert read_run(path) == {"q1": {"d1": 2.0, "d2": 1.0}}


# ------------------------------------------------------------------------------------------------- run order


def docids_in_order(path: Path, **options) -> dict[str, list[str]]:
    return {qid: [docid for docid, _ in hits] for qid, hits in read_ranked_run(path, **options).items()}


def test_ranked_run_follows_the_rank_column_even_against_the_scores(tmp_path):
    # Lines shuffled; q1's rank column puts d3 (lowest score) first and d1 (highest) last; ranks start at 0 and
    # have a gap. trec_eval would rank q1 d1, d2, d3.
    path = write(tmp_path, "run.trec", "q1 Q0 d2 5 2.0 t\nq2 Q0 x 1 1.0 t\nq1 Q0 d1 9 3.0 t\nq1 Q0 d3 0 1.0 t\n")
    assert read_ranked_run(path) == {"q1": [("d3", 1.0), ("d2", 2.0), ("d1", 3.0)], "q2": [("x", 1.0)]}
    assert read_run(path) == {"q1": {"d2": 2.0, "d1": 3.0, "d3": 1.0}, "q2": {"x": 1.0}}  # scores, in file order


def test_ranked_run_breaks_equal_ranks_by_score_then_docid_descending(tmp_path):
    # Rank 2 three times: its documents by score, the two of equal score by docid descending ("b" before "ab").
    # The document ranked 3 has the highest score and still comes last.
    path = write(tmp_path, "run.trec", "q1 Q0 ab 2 1.0 t\nq1 Q0 top 1 0.5 t\nq1 Q0 last 3 9.0 t\n"
                                       "q1 Q0 b 2 1.0 t\nq1 Q0 c 2 2.0 t\n")
    assert docids_in_order(path) == {"q1": ["top", "c", "b", "ab", "last"]}
    # A rank column that says nothing (the same rank on every line): trec_eval's order, score then docid.
    constant = write(tmp_path, "constant.trec", "q1 Q0 a 0 1.0 t\nq1 Q0 c 0 2.0 t\nq1 Q0 ab 0 1.0 t\n"
                                                "q1 Q0 b 0 1.0 t\n")
    assert docids_in_order(constant) == {"q1": ["c", "b", "ab", "a"]}


def test_ranked_msmarco_run_follows_its_ranks_whatever_the_line_order(tmp_path):
    path = write(tmp_path, "run.tsv", "q1\td3\t3\nq1\td1\t1\nq2\te1\t1\nq1\td2\t2\n")
    assert read_ranked_run(path) == {"q1": [("d1", -1.0), ("d2", -2.0), ("d3", -3.0)], "q2": [("e1", -1.0)]}
    assert docids_in_order(path, run_format="msmarco") == {"q1": ["d1", "d2", "d3"], "q2": ["e1"]}


@pytest.mark.parametrize("name, text, message", [
    ("run.trec", "q1 Q0 d1 1 2.0 t\nq1 Q0 d2 1.5 1.0 t\n",
     "line 2: rank '1.5' is not an integer: 'q1 Q0 d2 1.5 1.0 t'"),
    ("run.trec", "q1 Q0 d1 1 2.0 t\nq1 Q0 d2 - 1.0 t\n",
     "line 2: rank '-' is not an integer: 'q1 Q0 d2 - 1.0 t'"),
    ("run.trec", "q1 Q0 d1 1 2.0 t\nq1 Q0 d2 9223372036854775808 1.0 t\n",
     "line 2: rank '9223372036854775808' is out of range (a 64-bit integer): "
     "'q1 Q0 d2 9223372036854775808 1.0 t'"),
    ("run.tsv", "q1\td1\t1\nq1\td2\tsecond\n", "line 2: rank 'second' is not an integer: 'q1\\td2\\tsecond'"),
    ("run.tsv", "q1\td1\t1\nq1\td2\t-9223372036854775809\n",
     "line 2: rank '-9223372036854775809' is out of range (a 64-bit integer): "
     "'q1\\td2\\t-9223372036854775809'"),
    ("run.tsv", "q1\td1\t2\nq2\td1\t1\nq1\td2\t1\nq1\td3\t2\n",
     "line 4: rank 2 appears twice for query 'q1' (first on line 1); an MS MARCO run is ordered by rank "
     "alone: 'q1\\td3\\t2'"),
])
def test_malformed_rank_columns_are_errors_naming_the_line(tmp_path, name, text, message):
    path = write(tmp_path, name, text)
    for reader in (read_run, read_ranked_run):
        assert str(error_of(reader, path)) == f"{path}, {message}"


# ---------------------------------------------------------------------------------------------------------- writing


RESULTS = [
    ("q1", [RerankedHit("d3", 2.5), RerankedHit("d1", 1.0000004), RerankedHit("d2", -0.25)]),
    ("q2", [SimpleNamespace(docid="d9", score=7)]),
]


def test_trec_lines_match_pyserini_writer():
    assert list(format_run_lines(RESULTS, tag="mores")) == [
        "q1 Q0 d3 1 2.500000 mores",
        "q1 Q0 d1 2 1.000000 mores",
        "q1 Q0 d2 3 -0.250000 mores",
        "q2 Q0 d9 1 7.000000 mores",
    ]
    assert list(format_run_lines(dict(RESULTS), output_format="msmarco")) == [
        "q1\td3\t1", "q1\td1\t2", "q1\td2\t3", "q2\td9\t1"]


@pytest.mark.parametrize("output_format", ["trec", "msmarco"])
def test_write_read_round_trip(tmp_path, output_format):
    path = tmp_path / "nested" / "dir" / f"run.{output_format}"
    assert write_run(path, iter(RESULTS), output_format=output_format) == 4
    run = read_run(path)
    assert {qid: list(docs) for qid, docs in run.items()} == {"q1": ["d3", "d1", "d2"], "q2": ["d9"]}
    assert run == results_to_run(RESULTS, output_format=output_format)
    if output_format == "trec":
        assert run["q1"] == {"d3": 2.5, "d1": 1.0, "d2": -0.25}
        assert path.read_text().endswith("q2 Q0 d9 1 7.000000 pyserini_mores\n")
    # Not the 0600 of the temporary file.
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_write_run_is_atomic_when_results_fail(tmp_path):
    path = write(tmp_path, "run.trec", "old contents\n")

    def failing_results():
        yield RESULTS[0]
        raise RuntimeError("reranker crashed")

    with pytest.raises(RuntimeError):
        write_run(path, failing_results())
    assert path.read_text() == "old contents\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run.trec"]


@pytest.mark.parametrize("results, fragment", [
    ([("q 1", [RerankedHit("d1", 1.0)])], "query id 'q 1'"),
    ([("q1", [RerankedHit("d\t1", 1.0)])], "docid 'd\\t1'"),
    ([("q1", [RerankedHit("d1", 1.0), RerankedHit("d1", 0.5)])], "appears twice"),
    ([("q1", [RerankedHit("d1", 1.0)]), ("q1", [])], "query 'q1' appears twice"),
])
def test_write_run_rejects_what_would_corrupt_the_file(tmp_path, results, fragment):
    with pytest.raises(ValueError) as caught:
        write_run(tmp_path / "run.trec", results)
    assert fragment in str(caught.value)
    assert not (tmp_path / "run.trec").exists()


def test_write_run_rejects_unknown_format(tmp_path):
    with pytest.raises(ValueError, match="output_format"):
        write_run(tmp_path / "run.txt", RESULTS, output_format="kilt")


# ------------------------------------------------------------------------------------------------------ collections


def test_read_jsonl_collection():
    documents = list(read_collection(RESOURCES / "tiny_collection.jsonl"))
    assert documents[0][0] == "d01" and documents[0][1].startswith("apt is the command-line package manager")
    assert len(documents) == len((RESOURCES / "tiny_collection.jsonl").read_text().splitlines())


def test_read_tsv_collection_plain_and_gzipped(tmp_path):
    text = "0\tThe presence of communication amid scientific minds.\n1\tThe Manhattan Project.\n"
    plain = write(tmp_path, "collection.tsv", text)
    compressed = tmp_path / "collection.tsv.gz"
    compressed.write_bytes(gzip.compress(text.encode()))
    expected = [("0", "The presence of communication amid scientific minds."), ("1", "The Manhattan Project.")]
    assert list(read_collection(plain)) == expected
    assert list(read_collection(compressed)) == expected


def test_collection_layout_detected_from_first_line(tmp_path):
    json_lines = write(tmp_path, "docs.txt", '{"id": 7, "contents": "seven", "title": "ignored"}\n')
    tsv = write(tmp_path, "docs2.txt", "7\tseven\n")
    compressed = tmp_path / "docs3.gz"
    compressed.write_bytes(gzip.compress(b'{"id": "a", "contents": "x"}\n'))
    assert list(read_collection(json_lines)) == [("7", "seven")]
    assert list(read_collection(tsv)) == [("7", "seven")]
    assert list(read_collection(compressed)) == [("a", "x")]


def test_read_collection_directory_in_name_order(tmp_path):
    write(tmp_path, "b.jsonl", '{"id": "b1", "contents": "B"}\n')
    write(tmp_path, "a.jsonl", '{"id": "a1", "contents": "A"}\n{"id": "a2", "contents": "AA"}\n')
    write(tmp_path, "notes.md", "not a collection file")
    assert [docid for docid, _ in read_collection(tmp_path)] == ["a1", "a2", "b1"]


@pytest.mark.parametrize("name, text, line_number, fragment", [
    ("c.jsonl", '{"id": "1", "contents": "a"}\n{"id": "2", "contents": \n', 2, "invalid JSON"),
    ("c.jsonl", '{"id": "1", "contents": "a"}\n{"id": "2", "contents": "b"}\n{"id": "3"}\n', 3, "'contents'"),
    ("c.jsonl", '{"contents": "a"}\n', 1, "'id'"),
    ("c.jsonl", '["1", "a"]\n', 1, "JSON object"),
    ("c.json", '[{"id": "1",\n', 1, "JSON array is not supported"),
    ("c.tsv", "1\ta\n2 no tab\n", 2, "expected 'docid<TAB>text', found no tab"),
    ("c.tsv", "1\ta\n2\tb\n\tc\n", 3, "empty docid"),
])
def test_read_collection_reports_malformed_line(tmp_path, name, text, line_number, fragment):
    error = error_of(read_collection, write(tmp_path, name, text))
    assert f"{name}, line {line_number}: " in str(error) and fragment in str(error)


def test_truncated_gzip_collection_is_a_format_error(tmp_path):
    data = gzip.compress(("\n".join(f"{i}\tpassage {i}" for i in range(2000)) + "\n").encode())
    path = tmp_path / "collection.tsv.gz"
    path.write_bytes(data[: len(data) // 2])
    error = error_of(read_collection, path)
    assert "truncated or corrupt" in str(error) and error.line_number > 1


def test_missing_collection_fails_before_iteration(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_collection(tmp_path / "absent.jsonl")
