"""The time-budget sweep: for every reranker × budget, rerank a query set under that budget and record the depths
chosen, the effectiveness (MRR@10, nDCG@10) and the measured rerank time; then a table, JSON and a plot.

Queries are the outer loop and every reranker × budget is run on a query before the next one, so that load from
other processes on the machine falls on every configuration alike. BM25 runs once per batch of queries and its hits
are shared by every configuration.
"""
from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .._io import write_text_atomic
from ..eval.metrics import evaluate
from ..formats import results_to_run
from ..search.topic_search import percentile as _percentile
from ..types import first_stage_hits

logger = logging.getLogger(__name__)

SWEEP_METRICS = ("MRR@10", "nDCG@10")
OUTPUT_STEM = "budget_sweep"


@dataclass(frozen=True)
class RerankerSpec:
    """One line of the sweep: a registered reranker, its model (``None``: the factory's default) and config
    overrides. ``label`` names it in the table and plot."""

    name: str
    model: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def display(self) -> str:
        return self.label or self.name


def parse_reranker_specs(specs: Sequence[str], model_args: dict[str | None, dict[str, Any]] | None = None
                         ) -> list[RerankerSpec]:
    """``["bm25", "mores:ckpt/mores"]`` → specs. ``model_args`` maps a reranker name (or ``None``: every learned
    reranker) to config overrides. Two specs of the same reranker are labelled by their model's name."""
    model_args = model_args or {}
    parsed = []
    for text in specs:
        name, _, model = text.partition(":")
        if not name:
            raise ValueError(f"reranker spec '{text}' has no reranker name (expected NAME or NAME:MODEL)")
        overrides = {} if name == "bm25" else {**model_args.get(None, {}), **model_args.get(name, {})}
        parsed.append(RerankerSpec(name, model or None, overrides))
    unknown = set(model_args) - {None} - {spec.name for spec in parsed}
    if unknown:
        raise ValueError(f"--model-arg for {', '.join(sorted(unknown))}, which is not among the rerankers")
    names = [spec.name for spec in parsed]
    labelled = []
    for spec in parsed:
        label = spec.name
        if names.count(spec.name) > 1:
            label = f"{spec.name}:{Path(spec.model).name if spec.model else 'default'}"
        labelled.append(RerankerSpec(spec.name, spec.model, spec.overrides, label))
    labels = [spec.label for spec in labelled]
    if len(set(labels)) < len(labels):
        raise ValueError(f"rerankers {', '.join(specs)} are not distinguishable by name and model")
    return labelled


@dataclass
class SweepRow:
    """One reranker × budget: depths (candidates given to the reranker per query, from the cost model, and those
    scored before the deadline), effectiveness, and the measured rerank time per query against the budget."""

    reranker: str
    budget_ms: float
    depth_mean: float
    depth_median: float
    depth_min: int
    depth_max: int
    scored_mean: float  # candidates scored per query: the depth, less what the deadline cut
    deadline_cut: float  # fraction of queries whose scoring the deadline stopped before the depth
    predicted_ms: float
    metrics: dict[str, float]
    p50_ms: float
    p95_ms: float
    p99_ms: float
    within_budget: float  # fraction of queries whose rerank stage took at most the budget
    queries: int
    over_budget: int = 0  # queries whose rerank stage took longer than the budget

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["budget_ms"] = _json_number(self.budget_ms)
        return values


@dataclass
class SweepResult:
    rows: list[SweepRow]
    calibrations: dict[str, Any]  # label → Calibration
    settings: dict[str, Any]
    runs: dict[tuple[str, float], dict[str, list]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings,
                "calibrations": {label: cal.to_dict() for label, cal in self.calibrations.items()},
                "rows": [row.to_dict() for row in self.rows]}


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else "inf"  # JSON has no infinity


def run_sweep(searchers: dict[str, Any], topics: dict[str, str], qrels: dict[str, dict[str, int]],
              budgets: Sequence[float], *, hits: int = 100, batch_size: int = 16, threads: int = 1,
              recalibrate: bool = False, keep_runs: bool = False, progress: bool = True, cold_cache: bool = False,
              settings: dict[str, Any] | None = None) -> SweepResult:
    """Rerank ``topics`` with every searcher (label → :class:`~pyserini_mores.search.RerankingSearcher`) under
    every budget (ms per query, rerank stage only) and evaluate against ``qrels``.

    Each searcher is calibrated once (from the cache unless ``recalibrate``) before any query is timed; every
    query goes through :meth:`~pyserini_mores.search.RerankingSearcher.rerank_hits` with each budget in turn.
    ``cold_cache``: every rerank starts with the sidecar evicted from the page cache, as a query whose candidates
    no earlier query read, and the calibration is measured so too.
    """
    if not searchers:
        raise ValueError("no rerankers to sweep")
    if any(not budget >= 0 for budget in budgets):
        raise ValueError(f"budgets must be >= 0 ms, got {list(budgets)}")
    budgets = list(dict.fromkeys(float(budget) for budget in budgets))
    # Metrics average over the judged queries that were swept (not over every query of the qrels).
    qrels = {qid: judgments for qid, judgments in qrels.items() if qid in topics}
    if not any(grade > 0 for judgments in qrels.values() for grade in judgments.values()):
        raise ValueError("none of the topics has a relevant document in the qrels")
    calibrations = {}
    for label, searcher in searchers.items():
        calibrations[label] = searcher.calibrate(recalibrate=recalibrate, cold_cache=cold_cache)
        logger.info("%s: %s", label, calibrations[label].describe())

    configs = [(label, budget) for label in searchers for budget in budgets]
    results = {config: {} for config in configs}
    depths = {config: [] for config in configs}
    scored = {config: [] for config in configs}
    times = {config: [] for config in configs}
    first = next(iter(searchers.values()))
    depth = max(hits, max(searcher.rerank_depth for searcher in searchers.values()))
    qids = list(topics)
    bar = tqdm(total=len(qids), unit="query", desc="budget sweep", disable=not progress)
    for start in range(0, len(qids), batch_size):
        batch = qids[start:start + batch_size]
        first_stage = first.first_stage([topics[qid] for qid in batch], batch, k=depth, threads=threads)
        for qid in batch:
            # Plain Python hits, shared by every configuration (the reranking never mutates its input hits).
            candidates = first_stage_hits(first_stage.get(qid, []))
            for label, budget in configs:
                if cold_cache:
                    _evict_sidecar(searchers[label])
                ranked, stats = searchers[label].rerank_hits(topics[qid], candidates, time_budget_ms=budget)
                results[label, budget][qid] = ranked[:hits]
                depths[label, budget].append(stats.depth)
                scored[label, budget].append(stats.scored)
                times[label, budget].append(stats.rerank_ms)
            bar.update(1)
    bar.close()

    # A cost model the searches refitted to the times they observed (CostRefit) is the one that ended the sweep.
    calibrations = {label: getattr(searcher, "calibration", None) or calibrations[label]
                    for label, searcher in searchers.items()}
    rows = []
    for label, budget in configs:
        evaluation = evaluate(results_to_run(results[label, budget]), qrels, SWEEP_METRICS)
        chosen, measured, done = depths[label, budget], times[label, budget], scored[label, budget]
        searcher = searchers[label]
        planned = calibrations[label].depth_for_budget(budget, searcher.rerank_depth)
        rows.append(SweepRow(
            reranker=label, budget_ms=budget,
            depth_mean=statistics.fmean(chosen) if chosen else 0.0,
            depth_median=float(statistics.median(chosen)) if chosen else 0.0,
            depth_min=min(chosen, default=0), depth_max=max(chosen, default=0),
            scored_mean=statistics.fmean(done) if done else 0.0,
            deadline_cut=sum(n < given for n, given in zip(done, chosen)) / len(chosen) if chosen else 0.0,
            predicted_ms=calibrations[label].predict_ms(planned),
            metrics=dict(evaluation.aggregate),
            p50_ms=_percentile(measured, 0.5), p95_ms=_percentile(measured, 0.95),
            p99_ms=_percentile(measured, 0.99),
            within_budget=sum(ms <= budget for ms in measured) / len(measured) if measured else 1.0,
            queries=len(chosen), over_budget=sum(ms > budget for ms in measured),
        ))
    return SweepResult(rows, calibrations, dict(settings or {}), results if keep_runs else {})


def _evict_sidecar(searcher) -> None:
    sidecar = getattr(searcher.reranker, "sidecar", None)
    if sidecar is not None:
        sidecar.evict_from_page_cache()


# ----------------------------------------------------------------------------------------------------- outputs

TABLE_COLUMNS = ("reranker", "budget_ms", "depth_mean", "depth_median", "MRR@10", "nDCG@10", "scored_mean",
                 "deadline_cut", "p50_ms", "p95_ms", "p99_ms", "within_budget", "over_budget", "predicted_ms",
                 "queries")


def _table_cells(row: SweepRow) -> list[str]:
    budget = "inf" if math.isinf(row.budget_ms) else f"{row.budget_ms:g}"
    return [row.reranker, budget, f"{row.depth_mean:.1f}", f"{row.depth_median:g}",
            f"{row.metrics['MRR@10']:.4f}", f"{row.metrics['nDCG@10']:.4f}", f"{row.scored_mean:.1f}",
            f"{row.deadline_cut:.0%}", f"{row.p50_ms:.1f}", f"{row.p95_ms:.1f}", f"{row.p99_ms:.1f}",
            f"{row.within_budget:.0%}", str(row.over_budget), f"{row.predicted_ms:.1f}", str(row.queries)]


def format_tsv(rows: Sequence[SweepRow]) -> str:
    return "\n".join(["\t".join(TABLE_COLUMNS)] + ["\t".join(_table_cells(row)) for row in rows]) + "\n"


def format_markdown(rows: Sequence[SweepRow]) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |",
             "|" + "|".join([":---"] + ["---:"] * (len(TABLE_COLUMNS) - 1)) + "|"]
    lines += ["| " + " | ".join(_table_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def plot_sweep(rows: Sequence[SweepRow], path: str | Path, *, title: str = "") -> Path:
    """A PNG with MRR@10 and nDCG@10 against the budget (one line per reranker, median depth at each point).

    Drawn on an Agg canvas of its own, so it never touches pyplot's global backend.
    """
    # matplotlib only when a plot is drawn: `python -m pyserini_mores.budget --help` imports this module.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.5), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2)
    finite = sorted({row.budget_ms for row in rows if math.isfinite(row.budget_ms)})
    labels = list(dict.fromkeys(row.reranker for row in rows))
    for axis, metric in zip(axes, SWEEP_METRICS):
        for line_index, label in enumerate(labels):
            color = f"C{line_index % 10}"
            points = sorted((row.budget_ms, row.metrics[metric], row.depth_median)
                            for row in rows if row.reranker == label and math.isfinite(row.budget_ms))
            if points:
                xs, ys, _ = zip(*points)
                axis.plot(xs, ys, marker="o", color=color, label=label)
                for x, y, depth in points:  # stacked per line, so that labels of overlapping lines stay legible
                    axis.annotate(f"{depth:g}", (x, y), textcoords="offset points", xytext=(0, 5 + 8 * line_index),
                                  fontsize=7, ha="center", color=color)
            for row in rows:
                if row.reranker == label and math.isinf(row.budget_ms):
                    axis.axhline(row.metrics[metric], color=color, linestyle="--", linewidth=1, alpha=0.6,
                                 label=f"{label}, no budget (depth {row.depth_median:g})")
        positive = [budget for budget in finite if budget > 0]
        if positive and len(finite) > 1:
            if positive != finite:  # a budget of 0 on a log axis: linear around 0
                axis.set_xscale("symlog", linthresh=positive[0])
            else:
                axis.set_xscale("log")
            axis.set_xticks(finite)
            axis.set_xticklabels([f"{budget:g}" for budget in finite])
            axis.minorticks_off()
        axis.margins(y=0.15)  # room for the depth labels above the highest line
        axis.set_xlabel("rerank time budget per query (ms, BM25 excluded)")
        axis.set_ylabel(metric)
        axis.set_title(f"{metric} vs time budget (labels: median rerank depth)", fontsize=9)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    if title:
        figure.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def write_outputs(result: SweepResult, output_dir: str | Path, *, title: str = "") -> dict[str, Path]:
    """``budget_sweep.{tsv,md,json,png}`` in ``output_dir``; returns the paths by kind."""
    output_dir = Path(output_dir)
    paths = {kind: output_dir / f"{OUTPUT_STEM}.{kind}" for kind in ("tsv", "md", "json", "png")}
    contents = {"tsv": format_tsv(result.rows), "md": format_markdown(result.rows),
                "json": json.dumps(result.to_dict(), indent=2) + "\n"}
    for kind, text in contents.items():
        write_text_atomic(paths[kind], text)
    plot_sweep(result.rows, paths["png"], title=title)
    return paths
