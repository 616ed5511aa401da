"""Argument groups shared by the command-line tools, so every command names things the same way."""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from ._model_args import parse_model_arg


def define_model_args(parser: argparse.ArgumentParser, *, default_reranker: str | None = None) -> None:
    group = parser.add_argument_group("reranker")
    group.add_argument("--reranker", default=default_reranker,
                       help="registered reranker name (bm25, maxsim, mores, prettr, tk, cross-encoder, or a plugin's)")
    group.add_argument("--model", default=None,
                       help="trained checkpoint directory, or a backbone (HF hub name, local dir, or 'minilm')")
    group.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                       help="model config override, repeatable (e.g. --model-arg reuse=s1)")
    group.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                       help="compute precision of the model (bf16: autocast, much faster on AMX/AVX-512 CPUs)")


def parse_model_args(items: list[str]) -> dict:
    """``["reuse=s1", "n_interaction_blocks=2"]`` → ``{"reuse": "s1", "n_interaction_blocks": 2}``; an item that is
    not ``KEY=VALUE`` exits with its ``error:`` line."""
    try:
        return dict(parse_model_arg(item) for item in items)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")


def run_command(prog: str, description: str | None, define_args: Callable[[argparse.ArgumentParser], None],
                run: Callable[[argparse.Namespace], int], argv: list[str] | None) -> int:
    """Parse ``argv`` and run; bad input (missing files, bad values, unknown names) becomes one ``error:`` line on
    stderr and exit code 2 instead of a traceback."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    define_args(parser)
    args = parser.parse_args(argv)
    setup_logging(getattr(args, "verbose", False))
    try:
        return run(args)
    except (FileNotFoundError, ValueError, KeyError) as error:
        # KeyError quotes its argument; show the sentence itself.
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"error: {message}", file=sys.stderr)
        return 2
