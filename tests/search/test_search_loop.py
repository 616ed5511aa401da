"""One search loop: every query goes through ``RerankingSearcher.rerank_hits``, which keeps nothing of the query on the
searcher. So ``batch_search`` on several threads writes the run of one thread, byte for byte, each query's
``RerankStats`` are its own, and the search command writes the run ``batch_search`` gives."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from pyserini_mores.formats import write_run
from pyserini_mores.search import RerankingSearcher, RerankStats
from pyserini_mores.search.__main__ import main as search_main
from pyserini_mores.search.calibration import Calibration

from conftest import QUERIES, RESOURCES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOPICS = RESOURCES / "tiny_topics.tsv"
SEARCHERS = {
    # depth = every BM25 hit, so a depth reported for the wrong query shows
    "sidecar": {"rerank_depth": 20},
    # the rerank stage fetches text from Lucene on the pool's threads
    "text": {"rerank_depth": 7, "sidecar": None},
    # depth from a time budget (3 candidates), the rest of the 10 hits in BM25 order below; without the deadline,
    # whose cut depends on the machine's load and so is not reproducible run to run
    "budget": {"rerank_depth": 20, "time_budget_ms": 13.5, "enforce_deadline": False,
               "calibration": Calibration(fixed_ms=10.0, per_candidate_ms=1.0)},
}


@pytest.fixture(scope="module", params=sorted(SEARCHERS))
def searcher(request, tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, **SEARCHERS[request.param])
    assert (searcher.sidecar_path is None) == (request.param == "text")
    yield searcher
    searcher.close()


def run_bytes(results: dict, path) -> bytes:
    write_run(path, results, tag="loop")
    return path.read_bytes()


def test_batch_search_on_threads_writes_the_run_of_one_thread(searcher, tmp_path):
    qids, queries = list(QUERIES), list(QUERIES.values())
    one = searcher.batch_search(queries, qids, k=10, threads=1)
    assert list(one) == qids
    expected = run_bytes(one, tmp_path / "one.trec")
    assert len(expected.splitlines()) > 20
    for threads in (2, 3):
        several = searcher.batch_search(queries, qids, k=10, threads=threads)
        assert list(several) == qids, "results come in the order of the qids"
        assert run_bytes(several, tmp_path / f"{threads}.trec") == expected


def test_each_query_gets_its_own_stats(searcher):
    qids, queries = list(QUERIES), list(QUERIES.values())
    alone = {qid: searcher.search_with_stats(query, k=10) for qid, query in QUERIES.items()}
    batch = searcher.batch_search_with_stats(queries, qids, k=10, threads=2)
    assert list(batch) == qids
    for qid in qids:
        (hits, stats), (expected_hits, expected) = batch[qid], alone[qid]
        assert isinstance(stats, RerankStats)
        assert (stats.candidates, stats.depth) == (expected.candidates, expected.depth), qid
        assert [(h.docid, h.score) for h in hits] == [(h.docid, h.score) for h in expected_hits], qid
        assert (stats.rerank_ms > 0) == (stats.depth > 0), qid
    depths = {stats.depth for _, stats in batch.values()}
    assert len(depths) > 1 and 0 in depths, "the queries differ in depth, so a mix-up would show"


def test_concurrent_callers_of_one_searcher_get_their_own_results(searcher):
    """Several threads calling ``search_with_stats`` at once, each query many times."""
    expected = {query: searcher.search_with_stats(query, k=10) for query in QUERIES.values()}

    def search(query: str):
        try:
            return query, searcher.search_with_stats(query, k=10)
        finally:
            from jnius import detach  # a thread that called into the JVM leaves it

            detach()

    with ThreadPoolExecutor(max_workers=4) as pool:
        for query, (hits, stats) in pool.map(search, list(QUERIES.values()) * 3):
            expected_hits, expected_stats = expected[query]
            assert [(h.docid, h.score) for h in hits] == [(h.docid, h.score) for h in expected_hits], query
            assert (stats.candidates, stats.depth) == (expected_stats.candidates, expected_stats.depth), query


def test_search_command_writes_the_run_of_batch_search(tiny_index, tiny_maxsim_dir, maxsim_sidecar, tmp_path):
    """The command reranks through the same per-query path as the library; ``--bm25`` (Pyserini's flag for the
    first stage this package always uses) changes nothing."""
    topics = dict(line.split("\t") for line in TOPICS.read_text().splitlines())
    command_run = tmp_path / "command.trec"
    assert search_main(["--index", str(tiny_index), "--topics", str(TOPICS), "--output", str(command_run),
                        "--hits", "10", "--reranker", "maxsim", "--model", str(tiny_maxsim_dir),
                        "--rerank-depth", "5", "--batch-size", "3", "--bm25"]) == 0
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=5, require_sidecar=True)
    library = searcher.batch_search(list(topics.values()), list(topics), k=10)
    searcher.close()
    write_run(tmp_path / "library.trec", library, tag="pyserini_mores-maxsim")
    assert command_run.read_bytes() == (tmp_path / "library.trec").read_bytes()
