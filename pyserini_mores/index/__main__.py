"""``python -m pyserini_mores.index --collection FILE --index DIR``: Pyserini's indexer with the JVM set up."""
from __future__ import annotations

import argparse
import sys

from .._cli import setup_logging
from . import index_collection


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pyserini_mores.index", description=__doc__)
    parser.add_argument("--collection", required=True, help="MS MARCO collection.tsv, JSONL, or a JsonCollection "
                                                            "directory (optionally gzipped)")
    parser.add_argument("--index", required=True, help="index directory to create")
    parser.add_argument("--threads", type=int, default=1)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        path = index_collection(args.collection, args.index, threads=args.threads)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"index written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
