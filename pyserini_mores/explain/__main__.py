"""python -m pyserini_mores.explain — why did these documents rank where they did? Writes PNG figures, the numbers
behind them (explanation.json) and an index.html that shows them side by side.

  MORES   attention heatmaps: document-module self-attention (one layer), query-module self-attention (last layer),
          and each interaction block's query→document cross-attention (paper Figure 2)
  TK      kernel mass per query term, per-kernel log/length scores, each query term's share of the score, the
          document text shaded by best match; the first two documents compared kernel by kernel (paper Figure 3)
  PreTTR  query↔document attention in the first joined layer (l+1)

Stored document representations are read from the reranker's sidecar when one exists (beside the index, or
--sidecar); otherwise documents are encoded from the text the index stores. With no --index, the embedded sample.

Example:
  python -m pyserini_mores.explain --reranker tk --model checkpoints/tk --query "pdf viewer" --top 2 --output out/
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_TOP = 2


def define_explain_args(parser: argparse.ArgumentParser) -> None:
    from .._cli import define_first_stage_args, define_model_args, positive_int

    define_first_stage_args(parser, rerank_depth=10, threads_help=None,
                            rerank_depth_help="BM25 hits the reranker orders to find the top N and to rank the "
                                              "documents")
    parser.add_argument("--query", required=True, help="the query text")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--docid", action="append", nargs="+", default=None, metavar="D",
                       help="documents to explain, in this order (TK compares the first two)")
    which.add_argument("--top", type=positive_int, default=None, metavar="N",
                       help=f"explain the reranker's top N of the BM25 top --rerank-depth (default: {DEFAULT_TOP})")
    parser.add_argument("--output", required=True, help="folder for the figures, explanation.json and index.html")
    define_model_args(parser, default_reranker=None, device=True)
    parser.add_argument("--sidecar", default=None, help="sidecar directory (default: beside the index, if built)")
    parser.add_argument("--heads", default="mean",
                        help="attention heads to average: 'mean' (all) or 0-based numbers such as 0,3")
    parser.add_argument("--layer", type=int, default=None,
                        help="MORES document-module layer whose self-attention is shown, 1..L (default: the last)")
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="tokens shown per heatmap axis (the JSON keeps all; default 64)")
    parser.add_argument("-v", "--verbose", action="store_true")


def main(argv: list[str] | None = None) -> int:
    from .._cli import command_parser, run_command

    return run_command(command_parser("python -m pyserini_mores.explain", __doc__, define_explain_args), run_explain,
                       argv)


def run_explain(args: argparse.Namespace) -> int:
    from .._cli import parse_model_args
    from ..index import fetch_texts
    from ..models.registry import model_types
    from ..rerankers.options import RerankerOptions, check_config, check_reranker_name
    from ..search.searcher import RerankingSearcher
    from ..types import Query, Text
    from ._explainers import EXPLAINERS, explain_documents
    from ._report import write_report
    from ._types import DocumentExplanation

    if not args.reranker:
        raise ValueError(f"--reranker is required ({', '.join(sorted(EXPLAINERS))})")
    if args.top is not None and args.top < 1:
        raise ValueError("--top must be at least 1")
    if args.max_tokens < 1:
        raise ValueError("--max-tokens must be at least 1")
    docids = [docid for group in args.docid for docid in group] if args.docid else None
    top = args.top or DEFAULT_TOP
    depth = max(args.rerank_depth, 0 if docids else top)
    # The reranker, its model and config checked and the device resolved (a GPU that is not there fails) now,
    # before the sample, the index or the model loads.
    check_reranker_name(args.reranker)
    overrides = parse_model_args(args.model_arg)
    if args.reranker in model_types():
        check_config(args.reranker, overrides, given_as="--model-arg")
    if args.reranker == "bm25":
        raise ValueError(f"explain supports the rerankers {', '.join(sorted(EXPLAINERS))}, not 'bm25'")
    reranker_options = RerankerOptions.from_kwargs(args.reranker, model=args.model, precision=args.precision,
                                                   device=args.device, **overrides).resolved()

    index = args.index
    if index is None:
        from ..search.sample import prepare_sample

        sample = prepare_sample()
        index = sample.index
        print(f"Embedded sample: {sample.cache}")
    # Documents without stored representations are encoded from the index's text: explaining a few is quick.
    searcher = RerankingSearcher(index, reranker_options, k1=args.k1, b=args.b, rerank_depth=depth,
                                 sidecar=args.sidecar or "auto", encode_from_text=not args.sidecar)
    try:
        reranker = searcher.reranker
        if getattr(reranker, "model", None) is None or reranker.model.model_type not in EXPLAINERS:
            raise ValueError(f"explain supports the rerankers {', '.join(sorted(EXPLAINERS))}, not '{args.reranker}'")
        ranked = searcher.search(args.query, k=depth) if depth else []
        ranks = {hit.docid: (rank, hit) for rank, hit in enumerate(ranked, start=1)}
        bm25 = {hit.docid: (rank, hit.score) for rank, hit in
                enumerate(searcher.searcher.search(args.query, k=max(depth, 1)), start=1)}
        if docids is None:
            docids = [hit.docid for hit in ranked[:top]]
            if not docids:
                raise ValueError(f"BM25 finds no document for '{args.query}'")
        texts = fetch_texts(searcher.searcher, docids)
        candidates = [Text(text=text, metadata={"docid": docid}) for docid, text in zip(docids, texts)]
        scored = reranker.rescore(Query(args.query), candidates)
        # The explainers build their inputs and read the maps on the CPU: the documents were scored on the device,
        # the few of one query are explained on the CPU (a no-op where the device is the CPU).
        reranker.model.to("cpu")
        documents = [DocumentExplanation(docid=docid, text=text, score=candidate.score,
                                         rank=ranks.get(docid, (None,))[0],
                                         bm25_rank=bm25.get(docid, (None, None))[0],
                                         bm25_score=bm25.get(docid, (None, None))[1])
                     for docid, text, candidate in zip(docids, texts, scored)]
        report = explain_documents(reranker, args.query, documents, heads=args.heads, layer=args.layer,
                                   index=str(searcher.index.prebuilt_name or searcher.index.path))
        page = write_report(report, args.output, max_tokens=args.max_tokens)
    finally:
        searcher.close()
    print(f"Explained {len(documents)} document(s) for '{args.query}' with {report.reranker} "
          f"(document representations from {report.source})")
    for document in documents:
        print(f"  {document.docid}: score {document.score:.4f}"
              + (f", rank {document.rank}" if document.rank is not None else "")
              + (f", BM25 rank {document.bm25_rank}" if document.bm25_rank is not None else ""))
    print(f"Report: {Path(page).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
