"""An interrupted ``search --output FILE`` resumes from ``FILE.partial``: the resumed run is the uninterrupted one byte
for byte, with the same metrics, and only the queries not yet searched are searched again; a partial search of other
inputs is refused with the difference named, and kept as it was."""
from __future__ import annotations

import pytest

from pyserini_mores.search import partial
from pyserini_mores.search.__main__ import main as search_main
from pyserini_mores.search.partial import identity_differences, partial_directory
from pyserini_mores.search.searcher import RerankingSearcher

from conftest import QUERIES, RESOURCES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QRELS = RESOURCES / "tiny_qrels.txt"
TOPICS = dict(list(QUERIES.items())[:10])
INTERRUPTED_AT = 6  # the query whose rerank is interrupted: five are searched before it


@pytest.fixture
def topics(tmp_path):
    path = tmp_path / "topics.tsv"
    path.write_text("".join(f"{qid}\t{text}\n" for qid, text in TOPICS.items()))
    return path


@pytest.fixture
def reranked(monkeypatch):
    """The queries reranked, in order; ``reranked.interrupt_at = N`` makes the N-th rerank a Ctrl-C."""
    calls = []
    rerank_hits = RerankingSearcher.rerank_hits

    def counted(self, query, hits, *args, **kwargs):
        calls.append(query)
        if len(calls) == getattr(counted, "interrupt_at", None):
            raise KeyboardInterrupt
        return rerank_hits(self, query, hits, *args, **kwargs)

    monkeypatch.setattr(RerankingSearcher, "rerank_hits", counted)
    counted.calls = calls
    return counted


@pytest.fixture
def search(tiny_index, tiny_maxsim_dir, maxsim_sidecar, topics):
    def search(output, *extra, topics_file=topics):
        return search_main(["--index", str(tiny_index), "--topics", str(topics_file), "--reranker", "maxsim",
                            "--model", str(tiny_maxsim_dir), "--rerank-depth", "10", "--hits", "10",
                            "--qrels", str(QRELS), "--output", str(output), *extra])
    return search


def metrics_and_count(printed: str) -> tuple[str, str]:
    """The metrics table (what follows the rerank time line) and the number of queries the times cover."""
    timing, table = printed.split("Rerank time per query", 1)[1].split("\n", 1)
    return table, timing.rsplit("over", 1)[1]


def interrupt(search, reranked, output, capsys) -> None:
    reranked.interrupt_at = INTERRUPTED_AT
    with pytest.raises(KeyboardInterrupt):
        search(output)
    capsys.readouterr()
    reranked.interrupt_at = None
    reranked.calls.clear()


@pytest.mark.parametrize("chunk_seconds, chunks", [(0.0, INTERRUPTED_AT - 1), (3600.0, 1)])
def test_an_interrupted_search_resumes_to_the_run_of_an_uninterrupted_one(search, reranked, tmp_path, capsys,
                                                                          monkeypatch, chunk_seconds, chunks):
    """A chunk per query (every query is kept as it is searched), or one chunk (the Ctrl-C writes what the chunk's
    time had gathered): either way the resumed search searches only the other queries and writes the same run."""
    whole = tmp_path / "whole.trec"
    assert search(whole) == 0
    expected = metrics_and_count(capsys.readouterr().out)
    assert len(reranked.calls) == len(TOPICS)
    reranked.calls.clear()

    monkeypatch.setattr(partial, "CHUNK_SECONDS", chunk_seconds)
    output = tmp_path / "resumed.trec"
    interrupt(search, reranked, output, capsys)
    assert not output.exists()
    assert len(list(partial_directory(output).glob("chunk-*.json"))) == chunks

    assert search(output) == 0
    printed = capsys.readouterr().out
    assert f"{INTERRUPTED_AT - 1} of {len(TOPICS)} queries already searched" in printed
    assert reranked.calls == list(TOPICS.values())[INTERRUPTED_AT - 1:], "only the queries not kept are searched"
    assert output.read_bytes() == whole.read_bytes()
    assert metrics_and_count(printed) == expected, "metrics and times cover every query, kept ones too"
    assert " 10 queries" in expected[1]
    assert not partial_directory(output).exists(), "the partial search is removed once the run is written"


def test_a_partial_search_of_other_inputs_is_refused_and_kept(search, reranked, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(partial, "CHUNK_SECONDS", 0.0)
    output = tmp_path / "run.trec"
    interrupt(search, reranked, output, capsys)
    directory = partial_directory(output)
    kept = {path.name: path.read_bytes() for path in directory.iterdir()}

    assert search(output, "--rerank-depth", "5") == 2
    error = capsys.readouterr().err
    assert f"{directory} holds an interrupted search with other inputs (arguments.rerank_depth: 10 → 5)" in error
    assert "run the command that started it to finish it, or add --restart to discard it" in error

    other_topics = tmp_path / "other-topics.tsv"
    other_topics.write_text("".join(f"{qid}\t{text.upper()}\n" for qid, text in TOPICS.items()))
    assert search(output, topics_file=other_topics) == 2
    assert "(topics: " in capsys.readouterr().err

    assert reranked.calls == [] and not output.exists()
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == kept, "a refused run changes nothing"

    assert search(output, "--restart") == 0
    assert len(reranked.calls) == len(TOPICS), "--restart searches every query again"
    assert output.exists() and not directory.exists()


def test_restart_needs_an_output_and_a_foreign_partial_directory_is_refused(search, tiny_index, tmp_path, capsys):
    assert search_main(["--index", str(tiny_index), "--topics", str(RESOURCES / "tiny_topics.tsv"),
                        "--restart"]) == 2
    assert "--restart discards an interrupted search's FILE.partial: it goes with --output FILE" in \
        capsys.readouterr().err

    output = tmp_path / "run.trec"
    partial_directory(output).mkdir()
    (partial_directory(output) / "notes.txt").write_text("mine")
    assert search(output) == 2
    assert f"{partial_directory(output)} is not an interrupted search of this command (no readable identity.json" \
        in capsys.readouterr().err
    assert (partial_directory(output) / "notes.txt").read_text() == "mine"


def test_identity_differences_name_each_differing_value_by_its_dotted_name():
    stored = {"arguments": {"hits": 10, "precision": "auto"}, "topics": "ab12", "model": "f00"}
    asked = {"arguments": {"hits": 10, "precision": "bf16"}, "topics": "ab12", "run": "0c"}
    assert identity_differences(stored, asked) == [
        'arguments.precision: "auto" → "bf16"', 'model: "f00" → null', 'run: null → "0c"']
    assert identity_differences(stored, stored) == []
