"""Score every window of BM25's top candidates once, then evaluate each aggregation at each rerank depth.

The manpages tables (docs/experiments-manpages.md) compare FirstP, MaxP, SumP, FirstMaxP and (for models with a
[CLS] head) AvgCLS at rerank depths 30 and 100. A candidate's score depends on the query and its own windows only,
so one pass over the top ``--depth`` candidates gives every aggregation at every depth up to it: the reranker's own
``score_windows`` (the scores ``search --aggregate A`` aggregates) is called once per query; for a model whose head
reads a [CLS] vector it gives the head's inputs, from which come both each window's score and AvgCLS. Each row is
also what one search command gives::

    python integrations/manpages/window_scores.py --index INDEX --topics queries.test.tsv --qrels qrels.test.txt \\
        --reranker mores --sidecar SIDECAR --depth 100 --json mores.test.json

    python -m pyserini_mores.search --index INDEX --topics queries.test.tsv --qrels qrels.test.txt \\
        --reranker mores --sidecar SIDECAR --aggregate maxp --rerank-depth 30
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--topics", required=True)
    parser.add_argument("--qrels", required=True)
    parser.add_argument("--reranker", required=True, help="registered reranker name (mores, prettr, ...)")
    parser.add_argument("--model", help="checkpoint directory or shipped name (default: the reranker's)")
    parser.add_argument("--sidecar", help="windowed sidecar (models that store; default: none, from text)")
    parser.add_argument("--max-windows", type=int, default=4, help="windows when scoring from text (default 4)")
    parser.add_argument("--depth", type=int, default=30, help="candidates scored per query (default 30)")
    parser.add_argument("--depths", type=int, nargs="+", default=[30], help="depths evaluated")
    parser.add_argument("--no-avgcls", action="store_true", help="skip the AvgCLS pass")
    parser.add_argument("--max-queries", type=int, help="the first N topics only")
    parser.add_argument("--skip-queries", type=int, default=0,
                        help="leave out the first N topics (with --max-queries: topics N+1 to N+max); to split a run "
                             "across processes, whose --save-windows files evaluate together")
    parser.add_argument("--skip-candidates", type=int, default=0,
                        help="score each query's candidates N+1 to --depth only, to extend the --save-windows of a run "
                             "to depth N (evaluate_windows.py evaluates the two files together); needs --save-windows "
                             "and writes no table")
    parser.add_argument("--json", required=True, help="where the table goes")
    parser.add_argument("--save-windows", help="also write every window's score (and AvgCLS) per query to this .npz")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.skip_candidates and not args.save_windows:
        print("error: --skip-candidates scores part of each query's candidates: it needs --save-windows",
              file=sys.stderr)
        return 2
    if not 0 <= args.skip_candidates < args.depth:
        print(f"error: --skip-candidates must lie in 0 … --depth - 1 ({args.depth - 1}), not {args.skip_candidates}",
              file=sys.stderr)
        return 2
    from pyserini_mores.eval.metrics import evaluate
    from pyserini_mores.formats import read_qrels, read_topics
    from pyserini_mores.index import fetch_texts
    from pyserini_mores.rerankers import get_reranker
    from pyserini_mores.search import RerankingSearcher
    from pyserini_mores.types import hits_to_texts
    from pyserini_mores.windows import WindowOptions, aggregate_scores, average_windows

    topics = read_topics(args.topics)
    qids = list(topics)[args.skip_queries:][: args.max_queries]
    qrels = read_qrels(args.qrels)
    windows = None if args.sidecar else WindowOptions(max_windows=args.max_windows)
    options = {"model": args.model} if args.model else {}
    reranker = get_reranker(args.reranker, sidecar=args.sidecar, windows=windows, **options)
    searcher = RerankingSearcher(args.index, reranker=reranker, rerank_depth=args.depth, sidecar=None)
    candidates = searcher.first_stage([topics[q] for q in qids], qids, k=args.depth)
    scores_cls = reranker.model.capabilities.scores_cls and not args.no_avgcls
    aggregations = ["firstp", "maxp", "sump", "firstmaxp"] + (["avgcls"] if scores_cls else [])
    runs = {(how, depth): {} for how in aggregations for depth in args.depths}
    windows_per_candidate, started, saved = [], time.perf_counter(), {}
    for number, qid in enumerate(qids, 1):
        hits = candidates.get(qid, [])[args.skip_candidates: args.depth]
        if not hits:
            continue
        texts = fetch_texts(searcher.searcher, [hit.docid for hit in hits]) if reranker.needs_text else None
        texts = hits_to_texts(hits, texts=texts)
        if scores_cls:
            # one pass: the head's input of every window gives both each window's score and AvgCLS
            vectors, owners = reranker.score_windows(topics[qid], texts, head_inputs=True)
            window_scores = reranker.scores_from_head_inputs(vectors)
            averaged = reranker.scores_from_head_inputs(average_windows(vectors, owners, len(texts)))
        else:
            window_scores, owners = reranker.score_windows(topics[qid], texts)
        windows_per_candidate.append(len(owners) / len(texts))
        saved[qid] = {"docids": [text.metadata["docid"] for text in texts], "window_scores": window_scores,
                      "owners": owners, **({"avgcls": averaged} if scores_cls else {})}
        per_aggregation = {how: aggregate_scores(window_scores, owners, len(texts), how)
                           for how in ("firstp", "maxp", "sump", "firstmaxp")}
        if scores_cls:
            per_aggregation["avgcls"] = averaged
        for how, scores in per_aggregation.items():
            for depth in args.depths:
                # the reranked candidates by score (ties in BM25 order), then the rest in BM25's order, as search
                # writes them; a run's scores here are only its ranks
                order = np.argsort(-np.asarray(scores[:depth], dtype=np.float64), kind="stable")
                ranked = [texts[i].metadata["docid"] for i in order] + [hit.docid for hit in hits[depth:]]
                runs[(how, depth)][qid] = {docid: float(len(ranked) - rank) for rank, docid in enumerate(ranked)}
        if number % 100 == 0:
            print(f"{number}/{len(qids)} queries, {time.perf_counter() - started:.0f} s", file=sys.stderr)

    judged = {qid: qrels[qid] for qid in qids if qid in qrels}
    table = []
    # with --skip-candidates each ranking is only a part of one: no table
    for (how, depth), run in runs.items() if not args.skip_candidates else ():
        result = evaluate(run, judged, ["MRR@10", "nDCG@10"])
        table.append({"aggregation": how, "depth": depth, **{k: round(v, 4) for k, v in result.aggregate.items()}})
        print(f"{args.reranker:14s} {how:7s} depth {depth:4d}  MRR@10 {result.aggregate['MRR@10']:.4f}  "
              f"nDCG@10 {result.aggregate['nDCG@10']:.4f}")
    summary = {"reranker": args.reranker, "model": args.model, "sidecar": args.sidecar, "queries": len(judged),
               "depth": args.depth, "skip_candidates": args.skip_candidates,
               "windows_per_candidate": float(np.mean(windows_per_candidate)),
               "seconds": round(time.perf_counter() - started, 1), "rows": table}
    if args.save_windows:
        np.savez_compressed(args.save_windows, **{f"{qid}/{key}": np.asarray(value)
                                                   for qid, fields in saved.items() for key, value in fields.items()})
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
