"""python -m pyserini_mores.budget — sweep per-query rerank time budgets for several rerankers.

For every reranker and budget B (ms), each query is reranked to the deepest depth whose predicted cost fits B (the
cost model is measured once per reranker on this machine and cached; --recalibrate measures again), and B after
the rerank stage starts is its deadline: no batch of candidates is started that would end after it; the candidates
not scored, and the hits below the depth, keep their BM25 order. Budgets cover the rerank stage only (text fetch,
query encoding, sidecar reads, scoring); BM25 is excluded. Writes budget_sweep.{tsv,md,json,png} to --output-dir:
budget → depth (and candidates scored in time) → MRR@10/nDCG@10, the measured p50/p95/p99 ms/query and the
fraction of queries within B, and a plot of effectiveness against budget, one line per reranker.

Rerankers are given as NAME or NAME:MODEL, where NAME is a registered reranker (bm25, maxsim, mores, prettr, tk,
cross-encoder) and MODEL a trained checkpoint directory or a backbone (default: minilm). Learned rerankers that read
stored representations need their sidecar beside the index (python -m pyserini_mores.sidecar build ...).

Example:
  python -m pyserini_mores.budget --index indexes/debian --topics queries.dev.tsv --qrels qrels.dev.txt \\
      --rerankers bm25 maxsim:ckpt/maxsim mores:ckpt/mores-s1 --model-arg mores:reuse=s1 \\
      --budgets 25 50 100 250 500 1000 --output-dir sweeps/debian

With no --index/--topics/--qrels it runs on the embedded debian-packages sample (its sidecars built on first use).
"""
from __future__ import annotations

import argparse
import logging
import sys

from .._cli import (
    HelpFormatter,
    define_first_stage_args,
    device_name,
    parse_model_args,
    positive_int,
    run_parsed,
    setup_logging,
)
from ..formats import write_run
from ..precision import PRECISION_CHOICES, resolve_device
from ..search.__main__ import load_qrels, load_topics
from .sweep import format_markdown, parse_reranker_specs, run_sweep, write_outputs

logger = logging.getLogger(__name__)

DEFAULT_BUDGETS = (25, 50, 100, 250, 500, 1000)


def define_budget_args(parser: argparse.ArgumentParser) -> None:
    define_first_stage_args(parser, rerank_depth_help="the deepest rerank depth a budget can buy")
    parser.add_argument("--topics", help="topics: a `qid<TAB>text` TSV file or a Pyserini topics name")
    parser.add_argument("--qrels", help="qrels file or Pyserini qrels name")
    parser.add_argument("--rerankers", nargs="+", default=["bm25", "maxsim"], metavar="NAME[:MODEL]",
                        help="rerankers to sweep, each NAME or NAME:MODEL (default: bm25 maxsim)")
    parser.add_argument("--budgets", nargs="+", type=float, default=list(DEFAULT_BUDGETS), metavar="MS",
                        help="per-query rerank time budgets in ms; 0 = BM25 order, inf = no budget "
                             f"(default: {' '.join(map(str, DEFAULT_BUDGETS))})")
    parser.add_argument("--output-dir", required=True, help="where budget_sweep.{tsv,md,json,png} are written")
    parser.add_argument("--model-arg", action="append", default=[], metavar="[NAME:]KEY=VALUE",
                        help="model config override, repeatable; with NAME: only for that reranker "
                             "(e.g. --model-arg mores:reuse=s1), without: for every learned reranker")
    parser.add_argument("--precision", choices=PRECISION_CHOICES, default="auto",
                        help="compute precision of the learned rerankers (auto: bf16 where the hardware runs it "
                             "natively, fp32 elsewhere)")
    parser.add_argument("--device", type=device_name, default="auto", metavar="{auto,cpu,cuda,cuda:N}",
                        help="where the learned rerankers compute; auto (default): cuda when "
                             "torch.cuda.is_available(), else cpu")
    parser.add_argument("--rerank-batch-size", type=positive_int, default=250, help="candidates scored per model batch")
    parser.add_argument("--hits", type=positive_int, default=100, help="hits per query kept for evaluation")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="queries per BM25 batch")
    parser.add_argument("--torch-threads", type=int, default=None, metavar="N",
                        help="torch intra-op threads for the rerankers (default: torch's; part of the calibration "
                             "key). On a machine shared with other work, 1 gives steadier timings")
    parser.add_argument("--cold-cache", action="store_true",
                        help="evict each learned reranker's sidecar from the page cache before every query, so that "
                             "its reads come from storage (default: warm, as after earlier queries)")
    parser.add_argument("--max-queries", type=positive_int, default=None, help="only the first N topics")
    parser.add_argument("--recalibrate", action="store_true",
                        help="measure every reranker's cost again instead of using the cached calibration")
    parser.add_argument("--save-runs", action="store_true",
                        help="also write a TREC run per reranker and budget to --output-dir/runs")
    parser.add_argument("-v", "--verbose", action="store_true")


def parse_scoped_model_args(items: list[str]) -> dict[str | None, dict]:
    """``["reuse=s1", "mores:n_interaction_blocks=2"]`` → ``{None: {"reuse": "s1"}, "mores": {...: 2}}``."""
    scoped: dict[str | None, dict] = {}
    for item in items:
        key = item.partition("=")[0]
        scope, sep, _ = key.partition(":")
        name, setting = (scope, item[len(scope) + 1:]) if sep else (None, item)
        scoped.setdefault(name, {}).update(parse_model_args([setting]))
    return scoped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyserini_mores.budget", description=__doc__,
                                     formatter_class=HelpFormatter)
    define_budget_args(parser)

    def checked_run(args: argparse.Namespace) -> int:
        if any(not budget >= 0 for budget in args.budgets):
            parser.error("--budgets are milliseconds >= 0 (or inf)")
        setup_logging(args.verbose)
        return run(args, argv)

    return run_parsed(parser, checked_run, argv)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    embedded = args.index is None
    if embedded != (args.topics is None) or (args.index is None) != (args.qrels is None):
        raise ValueError("--index, --topics and --qrels go together (give none to sweep the embedded sample)")
    specs = parse_reranker_specs(args.rerankers, parse_scoped_model_args(args.model_arg))
    # Every reranker's name, model and config checked, and the device resolved once (a GPU that is not there fails),
    # now: before the sample, the index or a model loads.
    device = resolve_device(args.device) if any(spec.name != "bm25" for spec in specs) else None
    options = [reranker_options(spec, batch_size=args.rerank_batch_size, precision=args.precision, device=device)
               for spec in specs]
    sample = None
    if embedded:
        from ..search.sample import prepare_sample

        sample = prepare_sample()
        index, topics_arg, qrels_arg = sample.index, str(sample.topics), str(sample.qrels)
    else:
        index, topics_arg, qrels_arg = args.index, args.topics, args.qrels
    topics = load_topics(topics_arg)
    if args.max_queries:
        topics = dict(list(topics.items())[:args.max_queries])
    qrels = load_qrels(qrels_arg)

    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    searchers = {}
    try:
        for spec, reranker in zip(specs, options):
            searchers[spec.display] = open_searcher_for(reranker, index, sample, k1=args.k1, b=args.b,
                                                        rerank_depth=args.rerank_depth)
        first = next(iter(searchers.values()))
        print(f"Index: {first.index.path} ({first.num_docs} documents), {len(topics)} queries; rerankers: "
              f"{', '.join(searchers)}; budgets (ms): {' '.join(f'{b:g}' for b in args.budgets)}")
        settings = {"command": "python -m pyserini_mores.budget " + " ".join(sys.argv[1:] if argv is None else argv),
                    "index": str(first.index.path), "topics": topics_arg, "qrels": qrels_arg,
                    "queries": len(topics), "rerank_depth": args.rerank_depth, "hits": args.hits,
                    "precision": args.precision, "device": args.device,
                    "rerank_batch_size": args.rerank_batch_size,
                    "torch_threads": _torch_threads(), "cold_cache": args.cold_cache,
                    "rerankers": {label: {"name": spec.name, "model": spec.model, "overrides": spec.overrides,
                                          "sidecar": str(searchers[label].sidecar_path or "")}
                                  for label, spec in zip(searchers, specs)},
                    "timed": "rerank stage per query (text fetch if needed, query encoding, sidecar reads, scoring, "
                             "sorting); BM25 excluded"}
        result = run_sweep(searchers, topics, qrels, args.budgets, hits=args.hits, batch_size=args.batch_size,
                           threads=args.threads, recalibrate=args.recalibrate, keep_runs=args.save_runs,
                           cold_cache=args.cold_cache, settings=settings)
    finally:
        for searcher in searchers.values():
            searcher.close()

    for label, calibration in result.calibrations.items():
        print(f"Calibration {label}: {calibration.describe()} (within {calibration.max_relative_error:.0%} of the "
              f"measured medians at {', '.join(str(n) for n, _ in calibration.points)} candidates)")
    index_name = first.index.prebuilt_name or f"{first.index.path.parent.name}/{first.index.path.name}"
    title = f"{index_name}: {len(topics)} queries, rerank depth ≤ {args.rerank_depth}"
    paths = write_outputs(result, args.output_dir, title=title)
    if args.save_runs:
        write_runs(result, paths["tsv"].parent / "runs")
    print(format_markdown(result.rows), end="")
    print("Written: " + ", ".join(str(path) for path in paths.values()))
    return 0


def reranker_options(spec, *, batch_size: int, precision: str, device):
    """The :class:`~pyserini_mores.rerankers.options.RerankerOptions` of one spec, checked (``batch_size``,
    ``precision`` and ``device`` are the learned rerankers')."""
    from ..models.registry import model_types
    from ..rerankers.options import RerankerOptions, check_config, check_reranker_name

    check_reranker_name(spec.name)
    if spec.name == "bm25":
        return RerankerOptions("bm25")
    if spec.name in model_types():
        check_config(spec.name, spec.overrides, given_as="--model-arg")
    return RerankerOptions.from_kwargs(spec.name, model=spec.model, batch_size=batch_size, precision=precision,
                                       device=device, **spec.overrides)


def open_searcher_for(reranker, index, sample, *, k1: float | None, b: float | None, rerank_depth: int):
    """A :class:`RerankingSearcher` for one reranker's options; learned rerankers must find their sidecar (built on
    first use for the embedded sample)."""
    from ..search.sample import sample_searcher
    from ..search.searcher import RerankingSearcher

    if sample is not None:
        return sample_searcher(sample, reranker, k1=k1, b=b, rerank_depth=rerank_depth)
    return RerankingSearcher(index, reranker, k1=k1, b=b, rerank_depth=rerank_depth)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def write_runs(result, directory) -> None:
    for (label, budget), results in result.runs.items():
        name = f"{label.replace(':', '_').replace('/', '_')}-{budget:g}ms.trec"
        write_run(directory / name, results, tag=f"pyserini_mores-{label}-{budget:g}ms")


if __name__ == "__main__":
    sys.exit(main())
