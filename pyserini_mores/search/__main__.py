"""python -m pyserini_mores.search — a first stage, then a learned reranker; writes a TREC/MS MARCO run.

The first stage is BM25 with Pyserini (default), BM25 + RM3 (--first-stage bm25+rm3), a Pyserini dense index
(--first-stage dense --dense-index DIR), Pyserini's hybrid of that dense index and BM25 (--first-stage hybrid
--dense-index DIR), or any other first stage's candidates from a run file (--run). With no
arguments it runs the embedded default: an offline slice of debian-packages shipped with the package.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from .._cli import (
    command_parser,
    define_first_stage_args,
    define_model_args,
    define_window_args,
    non_negative_float,
    non_negative_int,
    parse_model_args,
    positive_int,
    run_command,
    unit_float,
    window_options,
)
from .._jvm import import_pyserini
from .._model_args import format_model_arg
from ..errors import InterruptedExit, UsageError
from ..eval.metrics import evaluate, format_metrics_table
from ..formats import RUN_FORMATS, read_qrels, read_topics, results_to_run, write_run
from ..index import fetch_texts, index_identity
from ..models.registry import model_types
from .first_stage import DENSE_FIRST_STAGES, FIRST_STAGES
from .partial import PartialSearch
from .topic_search import TopicSearch, budget_report, search_topics

logger = logging.getLogger(__name__)


def define_search_args(parser: argparse.ArgumentParser) -> None:
    define_first_stage_args(parser, threads_help="BM25 threads")
    parser.add_argument("--topics", help="topics: a `qid<TAB>text` TSV file or a Pyserini topics name")
    parser.add_argument("--output", help="run file to write (default: printed summary only for the sample); an "
                        "interrupted search resumes from FILE.partial when the same command runs again")
    parser.add_argument("--restart", action="store_true",
                        help="with --output: discard an interrupted search (FILE.partial) instead of resuming it")
    parser.add_argument("--output-format", choices=["trec", "msmarco"], default="trec", help="run file format")
    parser.add_argument("--hits", type=positive_int, default=1000, help="hits per query in the run")
    parser.add_argument("--bm25", action="store_true",
                        help="Pyserini's flag for a BM25 first stage, the default here: accepted so that Pyserini's "
                             "search commands run unchanged")
    parser.add_argument("--first-stage", choices=list(FIRST_STAGES), default=None,
                        help="first stage run with Pyserini: bm25 (default), bm25+rm3 (the index must store "
                             "document vectors), dense (--dense-index, searched with Pyserini's FaissSearcher), or "
                             "hybrid (Pyserini's HybridSearcher fusing BM25 and --dense-index)")
    parser.add_argument("--rm3", action="store_true", help="Pyserini's flag for --first-stage bm25+rm3")
    parser.add_argument("--fb-terms", type=positive_int, default=10, help="RM3 expansion terms (Pyserini's set_rm3)")
    parser.add_argument("--fb-docs", type=positive_int, default=10, help="RM3 feedback documents (Pyserini's set_rm3)")
    parser.add_argument("--original-query-weight", type=unit_float, default=0.5,
                        help="RM3 weight of the original query (Pyserini's set_rm3)")
    parser.add_argument("--dense-index", metavar="DIR",
                        help="with --first-stage dense or hybrid: a Pyserini faiss index directory (files index and "
                             "docid) or prebuilt name, of the documents of --index")
    parser.add_argument("--encoder", default="minilm",
                        help="with --first-stage dense or hybrid: the query encoder, a Hugging Face model name or "
                             "directory (default: minilm, the offline MiniLM-L6); it must be the documents' encoder")
    parser.add_argument("--pooling", choices=["mean", "cls"], default="mean", help="query encoder pooling")
    parser.add_argument("--l2-norm", action=argparse.BooleanOptionalAction, default=True,
                        help="L2-normalise query vectors (default: yes)")
    parser.add_argument("--hybrid-alpha", type=float, default=None, metavar="ALPHA",
                        help="with --first-stage hybrid: fused score = ALPHA x BM25 + dense (Pyserini's alpha; "
                             "default: its 0.1)")
    parser.add_argument("--hybrid-normalization", action="store_true",
                        help="with --first-stage hybrid: scale each searcher's scores by their range before fusing "
                             "(Pyserini's normalization)")
    parser.add_argument("--hybrid-weight-on-dense", action="store_true",
                        help="with --first-stage hybrid: fused score = BM25 + ALPHA x dense (Pyserini's "
                             "weight_on_dense)")
    parser.add_argument("--run", metavar="FILE",
                        help="rerank another first stage's candidates from this run file instead of running BM25; "
                             "they are joined to the index by docid")
    parser.add_argument("--run-format", choices=list(RUN_FORMATS), default=None,
                        help="format of --run: trec or msmarco (default: detected)")
    parser.add_argument("--skip-unknown-docids", action="store_true",
                        help="with --run: drop candidates whose docids the index does not hold (default: an error)")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="queries per BM25 batch")
    define_model_args(parser, default_reranker=None, device=True)
    define_window_args(parser)
    parser.add_argument("--sidecar", default=None, help="sidecar directory (default: beside the index)")
    parser.add_argument("--encode-from-text", action="store_true",
                        help="where the reranker's sidecar is missing, encode the documents from their text (slow) "
                             "instead of refusing")
    parser.add_argument("--rerank-batch-size", type=positive_int, default=250,
                        help="candidates scored per model batch")
    parser.add_argument("--time-budget-ms", type=non_negative_float, default=None, metavar="B",
                        help="per-query rerank time budget in ms (BM25 excluded): rerank the deepest depth <= "
                             "--rerank-depth whose cost, measured once on this machine and cached, fits B; "
                             "0 = BM25 order")
    parser.add_argument("--interpolate", type=float, default=None, metavar="ALPHA",
                        help="fuse scores: ALPHA x the reranker's + (1 - ALPHA) x the first stage's, each min-max "
                             "normalised per query (choose ALPHA on dev queries; default: the reranker's alone)")
    parser.add_argument("--recalibrate", action="store_true",
                        help="with --time-budget-ms: measure the reranker's cost again instead of using the cache")
    parser.add_argument("--qrels", help="qrels file or Pyserini qrels name: print BM25 and reranked metrics")
    parser.add_argument("--max-queries", type=positive_int, default=None, help="only the first N topics")
    parser.add_argument("--examples", type=non_negative_int, default=None,
                        help="queries to show with their top results (default: 3 for the embedded sample, else 0)")
    parser.add_argument("-v", "--verbose", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    return command_parser("python -m pyserini_mores.search", __doc__, define_search_args)


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), run_search, argv)


def run_search(args: argparse.Namespace) -> int:
    # Every mistake in the flags is refused before the sample, the index, the JVM or a model loads.
    first_stage = first_stage_options(args)
    if args.restart and not args.output:
        raise UsageError("--restart discards an interrupted search's FILE.partial: it goes with --output FILE")
    if args.interpolate is not None and not 0 <= args.interpolate <= 1:
        raise UsageError("--interpolate: the interpolation weight alpha must be within [0, 1], not "
                         f"{args.interpolate:g}")
    reranker = reranker_options(args)
    inputs = resolve_inputs(args, reranker)
    searcher = open_searcher(args, inputs, first_stage)
    print(f"Index: {searcher.index.path} ({searcher.num_docs} documents), first stage: "
          f"{describe_first_stage(searcher, args.run)}; reranker: {describe_reranker(searcher.reranker)}"
          + (f", sidecar {searcher.sidecar_path}" if searcher.sidecar_path else ""))
    windows = describe_windows(searcher.reranker)
    if windows is not None:
        print(f"Long documents: {windows}")
    if searcher.stage_options.budgeted:  # calibrated now, after the sidecar is attached, so no query's time has it
        calibration = searcher.calibrate(recalibrate=args.recalibrate)
        print(f"Time budget {args.time_budget_ms:g} ms/query; calibrated cost {calibration.describe()}")

    candidates = None
    if args.run:
        candidates = searcher.run_first_stage(args.run, inputs.topics, k=args.hits, run_format=args.run_format,
                                              skip_unknown_docids=args.skip_unknown_docids)
    partial, found = None, None
    if args.output:
        partial, found = PartialSearch.open(args.output, search_identity(args, searcher, inputs), list(inputs.topics),
                                            restart=args.restart)
        if found.results:
            print(f"Resuming the interrupted search in {partial.directory}: {len(found.results)} of "
                  f"{len(inputs.topics)} queries already searched")
    try:
        searched = search_topics(searcher, inputs.topics, hits=args.hits, batch_size=args.batch_size,
                                 threads=args.threads, keep_first_stage=inputs.qrels is not None,
                                 candidates=candidates, found=found, after_query=partial.add if partial else None)
    except KeyboardInterrupt:
        if partial is None:
            raise
        partial.write_chunk()  # every query finished so far, before the message says so
        raise InterruptedExit(f"interrupted: the queries searched so far are kept in {partial.directory}; the same "
                              "command resumes there") from None
    finally:
        if partial is not None:  # an error keeps every query finished so far
            partial.write_chunk()
    report_search(args, searcher, inputs, searched, first_stage.kind)
    if partial is not None:
        partial.discard()  # the run file is written
    searcher.close()
    return 0


def reranker_options(args: argparse.Namespace):
    """The reranker the flags ask for (the embedded sample's when neither --index nor --reranker is given), its
    name, model and config overrides checked and its device resolved, before anything loads."""
    from ..rerankers.options import RerankerOptions, check_config, check_reranker_name
    from .sample import DEFAULT_MODEL, DEFAULT_MODEL_ARGS, DEFAULT_RERANKER

    embedded = args.index is None
    name = check_reranker_name(args.reranker or (DEFAULT_RERANKER if embedded else "bm25"))
    overrides = parse_model_args(args.model_arg)
    if name == "bm25":
        if args.model or overrides:
            logger.warning("--model and --model-arg are ignored: the bm25 reranker has no model")
        if window_options(args):
            logger.warning("--aggregate, --window, --stride and --max-windows are ignored: the bm25 reranker scores "
                           "whole documents")
        return RerankerOptions("bm25")
    model = args.model
    if embedded and args.reranker is None:
        model, overrides = model or DEFAULT_MODEL, {**DEFAULT_MODEL_ARGS, **overrides}
    if name in model_types():
        check_config(name, overrides, given_as="--model-arg")
    options = RerankerOptions.from_kwargs(name, model=model, batch_size=args.rerank_batch_size,
                                          precision=args.precision, device=args.device, **window_options(args),
                                          **overrides)
    return options.resolved()  # a GPU that is not there fails now


def first_stage_options(args: argparse.Namespace):
    """The first stage the flags ask for (:class:`~.options.FirstStageOptions`; with --run, the run is the first
    stage and its kind is unused), contradictory flags refused."""
    from .first_stage import Dense, Hybrid, Rm3
    from .options import FirstStageOptions

    kind = first_stage_of(args)
    rm3 = Rm3(args.fb_terms, args.fb_docs, args.original_query_weight) if kind == "bm25+rm3" else None
    dense = Dense(args.dense_index, args.encoder, args.pooling, args.l2_norm) if kind in DENSE_FIRST_STAGES else None
    hybrid = None
    if kind == "hybrid":
        hybrid = Hybrid(Hybrid.alpha if args.hybrid_alpha is None else args.hybrid_alpha, args.hybrid_normalization,
                        args.hybrid_weight_on_dense)
    return FirstStageOptions(kind, k1=args.k1, b=args.b, rm3=rm3, dense=dense, hybrid=hybrid)


# Arguments that do not change the run's lines, and the paths whose contents the identity holds instead
RESULT_FREE_ARGUMENTS = frozenset({"output", "restart", "qrels", "examples", "verbose", "batch_size", "threads",
                                   "recalibrate", "max_queries", "index", "topics", "model", "run"})


def search_identity(args: argparse.Namespace, searcher, inputs: SearchInputs) -> dict:
    """What decides a search's run, which an interrupted search must share to be resumed: the other arguments, the
    topics, the index, the reranker with the precision and device it resolved to, the model's weights and tokenizer,
    and the candidates of ``--run``."""
    arguments = {name: value for name, value in vars(args).items() if name not in RESULT_FREE_ARGUMENTS}
    arguments["model_arg"] = [format_model_arg(*item) for item in args.model_arg]  # as typed: KEY=VALUE
    identity = {"arguments": arguments,
                "topics": hashlib.sha256(json.dumps(list(inputs.topics.items())).encode()).hexdigest(),
                "index": index_identity(searcher.searcher, content=False),
                "reranker": describe_reranker(searcher.reranker),
                "long documents": describe_windows(searcher.reranker),
                # with qrels the partial search keeps the first stage's hits too, to evaluate them on every query
                "evaluated (qrels)": inputs.qrels is not None}
    fingerprint = getattr(getattr(searcher.reranker, "model", None), "fingerprint", None)
    if callable(fingerprint):
        identity["model"] = fingerprint()
    if args.run:
        identity["run"] = hashlib.sha256(Path(args.run).read_bytes()).hexdigest()
    return identity


@dataclass
class SearchInputs:
    """What a search command runs on: the index, topics and qrels (the embedded sample's when no --index), and the
    reranker's options."""

    index: str
    topics: dict[str, str]
    qrels: dict[str, dict[str, int]] | None
    reranker: object  # RerankerOptions
    sample: object | None = None  # the embedded sample, when it is what runs

    @property
    def embedded(self) -> bool:
        return self.sample is not None


def resolve_inputs(args: argparse.Namespace, reranker) -> SearchInputs:
    """The index, topics and qrels the flags name, or the embedded sample's (prepared on first use); qrels that
    judge none of the topics are refused, before any search."""
    from .sample import prepare_sample

    embedded = args.index is None
    if embedded != (args.topics is None):
        raise UsageError("--index and --topics go together (give neither to run the embedded sample)")
    sample = None
    if embedded:
        sample = prepare_sample()
        index, topics_arg, qrels_arg = sample.index, str(sample.topics), args.qrels or str(sample.qrels)
        print(f"Embedded sample: {sample.cache}")
    else:
        index, topics_arg, qrels_arg = args.index, args.topics, args.qrels

    topics = load_topics(topics_arg)
    if args.max_queries:
        topics = dict(list(topics.items())[:args.max_queries])
    qrels = load_qrels(qrels_arg) if qrels_arg else None
    if qrels is not None:  # judge only the topics searched (--max-queries), else the missing ones count as 0
        qrels = judged_topics(qrels, topics, qrels_arg)
    return SearchInputs(index=index, topics=topics, qrels=qrels, reranker=reranker, sample=sample)


def judged_topics(qrels: dict[str, dict[str, int]], topics: dict[str, str], qrels_arg: str
                  ) -> dict[str, dict[str, int]]:
    """The judgements of ``topics``' queries. None at all is refused (the wrong qrels for these topics: a search
    would end in metrics of nothing); some topics without any is said in a warning with their count."""
    judged = {qid: judgements for qid, judgements in qrels.items() if qid in topics}
    if not judged:
        raise UsageError(f"--qrels {qrels_arg} judges none of the {len(topics)} topics' queries (its first query is "
                         f"'{next(iter(qrels), '')}', the topics' '{next(iter(topics), '')}'): the qrels of other "
                         "topics?")
    if len(judged) < len(topics):
        logger.warning("--qrels %s judges %d of the %d topics' queries: the metrics are of those %d", qrels_arg,
                       len(judged), len(topics), len(judged))
    return judged


def open_searcher(args: argparse.Namespace, inputs: SearchInputs, first_stage):
    """The :class:`~.searcher.RerankingSearcher` the flags describe (the sample's own for the embedded default)."""
    # The searcher imports torch: only now, so that --help stays instant.
    from .sample import sample_searcher
    from .searcher import RerankingSearcher

    stage = dict(rerank_depth=args.rerank_depth, time_budget_ms=args.time_budget_ms, interpolate=args.interpolate)
    if inputs.embedded and not args.sidecar:
        return sample_searcher(inputs.sample, inputs.reranker, first_stage=first_stage, **stage)
    return RerankingSearcher(inputs.index, inputs.reranker, first_stage=first_stage, sidecar=args.sidecar or "auto",
                             encode_from_text=args.encode_from_text, **stage)


def report_search(args: argparse.Namespace, searcher, inputs: SearchInputs, searched: TopicSearch,
                  first_stage: str) -> None:
    """Write the run (--output), then print the rerank times, the budget's depths, the metrics and examples."""
    results, topics = searched.results, inputs.topics
    first_stage_label = "run" if args.run else {"bm25": "BM25", "bm25+rm3": "BM25+RM3", "dense": "dense",
                                                  "hybrid": "hybrid"}[first_stage]
    label = searcher.reranker.name
    if args.interpolate is not None:
        label += f" + {first_stage_label} (alpha {args.interpolate:g})"
    if args.output:
        write_run(args.output, ((qid, results[qid]) for qid in topics), output_format=args.output_format,
                  tag=f"pyserini_mores-{searcher.reranker.name}")
        print(f"Run written to {args.output}")
    if searcher.reranker.name != "bm25" and searched.stats:
        rerank_ms = [stats.rerank_ms for stats in searched.stats.values()]
        print(f"Rerank time per query ({args.rerank_depth} candidates at most): median "
              f"{statistics.median(rerank_ms):.1f} ms over {len(rerank_ms)} queries")
        windows = getattr(searcher.reranker, "windows_per_candidate", None)
        if windows is not None:
            print(f"Windows scored per candidate: {windows:.2f} ({searcher.reranker.aggregate})")
    if args.time_budget_ms is not None and searched.stats:
        for line in budget_report(list(searched.stats.values()), args.time_budget_ms):
            print(line)
    if inputs.qrels is not None:
        print_metrics(inputs.qrels, {first_stage_label: searched.first_stage, label: results})
    examples = args.examples if args.examples is not None else (3 if inputs.embedded else 0)
    if examples:
        print_examples(searcher, topics, results, examples)


def first_stage_of(args: argparse.Namespace) -> str:
    """The Pyserini first stage the flags ask for (with --run, the run is the first stage and this is unused)."""
    first_stage = args.first_stage or ("bm25+rm3" if args.rm3 else "bm25")
    if args.rm3 and first_stage != "bm25+rm3":
        raise UsageError(f"--rm3 contradicts --first-stage {first_stage}")
    if args.run and (args.rm3 or args.first_stage):
        raise UsageError("--run replaces the first stage: give either --run or --first-stage/--rm3")
    if (args.run_format or args.skip_unknown_docids) and not args.run:
        raise UsageError("--run-format and --skip-unknown-docids apply to --run, which is not given")
    needs_dense = first_stage in DENSE_FIRST_STAGES
    if needs_dense and not args.dense_index:
        raise UsageError(f"--first-stage {first_stage} and --dense-index go together: give the Pyserini dense index")
    if args.dense_index and not needs_dense:
        raise UsageError("--dense-index is for --first-stage dense or hybrid")
    hybrid_flags = args.hybrid_alpha is not None or args.hybrid_normalization or args.hybrid_weight_on_dense
    if hybrid_flags and first_stage != "hybrid":
        raise UsageError("--hybrid-alpha, --hybrid-normalization and --hybrid-weight-on-dense are for "
                         "--first-stage hybrid")
    return first_stage


def describe_reranker(reranker) -> str:
    """The reranker's name, with the precision and device its model computes in (a model-free one has neither)."""
    computes = [f"{what} {getattr(reranker, what)}" for what in ("precision", "device")
                if getattr(reranker, what, None) is not None]
    return reranker.name + (f" ({', '.join(computes)})" if computes else "")


def describe_windows(reranker) -> str | None:
    """How the reranker reads a long document (its aggregation and windows), or ``None`` for one without windows."""
    describe = getattr(reranker, "describe_windows", None)
    return describe() if callable(describe) else None


def describe_first_stage(searcher, run: str | None) -> str:
    if run:
        return f"run {run}"
    if searcher.hybrid is not None:
        hybrid = searcher.hybrid
        return (f"hybrid of BM25 k1={searcher.k1} b={searcher.b} and dense index {searcher.dense.index} "
                f"(alpha={hybrid.alpha} normalization={hybrid.normalization} "
                f"weight_on_dense={hybrid.weight_on_dense})")
    if searcher.dense is not None:
        return f"dense index {searcher.dense.index}"
    described = f"BM25 k1={searcher.k1} b={searcher.b}"
    if searcher.rm3 is not None:
        rm3 = searcher.rm3
        described += (f" + RM3 fb_terms={rm3.fb_terms} fb_docs={rm3.fb_docs} "
                      f"original_query_weight={rm3.original_query_weight}")
    return described


def load_topics(spec: str) -> dict[str, str]:
    """A ``qid<TAB>text`` file, or a Pyserini topics name (downloaded by Pyserini when not bundled)."""
    if Path(spec).is_file():
        return read_topics(spec)
    topics = _from_pyserini("topics", spec, lambda search: search.get_topics(spec), "a qid<TAB>text TSV file")
    if not topics:
        raise ValueError(f"unknown topics name '{spec}'")
    return {str(qid): (value.get("title") or value.get("text") or "") for qid, value in topics.items()}


def load_qrels(spec: str) -> dict[str, dict[str, int]]:
    """A TREC qrels file, or a Pyserini qrels name."""
    if Path(spec).is_file():
        return read_qrels(spec)
    return read_qrels(_from_pyserini("qrels", spec, lambda search: search.get_qrels_file(spec), "a TREC qrels file"))


def _from_pyserini(kind: str, spec: str, load, offline_hint: str):
    """Load topics/qrels by Pyserini name, turning its download failures into a message that says what to do."""
    if "/" in spec or spec.endswith((".tsv", ".txt")):
        raise FileNotFoundError(f"{kind} file {spec} does not exist")
    try:
        return load(import_pyserini("pyserini.search"))
    except Exception as error:  # Pyserini raises Java exceptions or URLErrors when it cannot download
        raise FileNotFoundError(
            f"{kind} '{spec}' is not a file and Pyserini could not load it by name "
            f"({str(error).splitlines()[0] if str(error) else type(error).__name__}); offline, pass {offline_hint}"
        ) from error


def print_metrics(qrels, runs: dict[str, dict]) -> None:
    # Evaluated as written to a run file (scores rounded as there), so the numbers equal `eval` on the file.
    rows = [(name, evaluate(results_to_run(results), qrels)) for name, results in runs.items()]
    print(format_metrics_table(rows))


def print_examples(searcher, topics, results, count: int) -> None:
    for qid in list(topics)[:count]:
        print(f"\nquery {qid}: {topics[qid]}")
        top = results[qid][:3]
        for rank, (hit, text) in enumerate(zip(top, fetch_texts(searcher.searcher, [h.docid for h in top])), 1):
            bm25_rank = f"BM25 rank {hit.first_stage_rank}" if hit.first_stage_rank else ""
            print(f"  {rank}. {hit.docid} score {hit.score:.3f} ({bm25_rank}) {text[:90]}...")


if __name__ == "__main__":
    sys.exit(main())
