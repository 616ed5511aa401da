"""Property-based tests (hypothesis): what the topics, qrels and run writers write, the readers read back, for any ids
and texts the formats can hold, and anything else is refused when written; the sidecar store gives back exactly the
ragged float16 matrices and docids written to it, whatever their shapes, batching, and an interruption on the way."""
from __future__ import annotations

import gc
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pyserini_mores.formats import (
    read_qrels,
    read_run,
    read_topics,
    results_to_run,
    write_qrels,
    write_run,
    write_topics,
)
from pyserini_mores.sidecar import SidecarReader, SidecarWriter, verify_sidecar
from pyserini_mores.types import RerankedHit

# Files go to tmp_path_factory directories (one per example); the example database would write into the repository.
FAST = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Any character but surrogates (not UTF-8 encodable), in ids without whitespace (fields are whitespace-separated).
characters = st.characters(blacklist_categories=("Cs",))
ids = st.text(characters, min_size=1, max_size=10).filter(
    lambda value: not any(char.isspace() for char in value) and not value.startswith("\ufeff"))
texts = st.text(characters, min_size=1, max_size=40).filter(
    lambda value: value.strip() and not set(value) & {"\t", "\n", "\r"})
LINE_BREAKS = ["\t", "\n", "\r"]


def _file(tmp_path_factory, name: str):
    return tmp_path_factory.mktemp("prop") / name


# ---- topics ------------------------------------------------------------------------------------------------------
@FAST
@given(topics=st.dictionaries(ids, texts, min_size=1, max_size=20))
def test_topics_round_trip(tmp_path_factory, topics):
    path = _file(tmp_path_factory, "topics.tsv")
    assert write_topics(path, topics) == len(topics)
    # The reader strips whitespace around a text (a TSV cell's padding is not part of the query).
    assert list(read_topics(path).items()) == [(qid, text.strip()) for qid, text in topics.items()]


@FAST
@given(qid=ids, text=texts, breaker=st.sampled_from(LINE_BREAKS), where=st.integers(0, 40))
def test_topics_writer_refuses_tabs_and_line_breaks_in_texts(tmp_path_factory, qid, text, breaker, where):
    broken = text[:where] + breaker + text[where:]
    path = _file(tmp_path_factory, "topics.tsv")
    with pytest.raises(ValueError, match=rf"text of query {_re(qid)} contains a tab or a line break"):
        write_topics(path, {qid: broken})
    assert not path.exists(), "nothing is written when a topic is refused"


@FAST
@given(text=texts, qid=st.one_of(st.just(""), ids.map(lambda value: value + " x"), ids.map(lambda v: "\ufeff" + v)))
def test_topics_writer_refuses_ids_that_would_not_read_back(tmp_path_factory, qid, text):
    with pytest.raises(ValueError, match=r"query id .* cannot be written to a topics file"):
        write_topics(_file(tmp_path_factory, "topics.tsv"), {qid: text})


def test_topics_writer_refuses_blank_texts_and_repeated_ids(tmp_path):
    with pytest.raises(ValueError, match=r"text of query 'q1' is blank"):
        write_topics(tmp_path / "t.tsv", {"q1": " \u3000 "})
    with pytest.raises(ValueError, match=r"query 'q1' appears twice in the topics"):
        write_topics(tmp_path / "t.tsv", [("q1", "a"), ("q1", "b")])


# ---- qrels -------------------------------------------------------------------------------------------------------
@FAST
@given(qrels=st.dictionaries(ids, st.dictionaries(ids, st.integers(-3, 10 ** 12), min_size=1, max_size=8),
                             min_size=1, max_size=8))
def test_qrels_round_trip(tmp_path_factory, qrels):
    path = _file(tmp_path_factory, "qrels.txt")
    assert write_qrels(path, qrels) == sum(map(len, qrels.values()))
    read = read_qrels(path)
    assert read == qrels and list(read) == list(qrels)
    assert all(list(read[qid]) == list(qrels[qid]) for qid in qrels), "file order is kept"


@FAST
@given(qid=ids, docid=ids, space=st.sampled_from([" ", "\t", "\n", "\u3000", "\x1c"]),
       relevance=st.one_of(st.floats(allow_nan=True), st.booleans(), st.text(max_size=3)))
def test_qrels_writer_refuses_what_would_not_read_back(tmp_path_factory, qid, docid, space, relevance):
    path = _file(tmp_path_factory, "qrels.txt")
    with pytest.raises(ValueError, match=r"docid .* cannot be written to a qrels file: it is empty or contains "
                                         r"whitespace"):
        write_qrels(path, {qid: {docid + space + docid: 1}})
    with pytest.raises(ValueError, match=rf"relevance of document {_re(docid)} for query {_re(qid)} must be an int"):
        write_qrels(path, {qid: {docid: relevance}})
    assert not path.exists()


# ---- runs --------------------------------------------------------------------------------------------------------
scores = st.floats(allow_nan=False, allow_infinity=True, width=64)
rankings = st.dictionaries(ids, st.dictionaries(ids, scores, min_size=1, max_size=10), min_size=1, max_size=8)


@FAST
@given(ranking=rankings, output_format=st.sampled_from(["trec", "msmarco"]))
def test_run_round_trip(tmp_path_factory, ranking, output_format):
    results = {qid: [RerankedHit(docid, score) for docid, score in hits.items()] for qid, hits in ranking.items()}
    path = _file(tmp_path_factory, "run.txt")
    assert write_run(path, results, output_format=output_format) == sum(map(len, ranking.values()))
    read = read_run(path)
    expected = results_to_run(results, output_format=output_format)
    assert read == expected and list(read) == list(ranking)
    for qid, hits in ranking.items():
        assert list(read[qid]) == list(hits), "file order is kept"
        if output_format == "trec":  # scores are written with 6 decimals
            assert all(read[qid][docid] == float(f"{score:.6f}") for docid, score in hits.items())
        else:  # an MS MARCO run has ranks only: its score is -rank
            assert list(read[qid].values()) == [-float(rank) for rank in range(1, len(hits) + 1)]


@FAST
@given(qid=ids, docid=ids, space=st.sampled_from([" ", "\t", "\n", "\u2028"]))
def test_run_writer_refuses_whitespace_in_ids_and_nan_scores(tmp_path_factory, qid, docid, space):
    path = _file(tmp_path_factory, "run.txt")
    with pytest.raises(ValueError, match=r"docid .* cannot be written to a run file: it is empty or contains "
                                         r"whitespace"):
        write_run(path, {qid: [RerankedHit(docid + space, 1.0)]})
    with pytest.raises(ValueError, match=r"query id .* cannot be written to a run file"):
        write_run(path, {space + qid: [RerankedHit(docid, 1.0)]})
    with pytest.raises(ValueError, match=rf"score of document {_re(docid)} for query {_re(qid)} is NaN"):
        write_run(path, {qid: [RerankedHit(docid, math.nan)]})
    assert not path.exists()


def _re(value: str) -> str:
    import re

    return re.escape(repr(value))


# ---- the sidecar store -------------------------------------------------------------------------------------------
@st.composite
def sidecar_contents(draw):
    """Docids, one ``[len_i, dim]`` float16 matrix each (any finite value, ``len_i`` 0 included), the sizes of the
    batches they are added in, and optionally the batch after which the writing process dies."""
    dim = draw(st.integers(1, 4))
    docids = draw(st.lists(st.text(docid_characters, min_size=1, max_size=8), min_size=1, max_size=12, unique=True))
    matrices = [draw(hnp.arrays(np.uint16, (draw(st.integers(0, 5)), dim), elements=finite_float16_bits)).view(np.float16)
                for _ in docids]
    batches, left = [], len(docids)
    while left:
        batches.append(draw(st.integers(1, left)))
        left -= batches[-1]
    dies_after = draw(st.one_of(st.none(), st.integers(0, len(batches) - 1)))
    return docids, matrices, batches, dies_after


# Bit patterns of every finite float16 of either sign (0x7C00 and above are inf and NaN): -0.0 and subnormals too.
finite_float16_bits = st.integers(0, 0x7BFF) | st.integers(0x8000, 0xFBFF)
docid_characters = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")  # see the test below
MODEL = {"model_type": "maxsim", "store_variant": "default", "fingerprint": "0f" * 32}


@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(contents=sidecar_contents(), commit_every=st.integers(1, 4))
def test_sidecar_round_trip(tmp_path_factory, contents, commit_every):
    docids, matrices, batches, dies_after = contents
    path = tmp_path_factory.mktemp("sidecar") / "sidecar"
    options = dict(dim=matrices[0].shape[1], dtype="float16", docids=docids, model=MODEL,
                   index={"num_docs": len(docids)}, block_bytes=64, commit_every_docs=commit_every)
    writer = SidecarWriter(path, **options)
    start = 0
    for number, size in enumerate(batches):
        writer.add(matrices[start:start + size])
        start += size
        if number == dies_after:
            del writer  # the process dies: no close, no finalize; a new one resumes from the last commit
            gc.collect()
            writer = SidecarWriter(path, **options)
            assert writer.rows_done <= start
            for resumed in range(writer.rows_done, start):
                writer.add(matrices[resumed:resumed + 1])
    writer.finalize()

    assert verify_sidecar(path) == []
    reader = SidecarReader(path, expect_dtype="float16", expect_dim=options["dim"])
    assert reader.num_docs == len(docids) and reader.num_tokens == sum(len(matrix) for matrix in matrices)
    assert reader.lengths().tolist() == [len(matrix) for matrix in matrices]
    assert reader.docids(range(len(docids))) == docids
    assert reader.rows_for_docids(docids).tolist() == list(range(len(docids)))
    absent = [docid for docid in (docids[0] + "\u2603", docids[0][:-1], "") if docid not in docids]
    assert reader.rows_for_docids(absent).tolist() == [-1] * len(absent)
    for row, matrix in enumerate(matrices):  # bit for bit: -0.0 and subnormals included
        np.testing.assert_array_equal(reader.get(row).view(np.uint16), matrix.view(np.uint16))
    rows = list(range(len(docids)))[::-1] + [0]
    batch, lengths = reader.get_batch(rows, dtype=None)
    for i, row in enumerate(rows):
        stored = batch[i, :lengths[i]].numpy()
        np.testing.assert_array_equal(stored.view(np.uint16), matrices[row].view(np.uint16))
        assert not batch[i, lengths[i]:].any()


@pytest.mark.parametrize("docid", ["ab\x00", "\x00", "a\x00b"])
def test_sidecar_writer_refuses_docids_it_cannot_store(tmp_path, docid):
    """Fixed-width numpy bytes drop trailing NULs: such a docid would come back as another one."""
    with pytest.raises(ValueError, match=r"docid .* contains a NUL character, which the sidecar cannot store"):
        SidecarWriter(tmp_path / "s", dim=2, docids=["x", docid], model=MODEL, index={"num_docs": 2})
