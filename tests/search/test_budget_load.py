"""Time budgets on a machine whose load comes and goes, simulated: the real searcher and reranker (the tiny MaxSim
model over its sidecar), on a fake clock that the query encoding and every scoring batch move by a cost this test
controls — quiet, then another process taking a core for parts of batches, then quiet again. What the deadline and
the refitted cost model do is then exact and the same on any machine; the real figures come from
``integrations/scale/budget_under_load.py``."""
from __future__ import annotations

import random
import statistics
import types

import pytest

from pyserini_mores.index import open_searcher
from pyserini_mores.rerankers import pacing
from pyserini_mores.search import RerankingSearcher
from pyserini_mores.search import searcher as searcher_module
from pyserini_mores.search.calibration import Calibration, calibration_key, save_calibration

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERY = "text editor web server database system language source code files image program terminal browser"
BUDGET_MS = 60.0
FIXED_MS = 8.0  # encoding the query
BATCH_MS = 2.0  # each scoring call
CANDIDATE_MS = 5.0  # each candidate in it
QUIET, BUSY = (1.0, 1.1), (1.5, 3.0)  # the slowdown of each cost: drawn per call in this range
PHASES = ((QUIET, 60), (BUSY, 100), (QUIET, 60))


@pytest.fixture
def loaded(tiny_index, tiny_maxsim_dir, maxsim_sidecar, monkeypatch, tmp_path):
    """A budgeted searcher whose costs follow the load of the phase, and the load's setter."""
    # Measured quiet, as a user calibrates once: the line a calibration fits to these costs.
    yield from _loaded_searcher(tiny_index, tiny_maxsim_dir, monkeypatch, tmp_path,
                                fixed_ms=FIXED_MS + BATCH_MS, per_candidate_ms=CANDIDATE_MS)


@pytest.fixture
def measured_busy(tiny_index, tiny_maxsim_dir, maxsim_sidecar, monkeypatch, tmp_path):
    """As ``loaded``, with a cost model measured while the machine was busy: 75 ms before the first candidate, more
    than the whole budget."""
    yield from _loaded_searcher(tiny_index, tiny_maxsim_dir, monkeypatch, tmp_path,
                                fixed_ms=75.0, per_candidate_ms=3 * CANDIDATE_MS)


def _loaded_searcher(tiny_index, tiny_maxsim_dir, monkeypatch, tmp_path, **calibration):
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=20, batch_size=250,
                                 precision="fp32", time_budget_ms=BUDGET_MS)
    model = searcher.reranker.model
    score, encode_query = model.score, model.encode_query
    clock, load = [0.0], {"range": QUIET, "draw": random.Random(11)}
    fake_time = types.SimpleNamespace(monotonic=lambda: clock[0], perf_counter=lambda: clock[0])
    monkeypatch.setattr(searcher_module, "time", fake_time)
    monkeypatch.setattr(pacing, "time", fake_time)

    def slowdown() -> float:
        return load["draw"].uniform(*load["range"])

    def slow_score(query_state, docs, lengths):
        clock[0] += slowdown() * (BATCH_MS + CANDIDATE_MS * docs.shape[0]) / 1000
        return score(query_state, docs, lengths)

    def slow_encode_query(*args, **kwargs):
        clock[0] += slowdown() * FIXED_MS / 1000
        return encode_query(*args, **kwargs)

    monkeypatch.setattr(model, "score", slow_score, raising=False)
    monkeypatch.setattr(model, "encode_query", slow_encode_query, raising=False)
    save_calibration(Calibration(key=calibration_key(searcher), max_candidates=20,
                                 measured_at="2026-01-01T00:00:00+00:00", **calibration), tmp_path)
    searcher.calibrate(cache_dir=tmp_path)
    yield searcher, load
    searcher.close()


def test_the_budget_holds_at_p95_while_the_load_comes_and_goes_and_depth_follows_it(loaded, tiny_index):
    searcher, load = loaded
    bm25 = open_searcher(tiny_index).search(QUERY, k=20)
    assert len(bm25) == 16  # more than the budget can score
    phases = []
    for slowdown, queries in PHASES:
        load["range"] = slowdown
        phases.append([searcher.rerank_hits(QUERY, bm25)[1] for _ in range(queries)])
    quiet, busy, quiet_again = phases
    for stats in phases:
        times = sorted(stat.rerank_ms for stat in stats)
        assert times[round(0.95 * len(times)) - 1] <= BUDGET_MS, times[-10:]
        assert all(stat.scored >= 1 for stat in stats)  # never more cautious than scoring nothing
    # Quiet: 8.4 ms to encode the query leave about 51 ms, 9 candidates in one batch of 2.1 + 5.25 ms each; the
    # batches that shrink toward the deadline (each with its overhead) cost one of them.
    assert statistics.median(stat.scored for stat in quiet) == 8 and min(stat.scored for stat in quiet) >= 7
    # Busy, the costs 1.5 to 3 times as high: fewer candidates, not none.
    assert statistics.median(stat.scored for stat in busy) == 2
    # Quiet again: the refitted cost model follows the load back, and the depth with it.
    assert statistics.median(stat.scored for stat in quiet_again[-30:]) == 8
    assert min(stat.scored for stat in quiet_again[-30:]) >= 7
    assert [stat.depth for stat in quiet_again[-30:]] == [8] * 30
    assert searcher.calibration.fixed_ms == pytest.approx(8.4, abs=0.3)


def test_a_cost_model_measured_busy_is_corrected_by_its_probes_on_a_quiet_machine(measured_busy, tiny_index):
    """The model says one candidate costs 90 ms, over the 60 ms budget, so queries rerank nothing and observe nothing;
    one in PROBE_INTERVAL reranks one candidate anyway. On the quiet machine the probe takes 15 ms, within the
    budget: the model is refitted to it at once, and the depth comes back to what the quiet machine affords."""
    from pyserini_mores.search.calibration import PROBE_INTERVAL

    searcher, _ = measured_busy
    bm25 = open_searcher(tiny_index).search(QUERY, k=20)
    assert searcher.calibration.depth_for_budget(BUDGET_MS, 20) == 0
    stats = [searcher.rerank_hits(QUERY, bm25)[1] for _ in range(PROBE_INTERVAL)]
    before, probe = stats[:-1], stats[-1]
    assert all((stat.depth, stat.scored, stat.rerank_ms) == (0, 0, 0.0) for stat in before)
    assert (probe.depth, probe.scored) == (1, 1) and probe.rerank_ms <= BUDGET_MS
    # The model is the probe's line now: its 1-candidate batch and the rest of its time.
    probed = searcher.calibration
    assert probed.predict_ms(1) == pytest.approx(probe.rerank_ms, abs=1e-5)
    # The next query reranks as deep as that line says fits, and the refits that follow settle where the quiet
    # machine settles when measured quiet (the test above): 8 candidates.
    stats.append(searcher.rerank_hits(QUERY, bm25)[1])
    assert stats[-1].depth == probed.depth_for_budget(BUDGET_MS, 20) >= 5
    stats += [searcher.rerank_hits(QUERY, bm25)[1] for _ in range(60)]
    assert statistics.median(stat.scored for stat in stats[-30:]) == 8
    times = sorted(stat.rerank_ms for stat in stats)
    assert times[round(0.95 * len(times)) - 1] <= BUDGET_MS
