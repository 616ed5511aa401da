"""Argument groups shared by the command-line tools, so every command names things the same way."""
from __future__ import annotations

import argparse
import json
import logging
import sys


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
    """``["reuse=s1", "n_interaction_blocks=2"]`` → ``{"reuse": "s1", "n_interaction_blocks": 2}``."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --model-arg expects KEY=VALUE, got '{item}'")
        try:
            overrides[key.strip()] = json.loads(value)
        except ValueError:
            overrides[key.strip()] = value  # a bare string such as s1
    return overrides


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
