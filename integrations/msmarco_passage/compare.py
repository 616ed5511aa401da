"""Compare MS MARCO passage results with the papers' numbers: one row per paper number, with ✓/✗ by tolerance.

Reads a results directory as ``reproduce.py`` writes it: ``eval/*.json`` (``python -m pyserini_mores.eval --json``)
and, for runs no eval JSON covers, ``runs/<model>.<topic set>.trec`` evaluated here against
``data/qrels.<topic set>.txt``. Any directory laid out that way works, so the comparison is testable offline::

    python integrations/msmarco_passage/compare.py --results-dir runs/msmarco [--tolerance 0.01] \\
        [--tolerance nDCG@10=0.02] [--output runs/msmarco/comparison.md]

Exit code: 0 when every checked number is within tolerance (rows not run yet do not count), 1 when one is not,
2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAPER_RESULTS = HERE / "paper_results.json"

#: Topic sets by short key: the Pyserini topics and qrels names, and the lowest grade that counts as relevant
#: (TREC DL passage judges 0-3 and counts >= 2; the dev qrels are binary).
TOPIC_SETS = {
    "dev": {"topics": "msmarco-passage-dev-subset", "qrels": "msmarco-passage-dev-subset", "relevance_level": 1},
    "dl19": {"topics": "dl19-passage", "qrels": "dl19-passage", "relevance_level": 2},
    "dl20": {"topics": "dl20", "qrels": "dl20-passage", "relevance_level": 2},
}
#: What our eval step computes, and the columns of the "our results" table.
EVAL_METRICS = ("MRR@10", "MRR", "nDCG@10", "MAP", "R@10", "R@100", "R@1000")
SUMMARY_COLUMNS = (("dev", "MRR@10"), ("dev", "nDCG@10"), ("dl19", "nDCG@10"), ("dl19", "MAP"), ("dl20", "nDCG@10"),
                   ("dl20", "MAP"))
RUN_NAME = re.compile(r"^(?P<model>.+)\.(?P<topic_set>[A-Za-z0-9_-]+)\.(?:trec|tsv|txt)$")
PASS, FAIL = "✓", "✗"


def run_file_name(model: str, topic_set: str) -> str:
    """The run file name the pipeline writes and this module parses back: ``<model>.<topic set>.trec``."""
    return f"{model}.{topic_set}.trec"


@dataclass
class Measured:
    """Our numbers for one (model, topic set): metric → value, and non-inferiority outcomes by (baseline, margin)."""

    metrics: dict
    non_inferior: dict  # (baseline model, metric, margin) -> (non_inferior: bool, p_value: float | None)
    relevance_level: int | None = None


def parse_run_name(name: str) -> tuple[str, str] | None:
    """``("mores-2ib", "dev")`` from ``mores-2ib.dev.trec``; ``None`` for a name that does not follow the layout."""
    match = RUN_NAME.match(Path(name).name)
    if match is None or match["topic_set"] not in TOPIC_SETS:
        return None
    return match["model"], match["topic_set"]


def load_results(results_dir: str | Path) -> dict[tuple[str, str], Measured]:
    """Every (model, topic set) result found in ``results_dir``: eval JSONs first, then runs they do not cover.

    Raises:
        FileNotFoundError: ``results_dir`` is not a directory.
        ValueError: an eval JSON that is not one.
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"results directory {root} does not exist")
    found: dict[tuple[str, str], Measured] = {}
    for path in sorted((root / "eval").glob("*.json")):
        _read_eval_json(path, found)
    for run in sorted((root / "runs").glob("*")):
        key = parse_run_name(run.name)
        if key is None or key in found:
            continue
        qrels = root / "data" / f"qrels.{key[1]}.txt"
        if not qrels.is_file():
            print(f"note: {run} is not evaluated: no eval JSON covers it and {qrels} does not exist", file=sys.stderr)
            continue
        from pyserini_mores.eval.metrics import evaluate

        level = TOPIC_SETS[key[1]]["relevance_level"]
        result = evaluate(run, qrels, EVAL_METRICS, relevance_level=level)
        found[key] = Measured(dict(result.aggregate), {}, level)
    return found


def _read_eval_json(path: Path, found: dict[tuple[str, str], Measured]) -> None:
    try:
        payload = json.loads(path.read_text())
        runs = payload["runs"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not an eval JSON of `python -m pyserini_mores.eval --json` ({error})") from None
    names = {}
    for name, run in runs.items():
        key = parse_run_name(run.get("path") or name) or parse_run_name(name)
        if key is None:
            print(f"note: {path}: run '{name}' is not named <model>.<topic set>.trec; left out", file=sys.stderr)
            continue
        names[name] = key
        found[key] = Measured({metric: value for metric, value in run.get("aggregate", {}).items()
                               if value is not None}, {}, payload.get("relevance_level"))
    baseline = names.get(payload.get("baseline"))
    metric = payload.get("test_metric")
    for name, tests in (payload.get("non_inferiority") or {}).items():
        if name not in names or baseline is None:
            continue
        for test in tests:
            found[names[name]].non_inferior[(baseline[0], metric, float(test["margin"]))] = (
                bool(test["non_inferior"]), test.get("p_value"))


def load_paper_results(path: str | Path = PAPER_RESULTS) -> dict:
    """The paper numbers file; checks that every row names a known topic set, a number and its source.

    Raises:
        ValueError: a malformed file (the message names the row).
    """
    payload = json.loads(Path(path).read_text())
    for index, row in enumerate(payload.get("results", [])):
        missing = [key for key in ("model", "topic_set", "metric", "value", "source") if key not in row]
        if missing or row["topic_set"] not in TOPIC_SETS or not isinstance(row["value"], (int, float)):
            raise ValueError(f"{path}: results[{index}] needs model, a topic_set of {', '.join(TOPIC_SETS)}, "
                             f"metric, a numeric value and source (got {row})")
    for index, row in enumerate(payload.get("non_inferiority", [])):
        missing = [key for key in ("model", "baseline", "topic_set", "metric", "margin", "source") if key not in row]
        if missing:
            raise ValueError(f"{path}: non_inferiority[{index}] lacks {', '.join(missing)}")
    return payload


def parse_tolerances(values: list[str], default: float) -> tuple[float, dict[str, float]]:
    """``["0.02", "nDCG@10=0.03"]`` → default 0.02 and {"nDCG@10": 0.03}.

    Raises:
        ValueError: a value that is not a non-negative number.
    """
    per_metric: dict[str, float] = {}
    for value in values:
        metric, sep, number = value.rpartition("=")
        try:
            tolerance = float(number)
        except ValueError:
            raise ValueError(f"--tolerance expects a number or METRIC=NUMBER, got '{value}'") from None
        if not tolerance >= 0:
            raise ValueError(f"--tolerance must be >= 0, got '{value}'")
        if sep:
            per_metric[metric] = tolerance
        else:
            default = tolerance
    return default, per_metric


def compare(paper: dict, results: dict[tuple[str, str], Measured], default_tolerance: float,
            per_metric: dict[str, float]) -> tuple[list[dict], list[dict]]:
    """Rows of the comparison: one per paper number, then one per non-inferiority claim.

    Each row has ``status``: ✓ (within tolerance / claim holds), ✗, ``not run`` (no result of ours yet) or ``info``
    (a number shown for context, ``"check": false`` in the paper file).
    """
    rows = []
    for entry in paper.get("results", []):
        tolerance = per_metric.get(entry["metric"], default_tolerance)
        measured = results.get((entry["model"], entry["topic_set"]))
        ours = None if measured is None else measured.metrics.get(entry["metric"])
        row = {"model": entry["model"], "paper_model": entry.get("paper_model", ""), "topic_set": entry["topic_set"],
               "metric": entry["metric"], "paper": float(entry["value"]), "ours": ours, "tolerance": tolerance,
               "source": entry["source"]}
        if ours is None:
            row["status"] = "not run"
        elif entry.get("check", True) is False:
            row["status"] = "info"
        else:
            # a hair of slack so that a difference printed as exactly the tolerance passes
            row["status"] = PASS if abs(ours - row["paper"]) <= tolerance + 1e-9 else FAIL
        rows.append(row)
    claims = []
    for entry in paper.get("non_inferiority", []):
        measured = results.get((entry["model"], entry["topic_set"]))
        outcome = None if measured is None else measured.non_inferior.get(
            (entry["baseline"], entry["metric"], float(entry["margin"])))
        claim = {**entry, "ours": outcome}
        claim["status"] = "not run" if outcome is None else (PASS if outcome[0] else FAIL)
        claims.append(claim)
    return rows, claims


def _number(value: float | None) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def format_report(rows: list[dict], claims: list[dict], results: dict[tuple[str, str], Measured]) -> str:
    """The comparison as Markdown tables: paper numbers, non-inferiority claims, then all our results."""
    lines = ["| model | paper row | topics | metric | paper | ours | diff | tolerance | ok | source |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        diff = "—" if row["ours"] is None else f"{row['ours'] - row['paper']:+.4f}"
        tolerance = "—" if row["status"] == "info" else f"±{row['tolerance']:g}"
        lines.append(f"| {row['model']} | {row['paper_model']} | {row['topic_set']} | {row['metric']} | "
                     f"{row['paper']:.4f} | {_number(row['ours'])} | {diff} | {tolerance} | {row['status']} | "
                     f"{row['source']} |")
    if claims:
        lines += ["", "| claim | paper | ours | ok | source |", "|---|---|---|---|---|"]
        for claim in claims:
            text = (f"{claim['model']} non-inferior to {claim['baseline']} at {claim['margin']:.0%} "
                    f"({claim['topic_set']} {claim['metric']})")
            if claim["ours"] is None:
                ours = "—"
            else:
                p_value = claim["ours"][1]
                ours = ("yes" if claim["ours"][0] else "no") + (f" (p = {p_value:.3g})" if p_value is not None else "")
            lines.append(f"| {text} | yes | {ours} | {claim['status']} | {claim['source']} |")
    models = sorted({model for model, _ in results}, key=lambda m: (m != "bm25", m))
    if models:
        header = " | ".join(f"{topic_set} {metric}" for topic_set, metric in SUMMARY_COLUMNS)
        lines += ["", "All our results (including those no paper reports):", "",
                  f"| model | {header} |", "|---" * (len(SUMMARY_COLUMNS) + 1) + "|"]
        for model in models:
            cells = [_number(results[(model, topic_set)].metrics.get(metric)) if (model, topic_set) in results
                     else "—" for topic_set, metric in SUMMARY_COLUMNS]
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
    checked = [item for item in rows + claims if item["status"] in (PASS, FAIL)]
    failed = sum(item["status"] == FAIL for item in checked)
    not_run = sum(item["status"] == "not run" for item in rows + claims)
    lines += ["", f"{len(checked) - failed} of {len(checked)} checked numbers within tolerance"
              + (f"; {failed} outside" if failed else "") + (f"; {not_run} not run yet" if not_run else "") + "."]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python integrations/msmarco_passage/compare.py",
                                     description="Compare MS MARCO passage results with the papers' numbers.")
    parser.add_argument("--results-dir", required=True,
                        help="directory with eval/*.json and/or runs/<model>.<topic set>.trec + data/qrels.<set>.txt")
    parser.add_argument("--paper-results", default=str(PAPER_RESULTS), help="paper numbers (default: %(default)s)")
    parser.add_argument("--tolerance", action="append", default=[], metavar="[METRIC=]VALUE",
                        help="absolute tolerance, for every metric or one (repeatable; default: the paper file's "
                             "default_tolerance, 0.01)")
    parser.add_argument("--output", help="also write the report (Markdown) to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        paper = load_paper_results(args.paper_results)
        default, per_metric = parse_tolerances(args.tolerance, float(paper.get("default_tolerance", 0.01)))
        results = load_results(args.results_dir)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows, claims = compare(paper, results, default, per_metric)
    report = format_report(rows, claims, results)
    print(report)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(report + "\n")
    return 1 if any(item["status"] == FAIL for item in rows + claims) else 0


if __name__ == "__main__":
    sys.exit(main())
