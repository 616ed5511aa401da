"""Evaluate run files: ``python -m pyserini_mores.eval --qrels QRELS RUN [RUN ...] [--baseline RUN]``.

Prints one row of metrics per run and, with ``--baseline``, the MORES non-inferiority test of every run against it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from .._cli import run_parsed, setup_logging
from ..formats import atomic_writer, read_qrels
from .metrics import (
    DEFAULT_METRICS,
    EvaluationResult,
    NonInferiorityResult,
    canonical_metric_name,
    evaluate,
    format_metrics_table,
    non_inferiority,
)

DEFAULT_MARGINS = (0.02, 0.05)


def define_eval_args(parser: argparse.ArgumentParser, *, qrels_required: bool = False) -> None:
    """Add ``--qrels``, ``--metrics`` and ``--relevance-level`` (shared with the search command)."""
    parser.add_argument("--qrels", required=qrels_required, metavar="PATH",
                        help="TREC qrels file ('qid 0 docid relevance'); enables evaluation")
    parser.add_argument("--metrics", nargs="+", default=list(DEFAULT_METRICS), metavar="METRIC",
                        help="metrics, space- or comma-separated: MRR@k, nDCG@k, MAP, R@k, P@k or a pytrec_eval "
                             f"measure (default: {' '.join(DEFAULT_METRICS)})")
    parser.add_argument("--relevance-level", type=int, default=1, metavar="GRADE",
                        help="lowest relevance grade that counts as relevant (default: 1; TREC DL passage uses 2)")


def parse_metrics(values: list[str]) -> list[str]:
    """Canonical, de-duplicated metric names from ``--metrics`` values.

    Raises:
        ValueError: an unknown metric; the message hints at argument order when the value is an existing file,
            since ``--metrics`` swallows run files placed after it.
    """
    names: list[str] = []
    for value in values:
        for name in filter(None, (part.strip() for part in value.split(","))):
            try:
                names.append(canonical_metric_name(name))
            except ValueError as error:
                if os.path.exists(name):
                    raise ValueError(f"{error} ({name!r} is a file: put run files before --metrics, or end the "
                                     "metrics with --)") from None
                raise
    return list(dict.fromkeys(names))


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def _p_value(value: float) -> str:
    if math.isnan(value):  # fewer than two queries
        return "-"
    return f"{value:.1e}" if value < 1e-4 else f"{value:.4f}"


def _display_names(paths: list[str]) -> dict[str, str]:
    """Run file names, or the paths as given when two runs share a file name."""
    names = [Path(path).name for path in paths]
    if len(set(names)) < len(names):
        return {path: path for path in paths}
    return dict(zip(paths, names))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN or infinity


def _non_inferiority_row(baseline: EvaluationResult, candidate: EvaluationResult, metric: str,
                         tests: list[NonInferiorityResult]) -> dict[str, Any]:
    base, cand = baseline.aggregate[metric], candidate.aggregate[metric]
    row: dict[str, Any] = {metric: cand, "baseline": base, "change": f"{(cand - base) / base:+.1%}" if base else "-"}
    for test in tests:
        row[f"p@{_percent(test.margin)}"] = _p_value(test.p_value)
        row[f"NI@{_percent(test.margin)}"] = "yes" if test.non_inferior else "no"
    return row


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pyserini_mores.eval",
        description="Evaluate TREC or MS MARCO run files. Every metric is averaged over all judged queries (those "
                    "with a relevant document); a judged query missing from a run counts 0, as in MS MARCO's "
                    "official evaluation and trec_eval -c.",
    )
    # nargs="*" and a check in main(), so that a run swallowed by --metrics gets a useful message, not "RUN required".
    parser.add_argument("runs", nargs="*", metavar="RUN", help="run files (TREC or MS MARCO format, detected per file)")
    define_eval_args(parser, qrels_required=True)
    parser.add_argument("--baseline", metavar="RUN",
                        help="test every run for non-inferiority against this run (added to the table if needed)")
    parser.add_argument("--test-metric", default="MRR@10", metavar="METRIC",
                        help="metric of the non-inferiority test (default: MRR@10)")
    parser.add_argument("--margins", nargs="+", type=float, default=list(DEFAULT_MARGINS), metavar="FRACTION",
                        help="non-inferiority margins as fractions of the baseline (default: 0.02 0.05)")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level (default: 0.05)")
    parser.add_argument("--json", metavar="PATH", help="also write every result, per-query values included, as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; exit status 0, or 2 for bad arguments and for an unreadable or malformed file (one line)."""
    parser = build_parser()
    return run_parsed(parser, lambda args: run_eval(parser, args), argv)


def run_eval(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    setup_logging(args.verbose)
    try:
        metrics = parse_metrics(args.metrics)
        test_metric = canonical_metric_name(args.test_metric)
    except ValueError as error:
        parser.error(str(error))
    if not args.runs:
        parser.error("at least one RUN file is required")
    if any(not 0 <= margin < 1 for margin in args.margins):
        parser.error("--margins are fractions of the baseline in [0, 1), e.g. 0.02")

    paths = list(dict.fromkeys(args.runs))
    if args.baseline is not None and not any(_same_file(args.baseline, path) for path in paths):
        paths.insert(0, args.baseline)
    baseline_path = next((path for path in paths if _same_file(args.baseline, path)), None) if args.baseline else None
    evaluated_metrics = metrics + [test_metric] if baseline_path and test_metric not in metrics else metrics

    qrels = read_qrels(args.qrels)
    # Paths, not read runs: MRR ranks by a run file's rank column.
    results = {path: evaluate(path, qrels, evaluated_metrics, relevance_level=args.relevance_level) for path in paths}

    names = _display_names(paths)
    print(format_metrics_table([(names[path], results[path]) for path in paths], [*metrics, "queries"]))

    tests: dict[str, list[NonInferiorityResult]] = {}
    if baseline_path is not None:
        baseline = results[baseline_path]
        for path in paths:
            if path != baseline_path:
                tests[path] = [non_inferiority(baseline.per_query[test_metric], results[path].per_query[test_metric],
                                               margin, alpha=args.alpha) for margin in args.margins]
        print()
        print(f"Non-inferiority vs {names[baseline_path]} on {test_metric} (one-sided paired t-test, alpha "
              f"{args.alpha:g}; NI = non-inferior within the margin):")
        if tests:
            print(format_metrics_table(
                [(names[path], _non_inferiority_row(baseline, results[path], test_metric, path_tests))
                 for path, path_tests in tests.items()]))
        else:
            print("no other run to compare")

    if args.json:
        payload = {
            "qrels": args.qrels,
            "metrics": metrics,
            "relevance_level": args.relevance_level,
            "runs": {names[path]: {"path": path, **results[path].to_dict()} for path in paths},
            "baseline": names[baseline_path] if baseline_path is not None else None,
            "test_metric": test_metric if baseline_path is not None else None,
            "non_inferiority": {
                names[path]: [{"margin": test.margin, "delta": test.delta, "statistic": _finite(test.statistic),
                               "p_value": _finite(test.p_value), "non_inferior": test.non_inferior,
                               "baseline_mean": test.baseline_mean, "candidate_mean": test.candidate_mean,
                               "num_queries": test.num_queries} for test in path_tests]
                for path, path_tests in tests.items()
            },
        }
        with atomic_writer(args.json) as stream:
            json.dump(payload, stream, indent=2, allow_nan=False)
            stream.write("\n")
    return 0


def _same_file(first: str, second: str) -> bool:
    return first == second or os.path.abspath(first) == os.path.abspath(second)


if __name__ == "__main__":
    sys.exit(main())
