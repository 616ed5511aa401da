"""Retrieval metrics averaged over every judged query (pytrec_eval + MS MARCO's MRR@10), and the paired t-tests the
MORES paper uses to call a faster reranker non-inferior to a slower one.

Averaging: every metric is the mean over the queries of the qrels that have at least one relevant document; a judged
query the run does not answer counts 0, and run queries without judgments are ignored. This is how MS MARCO's official
``msmarco_eval.py`` averages MRR@10 and what ``trec_eval -c`` does, and it differs from pytrec_eval (and plain
trec_eval), which average over the queries present in both the run and the qrels: a run that drops its hardest
queries would otherwise look better. Unlike ``trec_eval -c``, queries whose judgments are all non-relevant are left
out, as MS MARCO does.

Ranking: MRR takes each query's documents in the run's own order, as MS MARCO's ``msmarco_eval.py`` does. A run file
is ranked as :func:`~pyserini_mores.formats.read_ranked_run` orders it: by its rank column (the rule, ties included,
is stated there). A run given as a mapping is ranked by score, descending, equal scores in the mapping's order,
which is the rank order in the runs :func:`~pyserini_mores.formats.read_run` and
:func:`~pyserini_mores.formats.results_to_run` return: a searcher's hits and the file written from them get the same
MRR even where scores tie after rounding to the file's 6 decimals. The other metrics come from pytrec_eval, which
ignores the rank column and orders by score, then docid, both descending (trec_eval's rule, also that of Pyserini's
``trec_eval``): where scores tie, MRR can differ from trec_eval's ``recip_rank``, which is available under that name.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from ..formats import read_qrels, read_ranked_run, read_run

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_METRICS",
    "EvaluationResult",
    "NonInferiorityResult",
    "PairedTestResult",
    "canonical_metric_name",
    "evaluate",
    "format_metrics_table",
    "non_inferiority",
    "paired_t_test",
]

DEFAULT_METRICS: tuple[str, ...] = ("MRR@10", "nDCG@10", "MAP", "R@100", "R@1000")

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]
PerQuery = Union[Mapping[str, float], Sequence[float]]

# Display names for parameterised pytrec_eval measures, so that "ndcg_cut_10" and "nDCG@10" are the same column.
_TREC_DISPLAY = {"ndcg_cut": "nDCG@{}", "recall": "R@{}", "P": "P@{}", "map_cut": "MAP@{}"}
_NON_NUMERIC_MEASURES = {"runid", "relstring"}


@dataclass(frozen=True)
class _Metric:
    name: str  # display name, the key of every result dict
    trec_measure: str | None = None  # what pytrec_eval is asked for; None for MRR, computed here
    trec_key: str | None = None  # key of the measure in pytrec_eval's per-query dicts
    cutoff: int | None = None  # MRR cutoff; None means the full ranking


def _cutoff(text: str, name: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"metric {name!r}: the cutoff must be at least 1")
    return value


def _resolve_metric(name: str) -> _Metric:
    text = name.strip()
    if match := re.fullmatch(r"(?:mrr|rr)(?:@(\d+))?", text, re.IGNORECASE):
        if match.group(1) is None:
            return _Metric("MRR")
        k = _cutoff(match.group(1), name)
        return _Metric(f"MRR@{k}", cutoff=k)
    if match := re.fullmatch(r"ndcg(?:@(\d+))?", text, re.IGNORECASE):
        if match.group(1) is None:
            return _Metric("nDCG", "ndcg", "ndcg")
        k = _cutoff(match.group(1), name)
        return _Metric(f"nDCG@{k}", f"ndcg_cut.{k}", f"ndcg_cut_{k}")
    if match := re.fullmatch(r"map(?:@(\d+))?", text, re.IGNORECASE):
        if match.group(1) is None:
            return _Metric("MAP", "map", "map")
        k = _cutoff(match.group(1), name)
        return _Metric(f"MAP@{k}", f"map_cut.{k}", f"map_cut_{k}")
    if match := re.fullmatch(r"(?:r|recall)@(\d+)", text, re.IGNORECASE):
        k = _cutoff(match.group(1), name)
        return _Metric(f"R@{k}", f"recall.{k}", f"recall_{k}")
    if match := re.fullmatch(r"(?:p|precision)@(\d+)", text, re.IGNORECASE):
        k = _cutoff(match.group(1), name)
        return _Metric(f"P@{k}", f"P.{k}", f"P_{k}")
    # Any other pytrec_eval measure, by its trec_eval name: "bpref", "recip_rank", "success_10", "ndcg_cut.20".
    import pytrec_eval

    match = re.fullmatch(r"([A-Za-z0-9_]+?)(?:[._](\d+))?", text)
    if match and match.group(1) in pytrec_eval.supported_measures and match.group(1) not in _NON_NUMERIC_MEASURES:
        base, k = match.group(1), match.group(2)
        if k is None:
            return _Metric(base, base, base)
        k = str(_cutoff(k, name))
        display = _TREC_DISPLAY.get(base, base + "_{}").format(k)
        return _Metric(display, f"{base}.{k}", f"{base}_{k}")
    raise ValueError(f"unknown metric {name!r}: use MRR@k, nDCG@k, nDCG, MAP, MAP@k, R@k, P@k, or a pytrec_eval "
                     f"measure such as recip_rank, bpref, ndcg_cut_10")


def canonical_metric_name(name: str) -> str:
    """The display name of a metric: ``"mrr@10"`` → ``"MRR@10"``, ``"ndcg_cut_10"`` → ``"nDCG@10"``.

    Raises:
        ValueError: an unknown metric.
    """
    return _resolve_metric(name).name


@dataclass(frozen=True)
class EvaluationResult:
    """Metrics of one run against one set of qrels.

    Attributes:
        aggregate: metric name → mean over the judged queries.
        per_query: metric name → {qid → value} for every judged query, in qrels order (0 for unanswered ones).
        num_queries: judged queries (with at least one relevant document): the denominator of every mean.
        num_missing: judged queries absent from the run (each counted 0).
        num_unjudged: run queries without any relevant judgment (ignored).
        relevance_level: the lowest relevance grade counted as relevant.
    """

    aggregate: dict[str, float]
    per_query: dict[str, dict[str, float]]
    num_queries: int
    num_missing: int = 0
    num_unjudged: int = 0
    relevance_level: int = 1

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(self.aggregate)

    def __getitem__(self, metric: str) -> float:
        """The aggregate value of ``metric`` (any spelling :func:`canonical_metric_name` accepts)."""
        return self.aggregate[canonical_metric_name(metric)]

    def table_row(self) -> dict[str, Any]:
        """The values :func:`format_metrics_table` shows: the metrics plus ``queries`` (answered/judged)."""
        return {**self.aggregate, "queries": f"{self.num_queries - self.num_missing}/{self.num_queries}"}

    def to_dict(self, *, per_query: bool = True) -> dict[str, Any]:
        """A JSON-ready dict (non-finite values written as ``None``)."""
        result: dict[str, Any] = {
            "aggregate": {name: _json_float(value) for name, value in self.aggregate.items()},
            "num_queries": self.num_queries,
            "num_missing": self.num_missing,
            "num_unjudged": self.num_unjudged,
            "relevance_level": self.relevance_level,
        }
        if per_query:
            result["per_query"] = {name: {qid: _json_float(value) for qid, value in values.items()}
                                   for name, values in self.per_query.items()}
        return result


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN or infinity


def _by_score(scores: Mapping[str, float], cutoff: int | None) -> list[str]:
    """The top ``cutoff`` docids (all with ``None``) by score, descending; equal scores keep the mapping's order."""
    descending = lambda docid: -scores[docid]  # noqa: E731
    # Both are stable: nsmallest(n, ...) is sorted(...)[:n].
    return heapq.nsmallest(cutoff, scores, key=descending) if cutoff is not None else sorted(scores, key=descending)


def _reciprocal_rank(ranked: Iterable[str], relevant: set[str], cutoff: int | None) -> float:
    for rank, docid in enumerate(itertools.islice(ranked, cutoff), start=1):
        if docid in relevant:
            return 1.0 / rank
    return 0.0


def _warn_if_ranks_contradict_scores(path: str | os.PathLike[str], ranked_run: Run) -> None:
    """Warn about the queries of a run file (hits in rank order) that rank a document above a better one."""
    contradicting = sum(1 for hits in ranked_run.values()
                        if any(hits[above] < hits[below] for above, below in itertools.pairwise(hits)))
    if contradicting:
        logger.warning("%s: in %d queries a document is ranked above one with a higher score; MRR follows the rank "
                       "column (as msmarco_eval.py does), the other metrics the scores (as trec_eval does)",
                       os.fspath(path), contradicting)


def evaluate(
    run: Run | str | os.PathLike[str],
    qrels: Qrels | str | os.PathLike[str],
    metrics: Iterable[str] = DEFAULT_METRICS,
    *,
    relevance_level: int = 1,
) -> EvaluationResult:
    """Evaluate a run, averaging every metric over all judged queries (see the module docstring).

    Args:
        run: qid → {docid → score} (higher is better; for MRR, equal scores rank in the mapping's order), or a run
            file path (TREC or MS MARCO format; MRR ranks it as :func:`~pyserini_mores.formats.read_ranked_run` does).
        qrels: qid → {docid → relevance}, or a TREC qrels file path.
        metrics: metric names, e.g. ``DEFAULT_METRICS`` = MRR@10, nDCG@10, MAP, R@100, R@1000.
        relevance_level: documents judged at least this are relevant (MRR, MAP, recall, P); nDCG uses the grades.

    Returns:
        Aggregate and per-query values, keyed by the metrics' display names.

    Raises:
        ValueError: an unknown metric, or qrels without any relevant document.

    Example:
        >>> evaluate({"q1": {"d1": 2.0, "d2": 1.0}}, {"q1": {"d2": 1}}, ["MRR@10"]).aggregate
        {'MRR@10': 0.5}
    """
    resolved: dict[str, _Metric] = {}
    for name in metrics:
        metric = _resolve_metric(name)
        resolved.setdefault(metric.name, metric)
    if not resolved:
        raise ValueError("no metrics requested")
    in_rank_order = False  # for MRR: each query's mapping iterates in the run file's rank order
    if isinstance(run, (str, os.PathLike)):
        path = run
        if any(metric.trec_measure is None for metric in resolved.values()):
            run = {qid: dict(hits) for qid, hits in read_ranked_run(path).items()}
            in_rank_order = True
            _warn_if_ranks_contradict_scores(path, run)
        else:
            run = read_run(path)
    if isinstance(qrels, (str, os.PathLike)):
        qrels = read_qrels(qrels)

    relevant = {qid: {docid for docid, grade in judgments.items() if grade >= relevance_level}
                for qid, judgments in qrels.items()}
    judged = [qid for qid, docids in relevant.items() if docids]
    if not judged:
        raise ValueError(f"the qrels have no document with relevance >= {relevance_level}")
    answered = [qid for qid in judged if run.get(qid)]
    num_missing = len(judged) - len(answered)
    judged_set = set(judged)
    num_unjudged = sum(1 for qid in run if qid not in judged_set)
    if num_missing:
        logger.warning("%d of %d judged queries are missing from the run; they count as 0", num_missing, len(judged))
    if num_unjudged:
        logger.info("%d run queries have no relevant judgments and are ignored", num_unjudged)

    trec_metrics = [metric for metric in resolved.values() if metric.trec_measure is not None]
    trec_values: dict[str, dict[str, float]] = {}
    if trec_metrics and answered:
        import pytrec_eval

        evaluator = pytrec_eval.RelevanceEvaluator(
            {qid: {docid: int(grade) for docid, grade in qrels[qid].items()} for qid in judged},
            {metric.trec_measure for metric in trec_metrics},
            relevance_level=relevance_level,
        )
        trec_values = evaluator.evaluate(
            {qid: {docid: float(score) for docid, score in run[qid].items()} for qid in answered})

    per_query: dict[str, dict[str, float]] = {}
    for metric in resolved.values():
        values: dict[str, float] = {}
        for qid in judged:
            if metric.trec_measure is None:
                if qid not in run:
                    values[qid] = 0.0
                    continue
                ranked = run[qid] if in_rank_order else _by_score(run[qid], metric.cutoff)
                values[qid] = _reciprocal_rank(ranked, relevant[qid], metric.cutoff)
            else:
                values[qid] = float(trec_values.get(qid, {}).get(metric.trec_key, 0.0))
        per_query[metric.name] = values
    aggregate = {name: math.fsum(values.values()) / len(judged) for name, values in per_query.items()}
    return EvaluationResult(aggregate=aggregate, per_query=per_query, num_queries=len(judged),
                            num_missing=num_missing, num_unjudged=num_unjudged, relevance_level=relevance_level)


# ------------------------------------------------------------------------------------------------ paired tests


@dataclass(frozen=True)
class PairedTestResult:
    """A paired t-test over per-query values.

    Attributes:
        statistic: the t statistic of ``first - second``.
        p_value: for the requested ``alternative``; NaN with fewer than 2 queries.
        mean_difference: mean of ``first - second``.
        num_queries: number of pairs.
        alternative: ``"two-sided"``, ``"greater"`` (first better) or ``"less"``.
    """

    statistic: float
    p_value: float
    mean_difference: float
    num_queries: int
    alternative: str = "two-sided"


@dataclass(frozen=True)
class NonInferiorityResult:
    """The MORES non-inferiority test of a candidate against a baseline.

    Attributes:
        margin: the tolerated relative loss (0.02 = 2% of the baseline mean).
        statistic: t statistic of the per-query differences ``candidate - baseline`` against ``-delta``; positive
            favours the candidate.
        p_value: one-sided p-value of H0 "mean(candidate) <= mean(baseline) - delta".
        non_inferior: ``p_value < alpha``: H0 rejected, the candidate is non-inferior within the margin.
        alpha: the significance level.
        baseline_mean: mean baseline value.
        candidate_mean: mean candidate value.
        num_queries: number of paired queries.
        delta: the tolerated absolute loss, ``margin * baseline_mean``.
    """

    margin: float
    statistic: float
    p_value: float
    non_inferior: bool
    alpha: float
    baseline_mean: float
    candidate_mean: float
    num_queries: int
    delta: float

    @property
    def verdict(self) -> str:
        return "non-inferior" if self.non_inferior else "not shown non-inferior"


def _paired_arrays(first: PerQuery, second: PerQuery):
    import numpy as np

    if isinstance(first, Mapping) != isinstance(second, Mapping):
        raise TypeError("pass both per-query values as mappings qid → value, or both as sequences")
    if isinstance(first, Mapping):
        if first.keys() != second.keys():
            only_first, only_second = first.keys() - second.keys(), second.keys() - first.keys()
            raise ValueError(f"the per-query values cover different queries ({len(only_first)} only in the first, "
                             f"{len(only_second)} only in the second, e.g. {sorted(only_first | only_second)[:3]})")
        qids = list(first)
        return (np.array([first[qid] for qid in qids], dtype=np.float64),
                np.array([second[qid] for qid in qids], dtype=np.float64))
    if len(first) != len(second):
        raise ValueError(f"paired values must have the same length, got {len(first)} and {len(second)}")
    return np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)


def _one_sample_t(differences, alternative: str, null_mean: float = 0.0) -> tuple[float, float]:
    """t statistic and p-value of H0 mean(differences) = ``null_mean`` (or ≤ for ``"greater"``, ≥ for ``"less"``)."""
    import numpy as np
    from scipy import stats

    if len(differences) < 2:
        return math.nan, math.nan
    if np.all(differences == differences[0]):
        # Zero variance: scipy returns NaN, but the answer is certain: the mean is known exactly.
        mean = float(differences[0]) - null_mean
        statistic = math.copysign(math.inf, mean) if mean else math.nan
        if alternative == "two-sided":
            return statistic, 0.0 if mean else 1.0
        favoured = mean > 0 if alternative == "greater" else mean < 0
        return statistic, 0.0 if favoured else 1.0
    result = stats.ttest_1samp(differences, null_mean, alternative=alternative)
    return float(result.statistic), float(result.pvalue)


def paired_t_test(first: PerQuery, second: PerQuery, *, alternative: str = "two-sided") -> PairedTestResult:
    """Paired t-test of per-query values (the same as ``scipy.stats.ttest_rel(first, second)``).

    Args:
        first: qid → value (paired by qid with ``second``), or a sequence (paired by position).
        second: the same shape as ``first``.
        alternative: ``"two-sided"``, ``"greater"`` (H1: first is better) or ``"less"``.
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be 'two-sided', 'greater' or 'less', not {alternative!r}")
    first_values, second_values = _paired_arrays(first, second)
    differences = first_values - second_values
    statistic, p_value = _one_sample_t(differences, alternative)
    mean = float(differences.mean()) if len(differences) else math.nan
    return PairedTestResult(statistic, p_value, mean, len(differences), alternative)


def non_inferiority(
    baseline_per_query: PerQuery,
    candidate_per_query: PerQuery,
    margin: float = 0.02,
    *,
    alpha: float = 0.05,
) -> NonInferiorityResult:
    """Test whether a candidate is non-inferior to a baseline within a relative margin, as the MORES paper defines it
    (Gao, Dai, Callan 2020).

    H0: mean(candidate) ≤ mean(baseline) − δ, with the constant δ = ``margin``·mean(baseline); H1: the candidate loses
    less than δ. A one-sided paired t-test of the per-query differences d = candidate − baseline against −δ:
    t = (mean(d) + δ) / (sd(d) / √n), with sd the sample standard deviation, and p = P(T ≥ t) for Student's t with
    n − 1 degrees of freedom.

    Args:
        baseline_per_query: qid → value (e.g. ``EvaluationResult.per_query["MRR@10"]``), or a sequence.
        candidate_per_query: the same shape and queries as the baseline.
        margin: the tolerated relative loss; the paper reports 2% and 5%.
        alpha: significance level of the verdict.

    Returns:
        The statistic, the p-value and the verdict ``non_inferior = p_value < alpha``.
    """
    if not 0 <= margin < 1:
        raise ValueError(f"margin is a fraction of the baseline in [0, 1), got {margin}")
    baseline, candidate = _paired_arrays(baseline_per_query, candidate_per_query)
    baseline_mean = float(baseline.mean()) if len(baseline) else math.nan
    delta = margin * baseline_mean
    statistic, p_value = _one_sample_t(candidate - baseline, "greater", null_mean=-delta)
    return NonInferiorityResult(
        margin=margin, statistic=statistic, p_value=p_value, non_inferior=bool(p_value < alpha), alpha=alpha,
        baseline_mean=baseline_mean, candidate_mean=float(candidate.mean()) if len(candidate) else math.nan,
        num_queries=len(baseline), delta=delta,
    )


# ------------------------------------------------------------------------------------------------------- tables


def _cell(value: Any, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def format_metrics_table(
    rows: Iterable[tuple[str, EvaluationResult | Mapping[str, Any]]],
    columns: Sequence[str] | None = None,
    *,
    digits: int = 4,
    header: str = "run",
) -> str:
    """Format rows of metrics as a fixed-width text table (no trailing newline).

    Args:
        rows: ``(row name, values)``; values are an :class:`EvaluationResult` (its metrics and a ``queries`` column)
            or a mapping column → value (floats get ``digits`` decimals, other values are shown as they are).
        columns: the columns to show, in order; by default every column of the rows, in first-seen order.
        digits: decimals of float values.
        header: the title of the name column.

    Example:
        >>> print(format_metrics_table([("BM25", {"MRR@10": 0.1874}), ("MORES", {"MRR@10": 0.3456})]))
        run    MRR@10
        BM25   0.1874
        MORES  0.3456
    """
    table = [(name, values.table_row() if isinstance(values, EvaluationResult) else dict(values))
             for name, values in rows]
    if columns is None:
        columns = list(dict.fromkeys(column for _, values in table for column in values))
    lines = [[header, *columns]] + [[name, *(_cell(values.get(column), digits) for column in columns)]
                                    for name, values in table]
    widths = [max(len(line[index]) for line in lines) for index in range(len(lines[0]))]
    # Names left-aligned, values right-aligned so that decimals line up; two spaces between columns.
    return "\n".join(
        "  ".join([line[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(line[1:], widths[1:])])
        .rstrip()
        for line in lines
    )
