"""Evaluate saved window scores (``window_scores.py --save-windows``) under each aggregation and window cap.

Several files (one run split across processes with ``--skip-queries``, or extended to a deeper rerank depth
with ``--skip-candidates``) are evaluated together: a query's candidates in several files are taken in the files'
order. ``--caps 1 2 3 4``
also evaluates each aggregation as if the sidecar had been built with ``--max-windows K`` for each K up to the saved
windows' (a document's first K windows are exactly what that build stores), which is what a smaller cap costs;
``--first-weights 0.4 0.6`` also evaluates ``w`` × FirstP + (1 − ``w``) × MaxP for each weight ``w`` of the first
window (``search``'s FirstMaxP is ``w`` = 0.5)::

    python integrations/manpages/evaluate_windows.py --qrels qrels.test.txt --windows ce.test.0.npz ce.test.493.npz \\
        --caps 1 2 3 4 --json ce.test.json
    python integrations/manpages/evaluate_windows.py --qrels qrels.test.txt --depths 30 100 \\
        --windows ce.test.npz ce.test.d100.0.npz ce.test.d100.493.npz   # the top 30, then candidates 31-100
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pyserini_mores.eval.metrics import evaluate
from pyserini_mores.formats import read_qrels
from pyserini_mores.windows import SCORE_AGGREGATIONS, aggregate_scores


def load(paths: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """qid → its saved fields (``docids``, ``window_scores``, ``owners``, and ``avgcls`` when every file that has
    the query saved it); a query in several files has their candidates one after the other, in the files' order."""
    queries: dict[str, dict[str, np.ndarray]] = {}
    for path in paths:
        parts: dict[str, dict[str, np.ndarray]] = {}
        with np.load(path) as saved:
            for key in saved.files:
                qid, field = key.split("/", 1)
                parts.setdefault(qid, {})[field] = saved[key]
        for qid, part in parts.items():
            queries[qid] = _appended(queries[qid], part) if qid in queries else part
    return queries


def _appended(first: dict[str, np.ndarray], then: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The candidates of ``first`` then those of ``then``: each window's owner counted on from ``first``'s."""
    joined = {"docids": np.concatenate([first["docids"], then["docids"]]),
              "window_scores": np.concatenate([first["window_scores"], then["window_scores"]]),
              "owners": np.concatenate([first["owners"], then["owners"] + len(first["docids"])])}
    if "avgcls" in first and "avgcls" in then:
        joined["avgcls"] = np.concatenate([first["avgcls"], then["avgcls"]])
    return joined


def ranked_run(queries: dict[str, dict[str, np.ndarray]], scores_of, depth: int) -> dict[str, dict[str, float]]:
    """The run of each query's first ``depth`` candidates by ``scores_of(fields)`` (ties in BM25 order), as ranks."""
    run = {}
    for qid, fields in queries.items():
        docids = [str(docid) for docid in fields["docids"][:depth]]
        order = np.argsort(-np.asarray(scores_of(fields), dtype=np.float64)[:depth], kind="stable")
        run[qid] = {docids[i]: float(len(docids) - rank) for rank, i in enumerate(order)}
    return run


def capped(fields: dict[str, np.ndarray], cap: int) -> tuple[np.ndarray, np.ndarray]:
    """The window scores and owners of each candidate's first ``cap`` windows."""
    owners = fields["owners"]
    position = np.arange(len(owners)) - np.searchsorted(owners, owners)  # a window's number within its document
    keep = position < cap
    return fields["window_scores"][keep], owners[keep]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qrels", required=True)
    parser.add_argument("--windows", nargs="+", required=True, help=".npz files of window_scores.py --save-windows")
    parser.add_argument("--depths", type=int, nargs="+", default=[30])
    parser.add_argument("--caps", type=int, nargs="+", default=[], help="window caps to evaluate besides all")
    parser.add_argument("--first-weights", type=float, nargs="+", default=[],
                        help="weights w of the first window: also evaluate w * FirstP + (1 - w) * MaxP "
                             "(FirstMaxP: w = 0.5)")
    parser.add_argument("--json", help="where the table goes")
    args = parser.parse_args(argv)
    queries = load(args.windows)
    qrels = read_qrels(args.qrels)
    judged = {qid: qrels[qid] for qid in queries if qid in qrels}
    rows = []

    def add(how: str, cap: int | None, depth: int, scores_of, first_weight: float | None = None) -> None:
        result = evaluate(ranked_run(queries, scores_of, depth), judged, ["MRR@10", "nDCG@10"]).aggregate
        rows.append({"aggregation": how, "max_windows": cap, "depth": depth,
                     **({"first_weight": first_weight} if first_weight is not None else {}),
                     **{name: round(value, 4) for name, value in result.items()}})
        label = how if first_weight is None else f"{how}@{first_weight:g}"
        print(f"{label:14s} windows {cap or 'all':>3}  depth {depth:4d}  MRR@10 {result['MRR@10']:.4f}  "
              f"nDCG@10 {result['nDCG@10']:.4f}")

    for depth in args.depths:
        for cap in [None, *args.caps]:
            for how in SCORE_AGGREGATIONS:
                def scores_of(fields, how=how, cap=cap):
                    window_scores, owners = capped(fields, cap) if cap else (fields["window_scores"], fields["owners"])
                    return aggregate_scores(window_scores, owners, len(fields["docids"]), how)
                add(how, cap, depth, scores_of)
            for weight in args.first_weights:
                def weighted(fields, cap=cap, weight=weight):
                    window_scores, owners = capped(fields, cap) if cap else (fields["window_scores"], fields["owners"])
                    first, best = (aggregate_scores(window_scores, owners, len(fields["docids"]), how)
                                   for how in ("firstp", "maxp"))
                    return weight * first + (1 - weight) * best
                add("firstmaxp", cap, depth, weighted, weight)
        if all("avgcls" in fields for fields in queries.values()):
            add("avgcls", None, depth, lambda fields: fields["avgcls"])
    windows = np.mean([len(fields["owners"]) / len(fields["docids"]) for fields in queries.values()])
    print(f"{len(judged)} queries, {windows:.2f} windows per candidate")
    if args.json:
        Path(args.json).write_text(json.dumps({"queries": len(judged), "windows_per_candidate": float(windows),
                                               "files": args.windows, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
