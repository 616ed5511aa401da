"""``python -m pyserini_mores.index --collection FILE --index DIR``: Pyserini's indexer with the JVM set up."""
from __future__ import annotations

import argparse
import sys

from .._cli import positive_int, run_parsed, setup_logging
from . import index_collection


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pyserini_mores.index", description=__doc__)
    parser.add_argument("--collection", required=True, help="MS MARCO collection.tsv, JSONL, or a JsonCollection "
                                                            "directory (optionally gzipped)")
    parser.add_argument("--index", required=True, help="index directory to create")
    parser.add_argument("--threads", type=positive_int, default=1, help="indexing threads")
    parser.add_argument("--strict", action="store_true",
                        help="refuse (exit 2, nothing written) a collection with empty or whitespace-only documents, "
                             "which Lucene does not index; without it they are left out and listed")
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_parsed(build_parser(), run_index, argv)


def run_index(args: argparse.Namespace) -> int:
    setup_logging(args.verbose)
    report = index_collection(args.collection, args.index, threads=args.threads, strict=args.strict)
    if report.skipped:
        shown = ", ".join(report.skipped[:10]) + (", ..." if len(report.skipped) > 10 else "")
        print(f"not indexed: {len(report.skipped)} document(s) with empty or whitespace-only text: {shown}",
              file=sys.stderr)
    print(f"indexed {report.num_docs} documents into {report.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
