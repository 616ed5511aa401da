"""Time-budget-aware reranking: depth choice from a cost model, its calibration cache, the searcher's budget option
and the sweep command. Timings are never asserted: depth tests use calibrations built by hand."""
from __future__ import annotations

import json
import math

import pytest

from pyserini_mores.budget.__main__ import main as budget_main
from pyserini_mores.budget.__main__ import parse_scoped_model_args
from pyserini_mores.budget.sweep import SweepRow, parse_reranker_specs, plot_sweep
from pyserini_mores.index import open_searcher
from pyserini_mores.search import RerankingSearcher
from pyserini_mores.search import calibration as calibration_module
from pyserini_mores.search.__main__ import main as search_main
from pyserini_mores.search.calibration import Calibration

from conftest import RESOURCES

TOPICS = RESOURCES / "tiny_topics.tsv"
QRELS = RESOURCES / "tiny_qrels.txt"
QUERIES = ("text editor", "web server reverse proxy", "python scientific arrays", "database engine in a single file")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def calibration_cache(tmp_path, monkeypatch):
    """Every test gets its own calibration cache (never the user's)."""
    monkeypatch.setenv("PYSERINI_MORES_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "calibration"



@pytest.fixture(scope="module")
def lucene(tiny_index):
    return open_searcher(tiny_index)


def maxsim_searcher(tiny_index, tiny_maxsim_dir, **kwargs) -> RerankingSearcher:
    return RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, require_sidecar=True, **kwargs)


# ------------------------------------------------------------------------------------------- depth from a budget


def test_depth_for_budget_is_the_largest_depth_that_fits():
    calibration = Calibration(fixed_ms=2.0, per_candidate_ms=0.5)
    assert calibration.predict_ms(0) == 0.0 and calibration.predict_ms(4) == 4.0
    expected = {0: 0, 1.9: 0, 2.0: 0, 2.49: 0, 2.5: 1, 3.0: 2, 6.99: 9, 7.0: 10, 100: 196, 1e9: 1000,
                math.inf: 1000, None: 1000}
    assert {budget: calibration.depth_for_budget(budget, 1000) for budget in expected} == expected
    # Float boundaries: the chosen depth agrees with predict_ms exactly.
    tenths = Calibration(fixed_ms=0.1, per_candidate_ms=0.1)
    for budget in (0.2, 0.3, 0.7, 1.1):
        depth = tenths.depth_for_budget(budget, 100)
        assert tenths.predict_ms(depth) <= budget < tenths.predict_ms(depth + 1)
    with pytest.raises(ValueError, match=">= 0"):
        calibration.depth_for_budget(-1, 10)
    with pytest.raises(ValueError, match="per_candidate_ms"):
        Calibration(fixed_ms=1.0, per_candidate_ms=-0.1)


def test_depth_is_monotone_in_the_budget_and_capped_by_rerank_depth():
    calibration = Calibration(fixed_ms=3.7, per_candidate_ms=0.13)
    for rerank_depth in (0, 1, 7, 50, 1000):
        budgets = [i * 0.25 for i in range(0, 800)] + [1e6, math.inf]
        depths = [calibration.depth_for_budget(budget, rerank_depth) for budget in budgets]
        assert depths == sorted(depths)
        assert max(depths) == rerank_depth and min(depths) == 0


def test_searcher_reranks_the_chosen_depth_and_keeps_bm25_order_below(tiny_index, tiny_maxsim_dir,
                                                                      maxsim_sidecar, lucene):
    calibration = Calibration(fixed_ms=10.0, per_candidate_ms=1.0)
    # the depth the calibration chooses, without the deadline (whose cut depends on the machine's load)
    searcher = maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=6, calibration=calibration,
                               enforce_deadline=False)
    query = "text editor web server database system language source code files"
    bm25 = [hit.docid for hit in lucene.search(query, k=20)]
    assert len(bm25) > 6
    seen = []
    for budget, expected_depth in ((5, 0), (10, 0), (11, 1), (13.5, 3), (16, 6), (1000, 6)):
        searcher.time_budget_ms = budget
        hits, stats = searcher.search_with_stats(query, k=20)
        assert stats.depth == expected_depth
        docids = [hit.docid for hit in hits]
        assert sorted(docids[:expected_depth]) == sorted(bm25[:expected_depth])
        assert docids[expected_depth:] == bm25[expected_depth:]
        scores = [hit.score for hit in hits]
        assert scores == sorted(scores, reverse=True)
        seen.append(stats.depth)
    assert seen == sorted(seen)
    # batch_search reports the depth of every query; BM25 may find fewer hits than the budget allows.
    searcher.time_budget_ms = 13.5
    batch = searcher.batch_search_with_stats(list(QUERIES), ["q1", "q2", "q3", "q4"], k=10)
    assert {qid: stats.depth for qid, (_, stats) in batch.items()} == {
        qid: min(3, len(lucene.search(query, k=10))) for qid, query in zip(["q1", "q2", "q3", "q4"], QUERIES)}


# ------------------------------------------------------------------------------------ zero and unlimited budgets


def test_zero_budget_returns_exactly_the_bm25_ranking(tiny_index, tiny_maxsim_dir, maxsim_sidecar, lucene):
    searcher = maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=10, time_budget_ms=0)
    for query in QUERIES:
        expected = [(hit.docid, float(hit.score)) for hit in lucene.search(query, k=10)]
        hits, stats = searcher.search_with_stats(query, k=10)
        assert [(hit.docid, hit.score) for hit in hits] == expected
        assert stats.depth == 0 and stats.rerank_ms == 0.0
    batch = searcher.batch_search_with_stats(list(QUERIES), ["q1", "q2", "q3", "q4"], k=10)
    for qid, query in zip(["q1", "q2", "q3", "q4"], QUERIES):
        assert [(h.docid, h.score) for h in batch[qid][0]] == [(h.docid, float(h.score))
                                                                for h in lucene.search(query, k=10)]
    assert {stats.depth for _, stats in batch.values()} == {0}
    assert searcher.calibration is None  # nothing to predict: never measured
    # A budget below the fixed cost of a query buys no reranking either.
    searcher.calibration, searcher.time_budget_ms = Calibration(fixed_ms=5.0, per_candidate_ms=0.1), 4.9
    assert [h.docid for h in searcher.search(QUERIES[0], k=10)] == [h.docid for h in lucene.search(QUERIES[0], k=10)]


def test_unlimited_budget_equals_plain_reranking(tiny_index, tiny_maxsim_dir, maxsim_sidecar, lucene):
    plain = maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=10)
    unlimited = [maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=10, time_budget_ms=math.inf),
                 maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=10, time_budget_ms=None),
                 maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=10, time_budget_ms=1e6,
                                 calibration=Calibration(fixed_ms=1.0, per_candidate_ms=1.0))]
    reranked_somewhere = False
    for query in QUERIES:
        expected = [(hit.docid, hit.score) for hit in plain.search(query, k=15)]
        for searcher in unlimited:
            hits, stats = searcher.search_with_stats(query, k=15)
            assert [(hit.docid, hit.score) for hit in hits] == expected
            assert stats.depth == min(10, len(expected))
        bm25 = [(hit.docid, float(hit.score)) for hit in lucene.search(query, k=15)]
        reranked_somewhere |= expected != bm25
    assert reranked_somewhere  # the comparison is with reranking, not with BM25 again
    assert unlimited[0].calibration is None and unlimited[1].calibration is None


def test_negative_budget_is_refused(tiny_index):
    with pytest.raises(ValueError, match="time_budget_ms"):
        RerankingSearcher(tiny_index, "bm25", time_budget_ms=-5)


# ------------------------------------------------------------------------------------------------- calibration


def test_fit_recovers_a_line_and_never_goes_negative():
    line = Calibration.fit([(1, 2.5 + 0.5), (10, 2.5 + 5.0), (100, 2.5 + 50.0)])
    assert line.fixed_ms == pytest.approx(2.5) and line.per_candidate_ms == pytest.approx(0.5)
    through_origin = Calibration.fit([(1, 0.1), (10, 5.0), (20, 10.2)])  # intercept < 0 → line through 0
    assert through_origin.fixed_ms == 0.0 and through_origin.per_candidate_ms == pytest.approx(
        (0.1 + 50.0 + 204.0) / (1 + 100 + 400))
    flat = Calibration.fit([(1, 3.0), (10, 2.0), (100, 2.5)])  # noise on a constant cost
    assert flat.per_candidate_ms == 0.0 and flat.fixed_ms == 2.5
    assert flat.max_relative_error == pytest.approx(0.25)  # 2.5 predicted where 2.0 was measured
    assert line.max_relative_error == pytest.approx(0.0, abs=1e-9)
    assert Calibration.fit([]).predict_ms(100) == 0.0


def test_calibration_cache_round_trips_and_recalibrate_measures_again(tiny_index, tiny_maxsim_dir, maxsim_sidecar,
                                                                      calibration_cache, monkeypatch):
    measured = []
    real_measure = calibration_module.measure_costs

    def counting_measure(searcher, queries, sizes, **kwargs):
        measured.append((searcher.reranker.batch_size, list(sizes)))
        return real_measure(searcher, queries, sizes, **kwargs)

    monkeypatch.setattr(calibration_module, "measure_costs", counting_measure)
    first = maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=10).calibrate(repeats=1)
    assert measured == [(250, [1, 10])]
    assert [n for n, _ in first.points] == [1, 10] and first.max_candidates == 10
    assert first.key["reranker"] == "maxsim" and first.key["inputs"] == "sidecar:float32x32"
    files = list(calibration_cache.glob("maxsim-*.json"))
    assert len(files) == 1 and Calibration.from_dict(json.loads(files[0].read_text())) == first

    # A new searcher with the same reranker reads the cache; a shallower one is served by it too.
    assert maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=10).calibrate() == first
    assert maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=4).calibrate() == first
    assert len(measured) == 1

    again = maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=10).calibrate(recalibrate=True, repeats=1)
    assert len(measured) == 2
    assert Calibration.from_dict(json.loads(files[0].read_text())) == again

    # What the cost depends on is in the key: another batch size is another entry.
    other = maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=10, batch_size=3).calibrate(repeats=1)
    assert measured[-1] == (3, [1, 10]) and other.key["batch_size"] == 3
    assert len(list(calibration_cache.glob("maxsim-*.json"))) == 2

    # An unreadable entry is measured again, not trusted.
    files[0].write_text("{not json")
    maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=10).calibrate(repeats=1)
    assert len(measured) == 4 and Calibration.from_dict(json.loads(files[0].read_text())).max_candidates == 10


def test_a_cold_calibration_evicts_the_sidecar_before_every_timed_run_and_is_its_own_entry(
        tiny_index, tiny_maxsim_dir, maxsim_sidecar, calibration_cache, monkeypatch):
    searcher = maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=10)
    evictions = []
    sidecar = searcher.reranker.sidecar
    real_evict = sidecar.evict_from_page_cache

    def counting_evict():
        evictions.append(1)
        real_evict()

    monkeypatch.setattr(sidecar, "evict_from_page_cache", counting_evict)
    warm = searcher.calibrate(repeats=1, num_queries=2)
    assert evictions == [] and "page_cache" not in warm.key
    cold = searcher.calibrate(repeats=1, num_queries=2, cold_cache=True)
    assert len(evictions) == 2 * len(cold.points)  # every timed run: 2 queries x each size, one round
    assert cold.key["page_cache"] == "cold"
    assert len(list(calibration_cache.glob("maxsim-*.json"))) == 2
    assert searcher.calibrate(cold_cache=True) == cold and searcher.calibrate() == warm  # each from its entry


def test_a_budgeted_search_calibrates_on_first_use(tiny_index, tiny_maxsim_dir, maxsim_sidecar, calibration_cache):
    searcher = maxsim_searcher(tiny_index, tiny_maxsim_dir, rerank_depth=5, time_budget_ms=1e6)
    assert searcher.calibration is None
    hits, stats = searcher.search_with_stats(QUERIES[0], k=5)
    assert searcher.calibration is not None and searcher.calibration.max_candidates == 5
    assert stats.depth == min(5, len(hits)) and list(calibration_cache.glob("maxsim-*.json"))


# -------------------------------------------------------------------------------------------- the commands


def test_sweep_command_writes_table_json_and_plot(tiny_index, tiny_maxsim_dir, maxsim_sidecar, tmp_path, capsys):
    from pyserini_mores.eval.metrics import evaluate
    from pyserini_mores.formats import read_qrels, read_run

    out = tmp_path / "sweep"
    code = budget_main(["--index", str(tiny_index), "--topics", str(TOPICS), "--qrels", str(QRELS),
                        "--rerankers", "bm25", f"maxsim:{tiny_maxsim_dir}", "--budgets", "0", "1000",
                        "--rerank-depth", "10", "--hits", "10", "--output-dir", str(out), "--save-runs"])
    assert code == 0
    tsv = (out / "budget_sweep.tsv").read_text().splitlines()
    header = tsv[0].split("\t")
    assert header[:6] == ["reranker", "budget_ms", "depth_mean", "depth_median", "MRR@10", "nDCG@10"]
    assert {"p50_ms", "p95_ms", "p99_ms", "within_budget", "scored_mean", "deadline_cut"} <= set(header)
    rows = [dict(zip(header, line.split("\t"))) for line in tsv[1:]]
    assert [(row["reranker"], row["budget_ms"]) for row in rows] == [
        ("bm25", "0"), ("bm25", "1000"), ("maxsim", "0"), ("maxsim", "1000")]

    result = json.loads((out / "budget_sweep.json").read_text())
    by_config = {(row["reranker"], row["budget_ms"]): row for row in result["rows"]}
    assert set(result["calibrations"]) == {"bm25", "maxsim"}
    assert result["settings"]["rerankers"]["maxsim"]["model"] == str(tiny_maxsim_dir)
    # A zero budget is BM25 for every reranker: depth 0 and BM25's metrics.
    bm25_run = {qid: {h.docid: round(float(h.score), 6) for h in open_searcher(tiny_index).search(text, k=10)}
                for qid, text in [line.split("\t") for line in TOPICS.read_text().splitlines()]}
    bm25_metrics = evaluate(bm25_run, QRELS, ["MRR@10", "nDCG@10"]).aggregate
    for label in ("bm25", "maxsim"):
        zero = by_config[label, 0.0]
        assert zero["depth_max"] == 0 and zero["p99_ms"] == 0.0 and zero["queries"] == 4
        assert zero["within_budget"] == 1.0 and zero["scored_mean"] == 0.0
        assert zero["metrics"] == pytest.approx(bm25_metrics, abs=1e-12)
    assert 0 <= by_config["maxsim", 1000.0]["depth_max"] <= 10
    assert by_config["bm25", 1000.0]["metrics"] == pytest.approx(bm25_metrics, abs=1e-12)

    markdown = (out / "budget_sweep.md").read_text()
    assert markdown.startswith("| reranker | budget_ms |") and markdown.count("\n") == 6
    png = (out / "budget_sweep.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 5000
    runs = sorted(path.name for path in (out / "runs").iterdir())
    assert runs == ["bm25-0ms.trec", "bm25-1000ms.trec", "maxsim-0ms.trec", "maxsim-1000ms.trec"]
    assert evaluate(read_run(out / "runs" / "maxsim-0ms.trec"), QRELS, ["MRR@10"])["MRR@10"] == pytest.approx(
        bm25_metrics["MRR@10"])
    printed = capsys.readouterr().out
    assert "Calibration maxsim:" in printed and "| maxsim | 1000 |" in printed

    # With --max-queries, metrics average over the judged queries swept, not over all of the qrels.
    assert budget_main(["--index", str(tiny_index), "--topics", str(TOPICS), "--qrels", str(QRELS), "--rerankers",
                        "bm25", "--budgets", "0", "--max-queries", "2", "--output-dir", str(tmp_path / "two")]) == 0
    [row] = json.loads((tmp_path / "two" / "budget_sweep.json").read_text())["rows"]
    two_qrels = {qid: judgments for qid, judgments in read_qrels(QRELS).items() if qid in ("q1", "q2")}
    assert row["queries"] == 2 and row["metrics"] == pytest.approx(
        evaluate({qid: bm25_run[qid] for qid in ("q1", "q2")}, two_qrels, ["MRR@10", "nDCG@10"]).aggregate)


def test_sweep_command_errors(tiny_index, tiny_maxsim_dir, maxsim_sidecar, tmp_path, capsys):
    common = ["--index", str(tiny_index), "--topics", str(TOPICS), "--qrels", str(QRELS), "--output-dir",
              str(tmp_path / "out")]
    # Another document length is another store fingerprint: no sidecar for it, and the error says how to build it.
    assert budget_main(common + ["--rerankers", f"maxsim:{tiny_maxsim_dir}",
                                 "--model-arg", "maxsim:doc_max_length=32"]) == 2
    error = capsys.readouterr().err
    assert "python -m pyserini_mores.sidecar build" in error and "--model-arg doc_max_length=32" in error
    assert budget_main(common + ["--rerankers", "monot5"]) == 2
    assert "unknown reranker 'monot5'" in capsys.readouterr().err
    assert budget_main(common + ["--rerankers", "bm25", "--model-arg", "mores:reuse=s1"]) == 2
    assert "not among the rerankers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        budget_main(common + ["--budgets", "-5"])
    assert not (tmp_path / "out").exists()


def test_reranker_specs_and_scoped_model_args():
    scoped = parse_scoped_model_args(["reuse=s1", "mores:n_interaction_blocks=2", "tk:mode=online"])
    assert scoped == {None: {"reuse": "s1"}, "mores": {"n_interaction_blocks": 2}, "tk": {"mode": "online"}}
    specs = parse_reranker_specs(["bm25", "mores:ckpt/a", "mores:ckpt/b", "tk"], scoped)
    assert [(s.name, s.model, s.display) for s in specs] == [
        ("bm25", None, "bm25"), ("mores", "ckpt/a", "mores:a"), ("mores", "ckpt/b", "mores:b"), ("tk", None, "tk")]
    assert specs[0].overrides == {} and specs[1].overrides == {"reuse": "s1", "n_interaction_blocks": 2}
    assert specs[3].overrides == {"reuse": "s1", "mode": "online"}
    with pytest.raises(ValueError, match="not distinguishable"):
        parse_reranker_specs(["mores:x/a", "mores:y/a"])
    with pytest.raises(ValueError, match="no reranker name"):
        parse_reranker_specs([":ckpt"])


def test_plot_handles_zero_and_unlimited_budgets(tmp_path):
    def row(label, budget_ms, mrr):
        return SweepRow(label, budget_ms, 5.0, 5.0, 0, 10, 5.0, 0.0, 1.0, {"MRR@10": mrr, "nDCG@10": mrr / 2},
                        1.0, 1.0, 1.0, 1.0, 4)

    rows = [row("a", 0.0, 0.1), row("a", 25.0, 0.3), row("a", math.inf, 0.4), row("b", 0.0, 0.1), row("b", 25.0, 0.2)]
    path = plot_sweep(rows, tmp_path / "plot.png", title="test")
    assert path.read_bytes().startswith(PNG_SIGNATURE) and path.stat().st_size > 5000


def test_search_cli_time_budget(tiny_index, tiny_maxsim_dir, maxsim_sidecar, tmp_path, capsys):
    bm25_run, budgeted_run = tmp_path / "bm25.trec", tmp_path / "zero.trec"
    assert search_main(["--index", str(tiny_index), "--topics", str(TOPICS), "--output", str(bm25_run),
                        "--hits", "10"]) == 0
    assert search_main(["--index", str(tiny_index), "--topics", str(TOPICS), "--output", str(budgeted_run),
                        "--hits", "10", "--reranker", "maxsim", "--model", str(tiny_maxsim_dir),
                        "--rerank-depth", "10", "--time-budget-ms", "0"]) == 0
    strip_tag = lambda path: [line.rsplit(" ", 1)[0] for line in path.read_text().splitlines()]  # noqa: E731
    assert strip_tag(budgeted_run) == strip_tag(bm25_run)
    assert "Rerank depth under the 0 ms budget: median 0" in capsys.readouterr().out
    assert search_main(["--index", str(tiny_index), "--topics", str(TOPICS), "--hits", "10", "--reranker", "maxsim",
                        "--model", str(tiny_maxsim_dir), "--rerank-depth", "10", "--time-budget-ms", "500",
                        "--recalibrate"]) == 0
    assert "calibrated cost" in capsys.readouterr().out
