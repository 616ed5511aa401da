"""Choose ``search --interpolate ALPHA`` on dev queries from two run files, without reranking again.

The reranked run must hold every reranked candidate with the reranker's own score (``search --rerank-depth D --hits
D`` without ``--interpolate``); the first-stage run gives each candidate's first-stage score (e.g. ``search`` with no
reranker, or its ``--output``). Each alpha of the grid fuses the two lists exactly as ``--interpolate`` does
(:func:`pyserini_mores.search.fusion.interpolate_runs`) and is evaluated with pytrec_eval's measures; the best alpha by
the chosen metric is printed last, then used once on test::

    python integrations/debian_packages/tune_interpolation.py --reranked mores.dev.trec --first-stage bm25.dev.trec \\
        --qrels qrels.dev.txt
    python -m pyserini_mores.search --index INDEX --topics queries.test.tsv --qrels qrels.test.txt \\
        --reranker mores --rerank-depth 30 --interpolate ALPHA
"""
from __future__ import annotations

import argparse
import sys

from pyserini_mores.eval.metrics import evaluate
from pyserini_mores.formats import read_qrels, read_ranked_run
from pyserini_mores.search.fusion import interpolate_runs

DEFAULT_ALPHAS = [round(step / 20, 2) for step in range(21)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reranked", required=True, help="the reranker's run (every reranked candidate, own score)")
    parser.add_argument("--first-stage", required=True, help="the first stage's run over the same candidates")
    parser.add_argument("--qrels", required=True)
    parser.add_argument("--metric", default="MRR@10")
    parser.add_argument("--alphas", type=float, nargs="+", default=DEFAULT_ALPHAS)
    args = parser.parse_args(argv)
    reranked, first_stage = read_ranked_run(args.reranked), read_ranked_run(args.first_stage)
    # judged on the queries the runs hold (e.g. the first 200 of --max-queries), not all the qrels judge
    qrels = {qid: judged for qid, judged in read_qrels(args.qrels).items() if qid in reranked}
    print(f"{len(qrels)} judged queries in {args.reranked}")
    scores = {}
    for alpha in args.alphas:
        fused = interpolate_runs(reranked, first_stage, alpha)
        scores[alpha] = evaluate(fused, qrels, [args.metric]).aggregate[args.metric]
        print(f"alpha {alpha:g}: {args.metric} {scores[alpha]:.4f}")
    best = max(scores, key=lambda alpha: (scores[alpha], alpha))
    print(f"best alpha {best:g}: {args.metric} {scores[best]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
