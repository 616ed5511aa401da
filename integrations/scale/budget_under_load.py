"""Time budgets on a busy machine: ``python -m pyserini_mores.search`` under each of several per-query budgets while
another process keeps one CPU core busy, and the rerank time per query each budget gave (median, p95, queries over
the budget), as the search prints it.

The cost model is measured first with the machine quiet (one query, ``--recalibrate``), as a user calibrates once;
then a process that spins (``while True: pass``, pinned to ``--busy-core`` with ``sched_setaffinity``) starts, and a
search runs per budget, one after the other, on the same queries; the spinning process is killed at the end, also on
an error or Ctrl-C. The searches are not pinned: they compete with it as any process on a busy machine does. Each
search starts from the cost model the previous one left in the cache (the searcher refits it to the times it
observes, see ``docs/performance.md#time-budgets``), as successive searches on the machine would.

Default: the embedded sample's dev queries (``--max-queries 200``) reranked by the shipped cross-encoder (it reads
document text, so no sidecar is built first). Example::

    python integrations/scale/budget_under_load.py --budgets 100 200 300 --output-dir /tmp/budget-under-load

prints one line per budget and writes ``budget_under_load.json`` (and each budget's run) to ``--output-dir``.
``--reranker``/``--model``/``--index``/``--topics`` are passed to the search (``--index`` and ``--topics`` go
together; without them, the embedded sample); further search flags follow ``--``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

#: the line of the search's summary this script reads (pyserini_mores.search.topic_search.budget_report)
SUMMARY = re.compile(r"^Rerank time against the (?P<budget>[\d.e+]+) ms budget: median (?P<median>[\d.]+) ms, "
                     r"p95 (?P<p95>[\d.]+) ms; (?P<over>\d+) of (?P<queries>\d+) queries over it$", re.MULTILINE)
SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=float, nargs="+", default=[100.0, 200.0, 300.0], metavar="MS")
    parser.add_argument("--max-queries", type=int, default=200, help="the first N topics (default 200)")
    parser.add_argument("--reranker", default="cross-encoder")
    parser.add_argument("--model", default=None, help="default: the reranker's shipped model")
    parser.add_argument("--index", default=None, help="a Lucene index (default: the embedded sample)")
    parser.add_argument("--topics", default=None, help="goes with --index")
    parser.add_argument("--busy-core", type=int, default=1, help="the CPU core kept busy (default 1)")
    parser.add_argument("--no-load", action="store_true", help="the same searches with nothing else running: the "
                                                               "control")
    parser.add_argument("--output-dir", required=True, help="where the runs and budget_under_load.json go")
    parser.add_argument("search_args", nargs=argparse.REMAINDER, help="after --: further flags for the search")
    return parser


def search_command(args: argparse.Namespace, budget: float, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "pyserini_mores.search", "--reranker", args.reranker,
               "--time-budget-ms", f"{budget:g}", "--max-queries", str(args.max_queries), "--examples", "0"]
    if args.model:
        command += ["--model", args.model]
    if args.index:
        command += ["--index", args.index, "--topics", args.topics]
    return command + list(extra) + [arg for arg in args.search_args if arg != "--"]


def run_search(command: list[str]) -> str:
    """The search's standard output; its standard error passes through (progress, warnings)."""
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} exited with {result.returncode}")
    return result.stdout


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (args.index is None) != (args.topics is None):
        raise SystemExit("error: --index and --topics go together")
    if args.busy_core not in os.sched_getaffinity(0):
        raise SystemExit(f"error: --busy-core {args.busy_core} is not one of this process's cores "
                         f"{sorted(os.sched_getaffinity(0))}")
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    print("calibrating with the machine quiet ...", file=sys.stderr)
    run_search(search_command(args, max(args.budgets), "--recalibrate", "--max-queries", "1"))
    spinner = None if args.no_load else subprocess.Popen([sys.executable, "-c", SPIN, str(args.busy_core)])
    rows = []
    try:
        for budget in args.budgets:
            stdout = run_search(search_command(args, budget, "--output", str(output / f"run-{budget:g}ms.trec")))
            match = SUMMARY.search(stdout)
            if match is None:
                raise SystemExit(f"error: the search under {budget:g} ms printed no rerank times:\n{stdout}")
            rows.append({"budget_ms": budget, "median_ms": float(match["median"]), "p95_ms": float(match["p95"]),
                         "over_budget": int(match["over"]), "queries": int(match["queries"]),
                         "summary": [line for line in stdout.splitlines() if "budget" in line or "deadline" in line
                                     or "reranked" in line]})
            print(f"{budget:g} ms: median {match['median']} ms, p95 {match['p95']} ms, {match['over']} of "
                  f"{match['queries']} queries over the budget", flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    settings = {"command": " ".join([sys.executable, *sys.argv]), "load": None if args.no_load else
                f"one process spinning on core {args.busy_core}", "cpus": sorted(os.sched_getaffinity(0))}
    (output / "budget_under_load.json").write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
