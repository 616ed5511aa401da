"""Metrics against hand calculations, averaging over judged queries, the non-inferiority test, and the eval CLI."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from pyserini_mores.eval import (
    DEFAULT_METRICS,
    canonical_metric_name,
    evaluate,
    format_metrics_table,
    non_inferiority,
    paired_t_test,
)
from pyserini_mores.eval.__main__ import main
from pyserini_mores.formats import FormatError, results_to_run, write_run
from pyserini_mores.types import RerankedHit

QRELS = {
    "q1": {"d1": 1, "d2": 0, "d3": 2},  # relevant: d1 (grade 1), d3 (grade 2)
    "q2": {"d5": 1},
    "q3": {"d9": 1},  # judged but missing from the run: counts 0
    "q4": {"d7": 0},  # nothing relevant: not a judged query, left out of every mean
}
RUN = {
    "q1": {"d2": 3.0, "d1": 2.0, "d4": 1.0, "d3": 0.5},  # ranks: d2, d1 (rel), d4, d3 (rel)
    "q2": {**{f"x{i:02d}": 20.0 - i for i in range(10)}, "d5": 5.0},  # the relevant d5 is at rank 11
    "q4": {"d7": 1.0},
    "q5": {"d1": 1.0},  # not in the qrels: ignored
}
LOG2_3, LOG2_5 = math.log2(3), math.log2(5)
NDCG10_Q1 = (1 / LOG2_3 + 2 / LOG2_5) / (2 / 1 + 1 / LOG2_3)  # gains are the grades; ideal order d3, d1


def test_metrics_match_hand_calculation():
    result = evaluate(RUN, QRELS)
    assert result.metrics == DEFAULT_METRICS
    assert result.num_queries == 3 and result.num_missing == 1 and result.num_unjudged == 2
    assert result.per_query["MRR@10"] == {"q1": 0.5, "q2": 0.0, "q3": 0.0}  # rank 11 is outside MRR@10
    assert result.aggregate["MRR@10"] == pytest.approx(0.5 / 3)
    assert result.per_query["nDCG@10"]["q1"] == pytest.approx(NDCG10_Q1)
    assert result.aggregate["nDCG@10"] == pytest.approx(NDCG10_Q1 / 3)
    # AP(q1) = (1/2 + 2/4) / 2; AP(q2) = 1/11.
    assert result.per_query["MAP"] == pytest.approx({"q1": 0.5, "q2": 1 / 11, "q3": 0.0})
    assert result.aggregate["MAP"] == pytest.approx((0.5 + 1 / 11) / 3)
    assert result.aggregate["R@100"] == pytest.approx(2 / 3)
    assert result.aggregate["R@1000"] == pytest.approx(2 / 3)
    assert result["mrr@10"] == result.aggregate["MRR@10"]


def test_mrr_without_cutoff_and_other_metrics():
    result = evaluate(RUN, QRELS, ["MRR", "MRR@11", "P@2", "ndcg_cut_10", "recip_rank", "R@3"])
    assert result.metrics == ("MRR", "MRR@11", "P@2", "nDCG@10", "recip_rank", "R@3")
    assert result.per_query["MRR"] == pytest.approx({"q1": 0.5, "q2": 1 / 11, "q3": 0.0})
    assert result.per_query["recip_rank"] == result.per_query["MRR"]  # no ties in RUN: the same
    assert result.per_query["MRR@11"]["q2"] == pytest.approx(1 / 11)
    assert result.aggregate["P@2"] == pytest.approx(0.5 / 3)
    assert result.aggregate["nDCG@10"] == pytest.approx(NDCG10_Q1 / 3)
    assert result.per_query["R@3"] == pytest.approx({"q1": 0.5, "q2": 0.0, "q3": 0.0})


def test_relevance_level_changes_relevant_documents_and_judged_queries():
    result = evaluate(RUN, QRELS, ["MRR@10", "MAP"], relevance_level=2)
    assert result.num_queries == 1  # only q1 has a grade-2 document
    assert result.aggregate == pytest.approx({"MRR@10": 0.25, "MAP": 0.25})


def test_mrr_breaks_score_ties_by_the_runs_order_and_trec_eval_by_docid():
    run = {"q": {"a": 1.0, "b": 1.0}}  # equal scores, "a" listed first
    assert evaluate(run, {"q": {"a": 1}}, ["MRR@10"]).aggregate["MRR@10"] == 1.0
    assert evaluate(run, {"q": {"b": 1}}, ["MRR@10"]).aggregate["MRR@10"] == 0.5
    # trec_eval (pytrec_eval, Pyserini's trec_eval) ranks ties by docid, descending: "b" first.
    assert evaluate(run, {"q": {"b": 1}}, ["recip_rank"]).aggregate["recip_rank"] == 1.0
    assert evaluate({"q": {"b": 1.0, "a": 1.0}}, {"q": {"b": 1}}, ["MRR@10"]).aggregate["MRR@10"] == 1.0
    # Scores still come first: a mapping need not be listed in score order.
    assert evaluate({"q": {"a": 1.0, "b": 2.0}}, {"q": {"b": 1}}, ["MRR@10"]).aggregate["MRR@10"] == 1.0


def test_mrr_equals_trec_eval_without_ties_and_recip_rank_is_trec_evals_with_them():
    import pytrec_eval

    rng = np.random.default_rng(7)
    distinct = {f"q{q}": {f"d{d}": float(score) for d, score in enumerate(rng.permutation(30))} for q in range(50)}
    tied = {qid: {docid: float(rng.integers(0, 4)) for docid in docs} for qid, docs in distinct.items()}
    qrels = {qid: {f"d{d}": 1 for d in rng.choice(30, size=2, replace=False)} for qid in distinct}
    for run, metric in ((distinct, "MRR"), (tied, "recip_rank")):
        ours = evaluate(run, qrels, [metric]).per_query[metric]
        theirs = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)
        assert ours == pytest.approx({qid: values["recip_rank"] for qid, values in theirs.items()})


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_mrr_of_a_run_file_follows_its_rank_column(tmp_path):
    qrels = {"q1": {"d2": 1}}
    # Both documents score 2.000000; d2 is ranked second. trec_eval's rule would put d2 first (docids descending).
    trec = _write(tmp_path / "run.trec", ["q1 Q0 d1 1 2.000000 t", "q1 Q0 d2 2 2.000000 t"])
    assert evaluate(trec, qrels, ["MRR@10"]).aggregate["MRR@10"] == 0.5
    assert evaluate(trec, qrels, ["recip_rank"]).aggregate["recip_rank"] == 1.0
    # The rank column, not the line order.
    shuffled = _write(tmp_path / "shuffled.trec", ["q1 Q0 d2 2 2.000000 t", "q1 Q0 d1 1 2.000000 t"])
    assert evaluate(shuffled, qrels, ["MRR@10"]).aggregate["MRR@10"] == 0.5
    msmarco = _write(tmp_path / "run.tsv", ["q1\td2\t2", "q1\td1\t1"])
    assert evaluate(msmarco, qrels, ["MRR@10"]).aggregate["MRR@10"] == 0.5


def test_mrr_cutoff_falls_between_tied_documents_by_rank(tmp_path):
    # Eleven documents with one score; the relevant "z" is ranked 11th: outside MRR@10 (trec_eval ranks it first).
    lines = [f"q1 Q0 d{rank:02d} {rank} 1.000000 t" for rank in range(1, 11)] + ["q1 Q0 z 11 1.000000 t"]
    result = evaluate(_write(tmp_path / "run.trec", lines), {"q1": {"z": 1}}, ["MRR@10", "MRR", "recip_rank"])
    assert result.aggregate == pytest.approx({"MRR@10": 0.0, "MRR": 1 / 11, "recip_rank": 1.0})


def test_mrr_in_memory_equals_mrr_of_the_written_file_when_scores_tie_after_rounding(tmp_path):
    hits = [RerankedHit("a", 1.0000002), RerankedHit("b", 1.0000001)]  # both written as 1.000000
    qrels = {"q1": {"a": 1}}
    path = tmp_path / "run.trec"
    write_run(path, [("q1", hits)])
    in_memory = evaluate(results_to_run([("q1", hits)]), qrels, ["MRR@10"]).aggregate["MRR@10"]
    assert in_memory == evaluate(path, qrels, ["MRR@10"]).aggregate["MRR@10"] == 1.0


def test_a_rank_column_that_contradicts_the_scores_is_reported(tmp_path, caplog):
    path = _write(tmp_path / "run.trec", ["q1 Q0 d1 1 1.000000 t", "q1 Q0 d2 2 5.000000 t"])
    result = evaluate(path, {"q1": {"d2": 1}}, ["MRR@10", "nDCG@10"])
    assert result.aggregate["MRR@10"] == 0.5  # by rank; nDCG by score puts d2 first
    assert result.aggregate["nDCG@10"] == 1.0
    assert "in 1 queries a document is ranked above one with a higher score" in caplog.text


def test_mrr_of_a_run_file_breaks_equal_ranks_by_score_then_docid_not_by_line_order(tmp_path):
    # Rank 1 twice: "b" scores higher, so it is first although "a" comes first in the file; rank 2 twice with equal
    # scores: docids descending, "d" before "c". The relevant document's place: 1/1, 1/2, 1/3, 1/4 by hand.
    lines = ["q1 Q0 a 1 1.000000 t", "q1 Q0 b 1 3.000000 t", "q1 Q0 c 2 0.500000 t", "q1 Q0 d 2 0.500000 t"]
    path = _write(tmp_path / "run.trec", lines)
    for relevant, expected in (("b", 1.0), ("a", 1 / 2), ("d", 1 / 3), ("c", 1 / 4)):
        assert evaluate(path, {"q1": {relevant: 1}}, ["MRR@10"]).aggregate["MRR@10"] == pytest.approx(expected)


def test_mrr_of_a_run_file_without_rank_information_is_trec_evals_recip_rank(tmp_path):
    # The same rank on every line (as some tools write): ranked as trec_eval ranks it, so MRR = recip_rank.
    lines = [f"q{q} Q0 d{d} 0 {score:.6f} t" for q in range(5) for d, score in enumerate([2.0, 1.0, 2.0, 1.0, 3.0])]
    path = _write(tmp_path / "run.trec", lines)
    qrels = {f"q{q}": {f"d{q}": 1} for q in range(5)}
    result = evaluate(path, qrels, ["MRR", "recip_rank"])
    # trec_eval's order: d4 (3.0), d2, d0 (2.0, docids descending), d3, d1 (1.0).
    assert result.per_query["MRR"] == result.per_query["recip_rank"] == \
        pytest.approx({"q0": 1 / 3, "q1": 1 / 5, "q2": 1 / 2, "q3": 1 / 4, "q4": 1.0})


@pytest.mark.parametrize("metrics", [["MRR@10"], ["nDCG@10"]])  # read with its ranks, and without
def test_evaluate_reports_a_malformed_rank_column(tmp_path, metrics):
    path = _write(tmp_path / "run.trec", ["q1 Q0 d1 1 2.0 t", "q1 Q0 d2 2nd 1.0 t"])
    with pytest.raises(FormatError, match=r"run\.trec, line 2: rank '2nd' is not an integer"):
        evaluate(path, {"q1": {"d1": 1}}, metrics)


def test_evaluate_reads_files(tmp_path):
    qrels_path = tmp_path / "qrels.txt"
    qrels_path.write_text("".join(f"{qid} 0 {docid} {grade}\n" for qid, docs in QRELS.items()
                                  for docid, grade in docs.items()))
    run_path = tmp_path / "run.trec"
    write_run(run_path, [(qid, [RerankedHit(docid, score) for docid, score in
                                sorted(docs.items(), key=lambda item: -item[1])]) for qid, docs in RUN.items()])
    assert evaluate(run_path, qrels_path).aggregate == pytest.approx(evaluate(RUN, QRELS).aggregate)


def test_evaluate_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown metric 'MRR@ten'"):
        evaluate(RUN, QRELS, ["MRR@ten"])
    with pytest.raises(ValueError, match="no document with relevance >= 1"):
        evaluate(RUN, {"q4": {"d7": 0}})
    with pytest.raises(ValueError, match="at least 1"):
        canonical_metric_name("nDCG@0")


@pytest.mark.parametrize("name, canonical", [
    ("mrr@10", "MRR@10"), ("NDCG@10", "nDCG@10"), ("ndcg_cut.10", "nDCG@10"), ("map", "MAP"), ("recall@1000", "R@1000"),
    ("recall_100", "R@100"), ("p@5", "P@5"), ("bpref", "bpref"), ("success_10", "success_10"),
])
def test_canonical_metric_names(name, canonical):
    assert canonical_metric_name(name) == canonical


# ------------------------------------------------------------------------------------------------ paired tests


def test_non_inferiority_accepts_a_close_candidate_and_rejects_a_worse_one():
    rng = np.random.default_rng(0)
    baseline = rng.uniform(0.2, 1.0, size=200)
    close = baseline + rng.normal(0.0, 0.01, size=200)
    worse = 0.8 * baseline + rng.normal(0.0, 0.01, size=200)
    accepted = non_inferiority(baseline, close, margin=0.02)
    rejected = non_inferiority(baseline, worse, margin=0.05)
    assert accepted.non_inferior and accepted.p_value < 1e-6 and accepted.statistic > 0
    assert accepted.verdict == "non-inferior"
    assert not rejected.non_inferior and rejected.p_value > 0.99
    assert rejected.verdict == "not shown non-inferior"
    assert accepted.num_queries == 200 and accepted.baseline_mean == pytest.approx(baseline.mean())


def test_non_inferiority_by_hand():
    """H0: mean(candidate) <= mean(baseline) - delta, delta = margin * mean(baseline), one-sided paired t-test of
    d = candidate - baseline against -delta: t = (mean(d) + delta) / (sd(d) / sqrt(n)), p = P(T_{n-1} >= t)."""
    baseline = [0.8, 0.6, 0.4, 0.2]  # mean 0.5
    # d = [0.1, -0.1, 0.1, -0.1]: mean 0, sd = sqrt(4 * 0.01 / 3), sd / sqrt(4) = sqrt(1 / 300).
    result = non_inferiority(baseline, [0.9, 0.5, 0.5, 0.1], margin=0.02)
    assert result.delta == pytest.approx(0.01)
    assert result.statistic == pytest.approx(0.01 * math.sqrt(300))  # = sqrt(3) / 10
    assert result.p_value == pytest.approx(stats.t.sf(math.sqrt(3) / 10, df=3))
    assert not result.non_inferior  # p ≈ 0.44
    # d = [0, -0.1, 0, -0.1]: mean -0.05, sd = sqrt(4 * 0.0025 / 3), sd / sqrt(4) = sqrt(1 / 1200).
    candidate = [0.8, 0.5, 0.4, 0.1]
    for margin, t in ((0.05, (-0.05 + 0.025) * math.sqrt(1200)), (0.2, (-0.05 + 0.1) * math.sqrt(1200))):
        result = non_inferiority(baseline, candidate, margin=margin)
        assert result.statistic == pytest.approx(t)  # -sqrt(3) / 2, then sqrt(3)
        assert result.p_value == pytest.approx(stats.t.sf(t, df=3))
        d = np.subtract(candidate, baseline)
        same = stats.ttest_1samp(d, -margin * np.mean(baseline), alternative="greater")
        assert (result.statistic, result.p_value) == pytest.approx((same.statistic, same.pvalue))
    # δ is a constant of the baseline mean, not a per-query (1 - margin) * baseline: that test's t differs.
    per_query = (1 - 0.05) * np.array(baseline) - np.array(candidate)
    assert abs(non_inferiority(baseline, candidate, margin=0.05).statistic) != pytest.approx(
        abs(per_query.mean() / (per_query.std(ddof=1) / 2)))


def test_non_inferiority_margin_matters():
    rng = np.random.default_rng(1)
    baseline = rng.uniform(0.1, 1.0, size=40)
    candidate = 0.97 * baseline  # loses exactly 3% on every query
    assert not non_inferiority(baseline, candidate, margin=0.02).non_inferior
    assert non_inferiority(baseline, candidate, margin=0.05).non_inferior


def test_non_inferiority_pairs_mappings_by_qid():
    baseline = {"a": 0.5, "b": 1.0, "c": 0.2, "d": 0.9}
    candidate = {"d": 0.88, "c": 0.25, "b": 0.97, "a": 0.5}  # another order
    by_qid = non_inferiority(baseline, candidate)
    by_position = non_inferiority([0.5, 1.0, 0.2, 0.9], [0.5, 0.97, 0.25, 0.88])
    assert by_qid.p_value == pytest.approx(by_position.p_value)
    with pytest.raises(ValueError, match="different queries"):
        non_inferiority(baseline, {"a": 0.5})


def test_non_inferiority_degenerate_inputs():
    identical_constant = non_inferiority([0.5] * 5, [0.5] * 5, margin=0.02)  # zero variance: certain
    assert identical_constant.non_inferior and identical_constant.p_value == 0.0
    single = non_inferiority([0.5], [0.4])
    assert math.isnan(single.p_value) and not single.non_inferior


def test_paired_t_test_matches_scipy():
    rng = np.random.default_rng(2)
    first, second = rng.uniform(size=30), rng.uniform(size=30)
    expected = stats.ttest_rel(first, second)
    result = paired_t_test(first, second)
    assert result.statistic == pytest.approx(expected.statistic)
    assert result.p_value == pytest.approx(expected.pvalue)
    assert result.mean_difference == pytest.approx((first - second).mean())
    greater = paired_t_test(first, second, alternative="greater")
    assert greater.p_value == pytest.approx(stats.ttest_rel(first, second, alternative="greater").pvalue)


# ------------------------------------------------------------------------------------------------------ tables


def test_format_metrics_table():
    table = format_metrics_table([("BM25", {"MRR@10": 0.18739, "queries": "6980/6980"}),
                                  ("MORES", {"MRR@10": 0.34561, "queries": "6980/6980"})])
    assert table == ("run    MRR@10    queries\n"
                     "BM25   0.1874  6980/6980\n"
                     "MORES  0.3456  6980/6980")
    result = evaluate(RUN, QRELS, ["MRR@10"])
    assert format_metrics_table([("x", result)], digits=3) == "run  MRR@10  queries\nx     0.167      2/3"
    assert format_metrics_table([("x", {"a": float("nan")})]) == "run  a\nx    -"


# --------------------------------------------------------------------------------------------------------- CLI


@pytest.fixture
def cli_files(tmp_path):
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"q{i} 0 rel{i} 1\n" for i in range(30)))
    rng = np.random.default_rng(3)

    def run_file(name: str, relevant_rank) -> Path:
        path = tmp_path / name
        results = []
        for i in range(30):
            docids = [f"other{j}" for j in range(20)]
            docids.insert(relevant_rank(i) - 1, f"rel{i}")
            results.append((f"q{i}", [RerankedHit(docid, 100.0 - rank) for rank, docid in enumerate(docids)]))
        write_run(path, results)
        return path

    baseline = run_file("bm25.trec", lambda i: int(rng.integers(1, 4)))
    better = run_file("mores.trec", lambda i: 1)
    worse = run_file("bad.trec", lambda i: 15)  # relevant at rank 15: MRR@10 = 0
    return qrels, baseline, better, worse


def test_cli_prints_one_row_per_run(cli_files, capsys):
    qrels, baseline, better, worse = cli_files
    assert main(["--qrels", str(qrels), str(better), str(worse), "--metrics", "MRR@10,nDCG@10", "R@100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "MRR@10", "nDCG@10", "R@100", "queries"]
    assert lines[1].split() == ["mores.trec", "1.0000", "1.0000", "1.0000", "30/30"]
    assert lines[2].split()[:2] == ["bad.trec", "0.0000"] and lines[2].split()[3:] == ["1.0000", "30/30"]
    assert len(lines) == 3


def test_cli_non_inferiority_and_json(cli_files, capsys, tmp_path):
    qrels, baseline, better, worse = cli_files
    json_path = tmp_path / "out" / "eval.json"
    assert main(["--qrels", str(qrels), str(better), str(worse), "--baseline", str(baseline),
                 "--metrics", "nDCG@10", "--json", str(json_path)]) == 0
    out = capsys.readouterr().out
    table, comparison = out.split("\n\n")
    assert [line.split()[0] for line in table.splitlines()] == ["run", "bm25.trec", "mores.trec", "bad.trec"]
    assert "Non-inferiority vs bm25.trec on MRR@10" in comparison
    header, better_row, worse_row = comparison.splitlines()[1:]
    assert header.split() == ["run", "MRR@10", "baseline", "change", "p@2%", "NI@2%", "p@5%", "NI@5%"]
    assert better_row.split()[0] == "mores.trec" and better_row.split()[5::2] == ["yes", "yes"]
    assert worse_row.split()[0] == "bad.trec" and worse_row.split()[5::2] == ["no", "no"]

    report = json.loads(json_path.read_text())
    assert report["baseline"] == "bm25.trec" and report["test_metric"] == "MRR@10"
    assert report["runs"]["mores.trec"]["aggregate"] == {"nDCG@10": 1.0, "MRR@10": 1.0}
    assert len(report["runs"]["bad.trec"]["per_query"]["MRR@10"]) == 30
    tests = report["non_inferiority"]["mores.trec"]
    assert [test["margin"] for test in tests] == [0.02, 0.05] and all(test["non_inferior"] for test in tests)


def test_cli_reports_a_malformed_run_with_its_line(cli_files, capsys, tmp_path):
    qrels = cli_files[0]
    broken = tmp_path / "broken.trec"
    broken.write_text("q0 Q0 rel0 1 1.0 t\nq0 Q0 other 2 oops t\n")
    assert main(["--qrels", str(qrels), str(broken)]) == 2
    assert "broken.trec, line 2: score 'oops' is not a number" in capsys.readouterr().err


def test_cli_rejects_unknown_metric(cli_files, capsys):
    qrels, baseline = cli_files[:2]
    with pytest.raises(SystemExit) as exit_info:
        main(["--qrels", str(qrels), "--metrics", "MRR@10", str(baseline)])  # --metrics swallowed the run
    assert exit_info.value.code == 2
    assert "put run files before --metrics" in capsys.readouterr().err
