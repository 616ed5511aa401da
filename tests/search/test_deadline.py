"""Time budgets that hold: under a budget the rerank stage has a deadline, and the candidates not scored by then keep
their BM25 order below the scored ones; a calibration never buys a depth its measurements refuse; the sweep reports
the percentiles of the rerank time against each budget.

The slow reranker here is the tiny MaxSim model whose every scoring batch costs 20 ms on a fake clock (the searcher's
and the reranker's), so that what the deadline does is exact on any machine and under any load; how close the real
stage keeps to a budget is measured by the budget sweep, not here."""
from __future__ import annotations

import math
import types

import pytest

from pyserini_mores.budget.sweep import format_tsv, run_sweep
from pyserini_mores.index import open_searcher
from pyserini_mores.rerankers import learned, pacing
from pyserini_mores.rerankers.pacing import paced_batches
from pyserini_mores.search import RerankingSearcher
from pyserini_mores.search import searcher as searcher_module
from pyserini_mores.search.calibration import Calibration
from pyserini_mores.types import RerankedHit, RerankStats

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Queries with many BM25 hits on the 20-document collection: many batches of 2 to cut.
QUERIES = ("text editor web server database system language source code files image program terminal browser",
           "package manager linux kernel python programming language office suite remote login data transfer",
           "version control system database engine compiler command-line tool process viewer scientific arrays")
BATCH_COST_S = 0.020
BUDGET_MS = 60.0
# A warm calibration that underestimates the slow reranker 500-fold: the depth it buys is every candidate.
OPTIMISTIC = Calibration(fixed_ms=0.0, per_candidate_ms=0.01)


@pytest.fixture(scope="module")
def lucene(tiny_index):
    return open_searcher(tiny_index)


@pytest.fixture(params=["sidecar", "text"])
def slow_searcher(request, tiny_index, tiny_maxsim_dir, maxsim_sidecar, monkeypatch):
    """MaxSim scoring 2 candidates per batch, each batch 20 ms on a clock that nothing else moves; under the 60 ms
    budget."""
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=20, batch_size=2,
                                 precision="fp32", time_budget_ms=BUDGET_MS, calibration=OPTIMISTIC,
                                 sidecar="auto" if request.param == "sidecar" else None)
    assert (searcher.sidecar_path is None) == (request.param == "text")
    model = searcher.reranker.model
    score = model.score
    clock = [0.0]
    fake_time = types.SimpleNamespace(monotonic=lambda: clock[0], perf_counter=lambda: clock[0])
    monkeypatch.setattr(searcher_module, "time", fake_time)
    monkeypatch.setattr(pacing, "time", fake_time)

    def slow_score(*args, **kwargs):
        clock[0] += BATCH_COST_S
        return score(*args, **kwargs)

    monkeypatch.setattr(model, "score", slow_score, raising=False)
    # Batches of 2 are what the test times; the package's floor on batch size under a deadline would merge them.
    monkeypatch.setattr(pacing, "DEADLINE_PROBE", 1)
    yield searcher
    searcher.close()


def test_a_deadline_stops_the_scoring_and_keeps_bm25_order_below(slow_searcher, lucene):
    unlimited = {query: {hit.docid: hit.score for hit in slow_searcher.rerank_hits(
        query, lucene.search(query, k=20), time_budget_ms=None)[0]} for query in QUERIES}
    times, cut = [], 0
    for _ in range(7):
        for query in QUERIES:
            bm25 = lucene.search(query, k=20)
            bm25_docids = [hit.docid for hit in bm25]
            assert len(bm25) >= 8  # 4 batches of 20 ms at least: more than the budget
            hits, stats = slow_searcher.rerank_hits(query, bm25)
            times.append(stats.rerank_ms)
            assert stats.depth == len(bm25), "the calibration buys every candidate: only the deadline stops"
            assert 0 < stats.scored < stats.depth and stats.deadline_cut
            cut += stats.deadline_cut
            scored = stats.scored
            docids = [hit.docid for hit in hits]
            # The scored candidates are BM25's head, first, in score order, with the scores a full rerank gives them.
            assert sorted(docids[:scored]) == sorted(bm25_docids[:scored])
            assert [hit.score for hit in hits[:scored]] == pytest.approx(
                [unlimited[query][docid] for docid in docids[:scored]], abs=1e-5)
            # The rest keep their BM25 order below them, and scores agree with the ranks.
            assert docids[scored:] == bm25_docids[scored:]
            scores = [hit.score for hit in hits]
            assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
            assert [hit.first_stage_rank for hit in hits[scored:]] == list(range(scored + 1, len(bm25) + 1))
    # Every query ends at the budget: a probe of one candidate (20 ms), then one more (20 ms, half the 40 ms left),
    # then a last one that fits the 20 ms left (no batch of several fits half of it).
    assert times == pytest.approx([3 * BATCH_COST_S * 1000] * len(times))
    assert cut == len(times)


def test_without_a_budget_every_candidate_is_scored(slow_searcher, lucene):
    bm25 = lucene.search(QUERIES[0], k=20)
    hits, stats = slow_searcher.rerank_hits(QUERIES[0], bm25, time_budget_ms=None)
    assert stats.scored == stats.depth == len(bm25) and not stats.deadline_cut
    assert stats.rerank_ms == pytest.approx(len(bm25) / 2 * BATCH_COST_S * 1000)


def test_without_the_deadline_the_budget_only_chooses_the_depth(slow_searcher, lucene):
    slow_searcher.enforce_deadline = False  # runs that do not depend on timing
    bm25 = lucene.search(QUERIES[0], k=20)
    hits, stats = slow_searcher.rerank_hits(QUERIES[0], bm25)
    assert stats.scored == stats.depth == len(bm25) and not stats.deadline_cut
    assert stats.rerank_ms > BUDGET_MS


def _paced(monkeypatch, cost_per_candidate=lambda start: 1.0, probe=1):
    """``run(count, batch_size, deadline, per_candidate_ms, pace=None)`` on a fake clock starting at 100 s, where
    candidate ``i`` costs ``cost_per_candidate(i)`` s; returns the batches and the time each ended."""
    clock = [100.0]
    monkeypatch.setattr(pacing.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(pacing, "DEADLINE_PROBE", probe)

    def run(count, batch_size, deadline, per_candidate_ms=None, pace=None):
        clock[0] = 100.0
        batches, ends = [], []
        for start, stop in paced_batches(count, batch_size, deadline, per_candidate_ms, pace=pace):
            batches.append((start, stop))
            clock[0] += sum(cost_per_candidate(i) for i in range(start, stop))
            ends.append(clock[0])
        return batches, ends

    return run


def test_paced_batches_start_no_batch_predicted_to_take_over_half_the_time_left(monkeypatch):
    """Every candidate costs 1 s; a batch of several starts only when it is predicted to take at most half the time
    left, so batches shrink toward the deadline, down to one candidate, which may take all the time left."""
    run = _paced(monkeypatch)
    assert pytest.approx(0.5) == pacing.DEADLINE_SHARE
    # A probe of one candidate first, then batches of 2 while 2 s fit half the time left; then single candidates
    # while 1 s fits half of it, and a last one in the last 1 s.
    assert run(20, 2, 110.0, per_candidate_ms=1000.0) == (
        [(0, 1), (1, 3), (3, 5), (5, 7), (7, 8), (8, 9), (9, 10)],
        [101.0, 103.0, 105.0, 107.0, 108.0, 109.0, 110.0])
    # A batch that does not fit whole is shortened to what half the time left allows (8 s left: 4 candidates).
    assert run(20, 4, 109.0, per_candidate_ms=1000.0)[0] == [(0, 1), (1, 5), (5, 7), (7, 8), (8, 9)]
    # Less than one candidate's time left: nothing more is started.
    assert run(20, 2, 100.5, per_candidate_ms=1000.0)[0] == []
    # No time left: nothing is started, even with no prediction.
    assert run(20, 2, 100.0)[0] == []
    # Batches are at most a DEADLINE_SLICES-th of the candidates, so that stopping between them keeps close.
    assert run(8, 250, math.inf)[0] == [(0, 1), (1, 3), (3, 5), (5, 7), (7, 8)]


def test_paced_batches_give_up_no_depth_at_a_steady_pace(monkeypatch):
    """At 1 s per candidate, a deadline ``T`` s away scores ``T`` candidates, whatever the batch size: the batches
    that shrink toward the deadline lose none of the time."""
    run = _paced(monkeypatch)
    for seconds in range(1, 40):
        for batch_size in (1, 3, 16, 250):
            batches, ends = run(1000, batch_size, 100.0 + seconds, per_candidate_ms=1000.0)
            assert batches[-1][1] == seconds and ends[-1] == 100.0 + seconds, (seconds, batch_size)


def test_a_warm_calibration_does_not_start_a_cold_first_batch_past_the_deadline(monkeypatch):
    """The calibration (warm page cache) says 10 ms per candidate; cold reads cost 1 s. Trusting it, a first batch
    of 5 candidates (predicted 50 ms) would end 5 s after the start, past a 3 s deadline; the probe costs one."""
    _, ends = _paced(monkeypatch)(20, 5, 103.0, per_candidate_ms=10.0)
    assert ends and max(ends) <= 103.0, ends


def test_a_slowing_batch_is_foreseen_from_the_last_batch_not_only_the_mean(monkeypatch):
    """Candidates cost 1 s, then 1.5 s from the 9th on (the pages of later candidates are cold): the mean of
    everything so far lags behind; the last batch's time and the share keep every batch within the deadline."""
    run = _paced(monkeypatch, cost_per_candidate=lambda i: 1.0 if i < 8 else 1.5)
    for deadline in (110.0, 111.0, 112.5, 114.0, 117.0):
        batches, ends = run(40, 4, deadline, per_candidate_ms=1000.0)
        assert batches and max(ends) <= deadline, (deadline, batches, ends)


def test_a_batch_slowed_mid_way_up_to_twice_what_was_predicted_still_ends_in_time(monkeypatch):
    """Another process takes a core mid-batch: a third of the candidates cost 1 s to 2 s (seeded), the others 1 s,
    and the prediction starts at 1 s. No batch of several candidates ends after the deadline; a last single
    candidate, which may take all the time left, ends at most its own time's excess (< 1 s) after it. A load that
    slows a batch further than twice can overshoot."""
    import random

    generator = random.Random(7)
    costs = [generator.uniform(1.0, 2.0) if generator.random() < 0.3 else 1.0 for _ in range(400)]
    run = _paced(monkeypatch, cost_per_candidate=lambda i: costs[i], probe=16)
    for deadline in (101.0, 102.0, 103.5, 107.0, 110.0, 125.0, 160.0):
        for batch_size in (1, 4, 16, 250):
            batches, ends = run(400, batch_size, deadline, per_candidate_ms=1000.0)
            for (start, stop), end in zip(batches, ends):
                assert end <= deadline if stop - start > 1 else end < deadline + 1.0, (deadline, batches, ends)
    # Three times slower than predicted is beyond what the share absorbs: the first batch (half the time) overshoots.
    slower = _paced(monkeypatch, cost_per_candidate=lambda i: 3.0, probe=16)
    assert max(slower(400, 16, 110.0, per_candidate_ms=1000.0)[1]) > 110.0


def test_a_querys_own_slow_batch_counts_at_once_beside_a_window_of_fast_ones(monkeypatch):
    """Earlier queries left 31 batches at 1 s per candidate; this query's candidates cost 3 s (its pages are cold). One
    slow batch in the window does not move its 0.95 quantile, but this query's own last batch sets the margin."""
    shared = pacing.BatchPace()
    for _ in range(pacing.PACE_WINDOW - 1):
        shared.record(4, 4.0)
    run = _paced(monkeypatch, cost_per_candidate=lambda i: 3.0)
    # The first batch, predicted at 1 s per candidate, takes 12 s of the 20; the next is predicted at 3 s.
    assert run(40, 4, 120.0, per_candidate_ms=1000.0, pace=shared.query()) == (
        [(0, 4), (4, 5), (5, 6)], [112.0, 115.0, 118.0])


def test_the_spread_of_recent_batches_is_the_margin(monkeypatch):
    """One batch in five ran 1.5 times as long as the others (1 s per candidate): the prediction of a candidate is
    the line (1.1 s) times the 0.95 quantile of the batches' ratios to it, i.e. 1.5 s, so that a slow batch like
    those seen recently still fits; not the mean, which would start a candidate with 1.1 s left."""
    run = _paced(monkeypatch)
    shared = pacing.BatchPace()
    for batch in range(20):
        shared.record(1, 1.5 if batch % 5 == 0 else 1.0)
    assert shared.predictor().seconds(1) == pytest.approx(1.5)
    assert run(10, 1, 101.45, per_candidate_ms=1000.0, pace=shared.query())[0] == []
    assert run(10, 1, 101.55, per_candidate_ms=1000.0, pace=shared.query())[0] == [(0, 1)]


def test_a_shared_pace_carries_the_times_of_earlier_queries_and_their_spread(monkeypatch):
    """A query that met slow batches (2 s per candidate after a 1 s probe) leaves them in the searcher's pace: the
    next query predicts from them (no probe; a line through the batches, times their spread), not from the
    calibration's 0.5 s."""
    shared = pacing.BatchPace()
    assert shared.predictor() is None
    run = _paced(monkeypatch, cost_per_candidate=lambda i: 1.0 if i == 0 else 2.0)
    first = shared.query()
    batches, ends = run(100, 250, 120.0, per_candidate_ms=500.0, pace=first)
    # The second batch, predicted at 1 s per candidate to take half the 19 s left, takes twice that: still in time.
    assert (batches, ends) == ([(0, 1), (1, 10)], [101.0, 119.0])
    assert (first.batches, first.candidates, first.seconds) == (2, 10, 19.0)
    # A line through (1, 1 s) and (9, 18 s): 17/8 s per candidate after an overhead of -1/8 s, so through the
    # origin instead: 163/82 s per candidate; the 0.95 quantile of the ratios to it is the slower batch's.
    prediction = shared.predictor()
    assert (prediction.overhead, prediction.per_candidate) == (0.0, pytest.approx(163 / 82))
    assert prediction.margin == pytest.approx(18 / (9 * 163 / 82))
    assert prediction.seconds(5) == pytest.approx(10.0)
    batches, ends = run(100, 250, 120.0, per_candidate_ms=500.0, pace=shared.query())
    assert batches[0] == (0, 5) and max(ends) <= 120.0
    # A line with an overhead: batches of 1 and 3 candidates taking 3 s and 5 s are 2 s + 1 s per candidate.
    assert pacing.fit_batch_line([(1, 3.0), (3, 5.0), (1, 3.0)]) == (pytest.approx(2.0), pytest.approx(1.0))
    # The window forgets: PACE_WINDOW batches at 1 s per candidate and the prediction is 1 s per candidate again.
    for _ in range(pacing.PACE_WINDOW):
        shared.record(4, 4.0)
    assert shared.predictor().seconds(1) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        pacing.BatchPace(quantile=0.0)


# ------------------------------------------------------------------------------------------------- calibration


def test_a_negative_fitted_slope_buys_no_depth_beyond_what_was_measured_to_fit():
    points = [(1, 60.0), (10, 40.0), (100, 35.0), (250, 38.0), (500, 45.0)]
    calibration = Calibration.fit(points, max_candidates=500)
    assert calibration.per_candidate_ms == 0.0  # the fitted slope was negative: a flat line
    for budget in (36.0, 40.0, 44.0, 44.99, 45.0, 50.0):
        depth = calibration.depth_for_budget(budget, 500)
        largest_fitting = max((n for n, ms in points if ms <= budget), default=0)
        assert depth <= largest_fitting, budget
        assert calibration.predict_ms(depth) <= budget
    # The flat line alone (43.6 ms) would rerank all 500 under 44 ms, where 500 candidates were measured at 45.
    assert calibration.line_ms(500) < 44.0 and calibration.depth_for_budget(44.0, 500) == 250
    # Beyond the largest measured size the cost grows with the candidates, not flat to any depth.
    assert calibration.depth_for_budget(50.0, 5000) < 600
    # Depths stay monotone in the budget.
    depths = [calibration.depth_for_budget(budget / 4, 1000) for budget in range(0, 400)]
    assert depths == sorted(depths)


def test_a_line_above_the_measured_cost_of_one_candidate_does_not_refuse_it():
    """A cross-encoder measured on a quiet 2-core CPU: costs are not linear in the candidates (the first ones are
    dearer per candidate than the thousandth), so the least-squares line through 1 to 1,000 candidates started at
    95.8 ms + 8.55 ms per candidate, while one candidate measured 22.7 ms (the other medians here are chosen to give
    that line, within 0.1 ms). A 100 ms budget buys that one candidate; the line is kept, for the report and the
    refits."""
    points = [(1, 22.7), (10, 135.0), (25, 320.0), (50, 574.0), (100, 1010.0), (250, 2240.0), (500, 4390.0),
              (1000, 8625.0)]
    calibration = Calibration.fit(points, max_candidates=1000)
    assert (calibration.fixed_ms, calibration.per_candidate_ms) == (pytest.approx(95.70, abs=0.01),
                                                                    pytest.approx(8.549, abs=0.001))
    assert calibration.line_ms(1) > 100.0 and calibration.predict_ms(1) == 22.7
    assert calibration.depth_for_budget(100.0, 1000) == 1
    # Deeper only where a size at least as large was measured to fit: 10 candidates (135 ms) at 200 and 300 ms.
    assert [calibration.depth_for_budget(budget, 1000) for budget in (22.6, 134.9, 135.0, 200.0, 300.0, 320.0)] == \
        [0, 1, 10, 10, 10, 25]
    # Every depth chosen was measured (or a size above it was) within the budget, and depths grow with it.
    depths = [calibration.depth_for_budget(budget, 1000) for budget in range(0, 9000, 7)]
    assert depths == sorted(depths)
    for budget, depth in zip(range(0, 9000, 7), depths):
        assert depth == max((n for n, ms in points if ms <= budget), default=0), budget
    # Beyond the largest size measured, never below the line nor the largest median in proportion.
    assert calibration.predict_ms(2000) == pytest.approx(max(calibration.line_ms(2000), 2 * 8625.0))


def test_a_refit_moves_each_measured_point_onto_the_new_line_where_it_was_the_prediction():
    """The refitted prediction at a measured size is the observed line there, whatever the old line said: the busy
    machine's 2.91 ms + 229 ms per candidate refuses one candidate under 100 ms, though the measured 22.7 ms times
    the old line's ratio would not."""
    calibration = Calibration.fit([(1, 22.7), (10, 135.0), (25, 320.0), (50, 574.0), (100, 1010.0)],
                                  max_candidates=100)
    busy = calibration.refitted(2.91, 229.0, at=1)
    assert [ms for _, ms in busy.points] == pytest.approx([2.91 + 229.0 * n for n in (1, 10, 25, 50, 100)])
    assert busy.predict_ms(1) == pytest.approx(231.91) and busy.depth_for_budget(100.0, 100) == 0
    # A point above the envelope (a noisy median above a larger size's) stays above the new line by as much.
    noisy = Calibration.fit([(1, 30.0), (10, 20.0), (100, 110.0)], max_candidates=100).refitted(10.0, 1.0, at=10)
    assert [ms for _, ms in noisy.points] == pytest.approx([11.0 * 30.0 / 20.0, 20.0, 110.0])


# ------------------------------------------------------------------------------------------------------ sweep


class _TimedSearcher:
    """A searcher stand-in whose rerank stage took the given times (ms), query after query."""

    rerank_depth = 10

    def __init__(self, times_ms):
        self.times_ms = list(times_ms)

    def calibrate(self, recalibrate=False, cold_cache=False):
        return Calibration(fixed_ms=1.0, per_candidate_ms=1.0)

    def first_stage(self, queries, qids, k, threads):
        return {qid: [RerankedHit("d1", 2.0, 0), RerankedHit("d2", 1.0, 1)] for qid in qids}

    def rerank_hits(self, query, hits, *, time_budget_ms):
        ms = self.times_ms.pop(0)
        return list(hits), RerankStats(candidates=len(hits), depth=2, rerank_ms=ms, scored=1 if ms > 50 else 2,
                                       deadline_cut=ms > 50)


def test_sweep_rows_report_percentiles_against_the_budget():
    times = [float(ms) for ms in range(1, 101)]  # 1..100 ms over 100 queries
    topics = {f"q{i}": "query" for i in range(100)}
    qrels = {qid: {"d1": 1} for qid in topics}
    result = run_sweep({"timed": _TimedSearcher(times)}, topics, qrels, [50.0], progress=False)
    [row] = result.rows
    assert (row.p50_ms, row.p95_ms, row.p99_ms) == (50.0, 95.0, 99.0)
    assert row.within_budget == 0.5 and row.deadline_cut == 0.5 and row.scored_mean == 1.5
    record = result.to_dict()["rows"][0]
    assert {key: record[key] for key in ("p50_ms", "p95_ms", "p99_ms", "within_budget")} == {
        "p50_ms": 50.0, "p95_ms": 95.0, "p99_ms": 99.0, "within_budget": 0.5}
    header, line = format_tsv(result.rows).splitlines()
    cells = dict(zip(header.split("\t"), line.split("\t")))
    assert (cells["p50_ms"], cells["p95_ms"], cells["p99_ms"], cells["within_budget"]) == ("50.0", "95.0", "99.0",
                                                                                          "50%")


def test_a_cold_sweep_evicts_the_sidecar_before_every_rerank():
    class _Sidecar:
        evictions = 0

        def evict_from_page_cache(self):
            self.evictions += 1

    searcher = _TimedSearcher([10.0] * 6)
    searcher.reranker = type("Reranker", (), {"sidecar": _Sidecar()})()
    topics = {f"q{i}": "query" for i in range(3)}
    qrels = {qid: {"d1": 1} for qid in topics}
    run_sweep({"timed": searcher}, topics, qrels, [20.0], progress=False)
    assert searcher.reranker.sidecar.evictions == 0
    run_sweep({"timed": searcher}, topics, qrels, [20.0], progress=False, cold_cache=True)
    assert searcher.reranker.sidecar.evictions == 3


def test_an_evicted_sidecar_reads_the_same_vectors(maxsim_sidecar):
    from pyserini_mores.sidecar import open_sidecar

    with open_sidecar(maxsim_sidecar) as reader:
        rows = list(range(min(reader.num_docs, 5)))
        before, lengths = reader.get_batch(rows)
        before = before.clone()
        reader.evict_from_page_cache()
        after, lengths_after = reader.get_batch(rows)
        assert (after == before).all() and (lengths_after == lengths).all()


def test_a_prefetched_sidecar_reads_the_same_vectors_and_refuses_rows_it_does_not_hold(maxsim_sidecar):
    from pyserini_mores.sidecar import open_sidecar

    with open_sidecar(maxsim_sidecar) as reader:
        rows = list(range(reader.num_docs))[::-1]
        before, lengths = reader.get_batch(rows)
        before = before.clone()
        reader.evict_from_page_cache()
        reader.prefetch(rows)
        reader.prefetch([])
        after, lengths_after = reader.get_batch(rows)
        assert (after == before).all() and (lengths_after == lengths).all()
        with pytest.raises(IndexError):
            reader.prefetch([reader.num_docs])


def test_prefetch_asks_the_kernel_for_exactly_each_rows_bytes_in_their_order(maxsim_sidecar, monkeypatch):
    import mmap
    import types

    from pyserini_mores.sidecar import open_sidecar
    from pyserini_mores.sidecar.format import TOKENS

    with open_sidecar(maxsim_sidecar) as reader:
        asked = []
        advised = types.SimpleNamespace(madvise=lambda *call: asked.append(call))
        reader._maps[TOKENS] = types.SimpleNamespace(_mmap=advised)  # the token memmap, as prefetch sees it
        rows = [5, 0, reader.num_docs - 1]
        reader.prefetch(rows)
        row_bytes = reader.bytes_per_token
        assert [call[0] for call in asked] == [mmap.MADV_WILLNEED] * len(rows)
        for (_, start, length), row in zip(asked, rows):
            first, end = int(reader.offsets[row]) * row_bytes, int(reader.offsets[row + 1]) * row_bytes
            assert start % mmap.PAGESIZE == 0 and first - mmap.PAGESIZE < start <= first and start + length == end


def test_under_a_deadline_the_candidates_rows_are_prefetched_in_their_order_before_any_scoring(
        slow_searcher, lucene, monkeypatch):
    if slow_searcher.sidecar_path is None:
        pytest.skip("from text: nothing to prefetch")
    reranker = slow_searcher.reranker
    events = []
    monkeypatch.setattr(reranker.sidecar, "prefetch", lambda rows: events.append(("prefetch", list(rows))),
                        raising=False)
    score = reranker.model.score
    monkeypatch.setattr(reranker.model, "score", lambda *a, **k: events.append(("score",)) or score(*a, **k),
                        raising=False)
    bm25 = lucene.search(QUERIES[0], k=20)
    slow_searcher.rerank_hits(QUERIES[0], bm25)
    assert events[0] == ("prefetch", [hit.lucene_docid for hit in bm25])
    assert events[1:] and all(event == ("score",) for event in events[1:])
    events.clear()
    slow_searcher.rerank_hits(QUERIES[0], bm25, time_budget_ms=None)  # no deadline: no prefetch
    assert events and all(event == ("score",) for event in events)


# ------------------------------------------------------------------------------------------- drift and depth 0


def _cached_calibration(searcher, cache_dir, **fields) -> Calibration:
    """``fields`` as the cost model in ``searcher``'s cache entry, then loaded by ``searcher.calibrate`` (as a search
    that finds its calibration in the cache does)."""
    from pyserini_mores.search.calibration import calibration_key, save_calibration

    save_calibration(Calibration(key=calibration_key(searcher), max_candidates=searcher.rerank_depth,
                                 measured_at="2026-01-01T00:00:00+00:00", **fields), cache_dir)
    return searcher.calibrate(cache_dir=cache_dir)


def test_times_that_drift_from_the_cost_model_refit_it_and_the_cache(slow_searcher, lucene, tmp_path, caplog):
    """Measured on a quiet machine at 1 ms + 1 ms per candidate, the reranker now takes 20 ms per candidate (the fake
    clock moves only in the scoring batches): every query scores 3 candidates in 60 ms under the deadline, all of it in
    its batches. The eighth such query refits the line to what was observed, 0 ms + 20 ms per candidate (15 times the
    prediction at the 3 candidates scored), saves it, and the next query's depth is the refitted model's."""
    from pyserini_mores.search.calibration import DRIFT_MIN_QUERIES

    cache = tmp_path / "calibration"
    quiet = _cached_calibration(slow_searcher, cache, fixed_ms=1.0, per_candidate_ms=1.0)
    assert quiet.scale == 1.0 and quiet.depth_for_budget(BUDGET_MS, 20) == 20
    bm25 = lucene.search(QUERIES[0], k=20)
    for query_number in range(1, DRIFT_MIN_QUERIES + 1):
        hits, stats = slow_searcher.rerank_hits(QUERIES[0], bm25)
        assert (stats.depth, stats.scored, stats.rerank_ms) == (len(bm25), 3, pytest.approx(60.0))
        if query_number < DRIFT_MIN_QUERIES:
            assert slow_searcher.calibration is quiet, query_number
    refitted = slow_searcher.calibration
    assert refitted.scale == pytest.approx(15.0)
    assert (refitted.fixed_ms, refitted.per_candidate_ms) == (pytest.approx(0.0, abs=1e-9), pytest.approx(20.0))
    assert refitted.key == quiet.key and refitted.measured_at == quiet.measured_at and refitted.rescaled_at
    assert "15.00x what its cost model predicts" in caplog.text
    assert "--recalibrate measures it again" in caplog.text
    # The next query reranks as deep as the refitted model says fits: 60 / 20 -> 3 candidates.
    _, stats = slow_searcher.rerank_hits(QUERIES[0], bm25)
    assert stats.depth == refitted.depth_for_budget(BUDGET_MS, 20) == 3
    # The cache holds it: the next search starts from the observed costs.
    assert slow_searcher.calibrate(cache_dir=cache) == refitted
    # --recalibrate measures again (a real measurement on the real clock, not the refitted model).
    assert slow_searcher.calibrate(recalibrate=True, cache_dir=cache, num_queries=1, repeats=1).scale == 1.0


def test_a_reranker_that_does_not_pace_its_batches_is_refitted_as_its_model_splits(slow_searcher, lucene, tmp_path,
                                                                                    monkeypatch):
    """Without ``rerank_until`` every candidate is scored and the time is not split into batches and the rest: each
    query's 16 candidates in 8 batches of 20 ms (160 ms) are split as the model (1 ms + 1 ms per candidate) splits its
    prediction, 1/17 fixed, and the refit keeps that shape."""
    from pyserini_mores.search.calibration import DRIFT_MIN_QUERIES

    monkeypatch.delattr(learned.ModelReranker, "rerank_until")
    _cached_calibration(slow_searcher, tmp_path, fixed_ms=1.0, per_candidate_ms=1.0)
    bm25 = lucene.search(QUERIES[0], k=20)
    for _ in range(DRIFT_MIN_QUERIES):
        _, stats = slow_searcher.rerank_hits(QUERIES[0], bm25)
        assert (stats.scored, stats.rerank_ms) == (len(bm25), pytest.approx(len(bm25) / 2 * 20.0))
    refitted = slow_searcher.calibration
    assert (refitted.fixed_ms, refitted.per_candidate_ms) == (pytest.approx(160 / 17), pytest.approx(160 / 17))


def test_only_the_first_refit_of_a_searcher_is_a_warning(slow_searcher, tmp_path, caplog):
    """Under a load that keeps changing, the cost model is refitted every few queries: the user is warned once, and
    the later refits are logged at INFO (shown with -v)."""
    import logging

    from pyserini_mores.search.calibration import REFIT_WINDOW

    _cached_calibration(slow_searcher, tmp_path, fixed_ms=1.0, per_candidate_ms=1.0)
    caplog.set_level(logging.INFO, logger=searcher_module.__name__)
    for observed_ms in (40.0, 400.0, 4000.0):  # 2 candidates, each time 10x what the current model predicts
        for _ in range(REFIT_WINDOW):
            slow_searcher._observe_cost(2, observed_ms, observed_ms)
    refits = [record.levelno for record in caplog.records if "what its cost model predicts" in record.getMessage()]
    assert len(refits) >= 3 and refits[0] == logging.WARNING and set(refits[1:]) == {logging.INFO}
    assert slow_searcher.calibration.predict_ms(2) == pytest.approx(4000.0)


def test_times_within_the_drift_factor_leave_the_cost_model_alone(slow_searcher, lucene, tmp_path):
    """22 ms per candidate measured, 20 ms observed (0.91 of the prediction): within DRIFT_FACTOR, kept."""
    from pyserini_mores.search.calibration import DRIFT_FACTOR, DRIFT_MIN_QUERIES

    assert 1 / DRIFT_FACTOR < 20 / 22
    calibration = _cached_calibration(slow_searcher, tmp_path, fixed_ms=0.0, per_candidate_ms=22.0)
    bm25 = lucene.search(QUERIES[0], k=20)
    for _ in range(2 * DRIFT_MIN_QUERIES):
        _, stats = slow_searcher.rerank_hits(QUERIES[0], bm25)
        assert (stats.depth, stats.scored, stats.rerank_ms) == (2, 2, pytest.approx(40.0))
    assert slow_searcher.calibration is calibration


def test_without_the_deadline_or_with_a_given_cost_model_nothing_is_refitted(slow_searcher, lucene, tmp_path):
    from pyserini_mores.search.calibration import DRIFT_MIN_QUERIES

    bm25 = lucene.search(QUERIES[0], k=20)
    for _ in range(DRIFT_MIN_QUERIES + 1):  # the fixture's cost model is the caller's: 500 times too fast, kept
        slow_searcher.rerank_hits(QUERIES[0], bm25)
    assert slow_searcher.calibration is OPTIMISTIC
    calibration = _cached_calibration(slow_searcher, tmp_path, fixed_ms=1.0, per_candidate_ms=1.0)
    slow_searcher.enforce_deadline = False  # runs that do not depend on timing
    for _ in range(DRIFT_MIN_QUERIES + 1):
        slow_searcher.rerank_hits(QUERIES[0], bm25)
    assert slow_searcher.calibration is calibration


def test_a_cost_model_that_leaves_nothing_to_rerank_is_reported_naming_recalibrate(slow_searcher, lucene, tmp_path,
                                                                                    caplog):
    """A model measured on a busy machine (500 ms per query) gives depth 0 under the 60 ms budget: the queries keep
    BM25's order, and the search says so once, with the way out."""
    from pyserini_mores.search.topic_search import budget_report

    _cached_calibration(slow_searcher, tmp_path, fixed_ms=500.0, per_candidate_ms=1.0)
    stats = []
    for query in QUERIES:
        bm25 = lucene.search(query, k=20)
        hits, query_stats = slow_searcher.rerank_hits(query, bm25)
        assert [hit.docid for hit in hits] == [hit.docid for hit in bm25] and query_stats.depth == 0
        stats.append(query_stats)
    warnings = [record.getMessage() for record in caplog.records if "buys no reranking" in record.getMessage()]
    assert warnings == [
        "the 60 ms time budget buys no reranking with maxsim: its cost model (500 ms + 1 ms/candidate, measured "
        "2026-01-01T00:00:00+00:00) predicts 501 ms for a single candidate, so every query keeps its first-stage "
        "order but one in 25, which reranks one candidate to time it; if the machine was busy when it was measured, "
        "measure it again with --recalibrate (or RerankingSearcher.calibrate(recalibrate=True))"]
    assert budget_report(stats, BUDGET_MS)[-1] == (
        "Nothing reranked: 3 of 3 queries, whose depth under the budget was 0 (if the machine was busy when the cost "
        "model was measured: --recalibrate)")
    slow_searcher.rerank_hits(QUERIES[0], lucene.search(QUERIES[0], k=20), time_budget_ms=0)  # asked for: silent
    assert len([r for r in caplog.records if "buys no reranking" in r.getMessage()]) == 1


def test_the_budget_report_gives_p95_and_the_queries_over_the_budget():
    from pyserini_mores.search.topic_search import budget_report

    stats = [RerankStats(candidates=20, depth=10, rerank_ms=float(ms), scored=10 if ms <= 50 else 6,
                         deadline_cut=ms > 50) for ms in range(1, 101)]
    stats.append(RerankStats(candidates=0, depth=0, rerank_ms=0.0))  # a query without candidates
    assert budget_report(stats, 50.0) == [
        "Rerank depth under the 50 ms budget: median 10, mean 9.9, range 0-10",
        "Rerank time against the 50 ms budget: median 50.0 ms, p95 95.0 ms; 50 of 101 queries over it",
        "Stopped at the deadline: 50 of 101 queries, which scored 300 of the 500 candidates their depth allowed"]
    assert budget_report([], 50.0) == []


def test_a_refit_follows_the_medians_of_fixed_and_per_candidate_costs_apart():
    """Quiet: 5 ms fixed + 10 ms per candidate. One query caught by a burst of load (10x) moves nothing; a load that
    doubles the fixed cost and triples the per-candidate cost for good is refitted as exactly that, once."""
    from pyserini_mores.search.calibration import CostRefit

    quiet = Calibration(fixed_ms=5.0, per_candidate_ms=10.0, points=((1, 15.0), (10, 105.0)))
    refit = CostRefit(window=7, factor=1.5, min_queries=4)

    def query(model, scored, fixed_ms, per_candidate_ms):
        return refit.observe(model, scored, fixed_ms + per_candidate_ms * scored, per_candidate_ms * scored)

    for scored in (4, 6, 5, 5, 7):
        assert query(quiet, scored, 5.0, 10.0) is None
    assert query(quiet, 5, 50.0, 100.0) is None  # the burst: 550 ms where 55 were predicted
    assert refit.queries == 6
    results = [query(quiet, scored, 10.0, 30.0) for scored in (3, 3, 4)]
    assert results[:-1] == [None] * 2  # the medians move once the loaded queries are the window's majority
    busy, ratio = results[-1]
    assert (busy.fixed_ms, busy.per_candidate_ms) == (10.0, 30.0)
    # At the median number the window's queries scored, 5: 160 ms where 55 were predicted.
    assert sorted(refit.scored) == [3, 3, 4, 5, 5, 5, 7]
    assert ratio == pytest.approx(160 / 55) and busy.scale == pytest.approx(ratio)
    # The measured points move with the line: what they said at their size, times the new line's ratio there.
    assert busy.points == (pytest.approx((1, 15.0 * 40 / 15)), pytest.approx((10, 105.0 * 310 / 105)))
    # Converged: the same load against the refitted model refits nothing more.
    for _ in range(8):
        assert query(busy, 3, 10.0, 30.0) is None
    # A query not timed apart (a reranker that does not pace its batches) is split as the model splits: 3 candidates
    # in 200 ms against 10 + 30 per candidate: 20 ms fixed, 60 ms per candidate.
    assert query(busy, 3, 10.0, 30.0) is None
    assert refit.observe(busy, 3, 200.0, None) is None
    assert (refit.fixed_ms[-1], refit.per_candidate_ms[-1]) == (pytest.approx(20.0), pytest.approx(60.0))
    # Jitter under NOISE_FLOOR_MS is not counted; a query that scored nothing counts for the fixed cost only.
    assert refit.observe(Calibration(fixed_ms=0.0, per_candidate_ms=0.1), 10, 1.9, 1.0) is None
    before = list(refit.per_candidate_ms)
    assert refit.observe(busy, 0, 12.0, 0.0) is None and list(refit.per_candidate_ms) == before
    assert refit.fixed_ms[-1] == 12.0


def test_a_probe_that_contradicts_the_model_refits_it_alone_even_within_the_drift_factor():
    """62 ms predicted for one candidate keeps a 60 ms budget at depth 0; a probe that reranked one in 58 ms (within
    DRIFT_FACTOR of the prediction, which an ordinary query would leave alone) is the whole window, and the model."""
    from pyserini_mores.search.calibration import DRIFT_FACTOR, CostRefit

    model = Calibration(fixed_ms=55.0, per_candidate_ms=7.0)
    assert model.depth_for_budget(60.0, 10) == 0 and 1 / DRIFT_FACTOR < 58 / 62
    refit = CostRefit()
    for _ in range(10):  # ordinary queries at the same times: counted, no refit
        assert refit.observe(model, 1, 58.0, 6.0) is None
    refitted, ratio = refit.observe(model, 1, 58.0, 6.0, conclusive=True)
    assert (refitted.fixed_ms, refitted.per_candidate_ms) == (52.0, 6.0) and ratio == pytest.approx(58 / 62)
    assert refit.queries == 1 and refitted.depth_for_budget(60.0, 10) == 1


def test_a_refitted_cost_model_round_trips_and_keeps_its_measurement():
    measured = Calibration.fit([(1, 10.0), (10, 19.0), (100, 109.0)], max_candidates=100, key={"reranker": "x"},
                               measured_at="2026-01-01T00:00:00+00:00")
    assert (measured.fixed_ms, measured.per_candidate_ms) == (pytest.approx(9.0), pytest.approx(1.0))
    refitted = measured.refitted(18.0, 2.0, at=10).refitted(27.0, 3.0, at=10)
    assert refitted.scale == pytest.approx(3.0) and [n for n, _ in refitted.points] == [1, 10, 100]
    assert [ms for _, ms in refitted.points] == pytest.approx([30.0, 57.0, 327.0])
    assert refitted.predict_ms(50) == pytest.approx(3 * measured.predict_ms(50))
    assert refitted.max_relative_error == pytest.approx(measured.max_relative_error)
    assert Calibration.from_dict(refitted.to_dict()) == refitted
    assert "3x as measured" in refitted.describe()
    legacy = measured.to_dict()
    del legacy["scale"], legacy["rescaled_at"]
    assert Calibration.from_dict(legacy) == measured
    with pytest.raises(ValueError, match="per_candidate_ms"):
        measured.refitted(1.0, -1.0, at=1)
