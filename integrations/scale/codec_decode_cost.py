"""Time the rerank path from a float16 sidecar against the same store under a codec, in one process.

For each of ``--queries`` topics, its first ``--depth`` candidates of ``--run`` are reranked through
``RerankingSearcher.rerank_run`` from each sidecar in turn (alternating, so both see the same machine state), and
their rows are read alone with ``get_batch`` as the rerank path reads them (what the codec changes: float16 rows
gathered, or codes gathered and decoded; an ``opq`` store's codes without the rotation back when the model folds the
rotation into its own side, see ``RankingModel.store_frame``; an ``rq`` store's codes undecoded when the model scores
them through look-up tables, see ``RankingModel.code_tables``), ``--repeats`` times. It prints the medians per query
for both paths and both sidecars, and the ratios
codec / float16; ``--json`` writes them with the machine (CPU model, cores, torch threads).

    python integrations/scale/codec_decode_cost.py --index /work/runs/debian/index \\
        --topics queries.test.tsv --run bm25.test.trec --reranker mores \\
        --fp16 /work/runs/debian/sc-fp16-mores --codec-sidecar /work/runs/codec76/sc-opq48-mores \\
        --depth 1000 --queries 50 --repeats 3 --precision bf16

Run it on a quiet machine: the figures are times.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections import defaultdict

import numpy as np
import torch

from pyserini_mores import RerankingSearcher
from pyserini_mores.sidecar import open_sidecar


def _read_run(path: str, depth: int) -> dict[str, list[tuple[str, float]]]:
    ranked: dict[str, list[tuple[int, str, float]]] = defaultdict(list)
    with open(path) as stream:
        for line in stream:
            qid, _, docid, rank, score, *_ = line.split()
            ranked[qid].append((int(rank), docid, float(score)))
    return {qid: [(docid, score) for _, docid, score in sorted(rows)[:depth]] for qid, rows in ranked.items()}


def _read_topics(path: str) -> dict[str, str]:
    with open(path) as stream:
        return dict(line.rstrip("\n").split("\t", 1) for line in stream if line.strip())


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as stream:
            for line in stream:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True)
    parser.add_argument("--topics", required=True)
    parser.add_argument("--run", required=True, help="TREC run holding at least --depth candidates per query")
    parser.add_argument("--reranker", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--fp16", required=True, help="the float16 sidecar")
    parser.add_argument("--codec-sidecar", required=True, help="the same store under a codec")
    parser.add_argument("--depth", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    run, topics = _read_run(args.run, args.depth), _read_topics(args.topics)
    qids = [qid for qid in topics if len(run.get(qid, ())) >= args.depth][:args.queries]
    if not qids:
        parser.error(f"no topic has {args.depth} candidates in {args.run}")
    extra = {"model": args.model} if args.model else {}
    searchers = {name: RerankingSearcher(args.index, args.reranker, rerank_depth=args.depth, sidecar=path,
                                         precision=args.precision, **extra)
                 for name, path in (("fp16", args.fp16), ("codec", args.codec_sidecar))}
    readers = {name: open_sidecar(path) for name, path in (("fp16", args.fp16), ("codec", args.codec_sidecar))}
    rows = {qid: readers["fp16"].rows_for_docids([docid for docid, _ in run[qid]]) for qid in qids}
    folded = searchers["codec"].reranker.folds_codec_rotation  # how the rerank path reads the codes
    tabled = searchers["codec"].reranker.scores_codes
    how = {"fp16": {}, "codec": {"rotated": True} if folded else {"codes": True} if tabled else {}}
    for name in searchers:  # warm up: models, page cache, codec parameters
        searchers[name].rerank_run({qids[0]: run[qids[0]]}, {qids[0]: topics[qids[0]]}, k=args.depth)
        readers[name].get_batch(rows[qids[0]], **how[name])
    rerank, read = defaultdict(list), defaultdict(list)
    for _ in range(args.repeats):
        for qid in qids:
            for name in ("fp16", "codec"):
                start = time.perf_counter()
                searchers[name].rerank_run({qid: run[qid]}, {qid: topics[qid]}, k=args.depth)
                rerank[name].append(time.perf_counter() - start)
                start = time.perf_counter()
                readers[name].get_batch(np.sort(rows[qid]), **how[name])
                read[name].append(time.perf_counter() - start)
    result = {"cpu": _cpu_model(), "cores": torch.get_num_threads(), "depth": args.depth, "queries": len(qids),
              "repeats": args.repeats, "reranker": args.reranker, "model": args.model, "precision": args.precision,
              "fp16": args.fp16, "codec_sidecar": args.codec_sidecar,
              "codec": readers["codec"].dtype, "bytes_per_token": readers["codec"].bytes_per_token,
              "rotation_folded_into_the_model": folded, "codes_scored_by_look_up_tables": tabled}
    for path, times in (("rerank", rerank), ("read", read)):
        for name in ("fp16", "codec"):
            result[f"{path}_{name}_median_ms"] = 1000 * statistics.median(times[name])
        result[f"{path}_ratio"] = result[f"{path}_codec_median_ms"] / result[f"{path}_fp16_median_ms"]
    result["decode_share_of_fp16_rerank"] = ((result["rerank_codec_median_ms"] - result["rerank_fp16_median_ms"])
                                             / result["rerank_fp16_median_ms"])
    for key, value in result.items():
        print(f"{key:32} {value:.3f}" if isinstance(value, float) else f"{key:32} {value}")
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(result, stream, indent=2)


if __name__ == "__main__":
    main()
