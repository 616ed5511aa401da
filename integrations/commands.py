"""The reproduction pipelines' dry runs check each command they would run with the real parser of the CLI it calls,
so that a bad flag fails at once instead of after the hours of steps before it.

Both ``integrations/debian_packages/pipeline.py`` and ``integrations/msmarco_passage/reproduce.py`` parse their
commands through :func:`parse_arguments`.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io


def cli_parser(module: str) -> argparse.ArgumentParser:
    """The parser of ``python -m MODULE``: its ``__main__``'s ``build_parser()``, imported only when asked (each
    pulls in its command's module)."""
    try:
        main = importlib.import_module(f"{module}.__main__")
    except ModuleNotFoundError as error:
        parts = f"{module}.__main__".split(".")
        if error.name not in {".".join(parts[:end]) for end in range(1, len(parts) + 1)}:
            raise  # the command exists; something it imports is missing
        raise ValueError(f"no parser known for module {module}") from None
    return main.build_parser()


def parse_arguments(parser: argparse.ArgumentParser, args: list) -> argparse.Namespace:
    """``args`` parsed by ``parser``.

    Raises:
        ValueError: the parser rejects them; its message is argparse's own (the last line it prints).
    """
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args([str(arg) for arg in args])
    except SystemExit:
        lines = stderr.getvalue().strip().splitlines()
        raise ValueError(lines[-1] if lines else "rejected by argparse") from None
