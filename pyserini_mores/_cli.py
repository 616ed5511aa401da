"""Argument groups shared by the command-line tools, so every command names things the same way, and the
runner that reports a command's expected errors as one ``error:`` line."""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ._jvm import JavaNotFoundError
from ._model_args import parse_model_arg
from .errors import UserFixableError
from .models.backbones import BackboneNotFoundError
from .precision import PRECISION_CHOICES, check_device_name


def define_model_args(parser: argparse.ArgumentParser, *, default_reranker: str | None = None,
                      device: bool = False) -> None:
    """The reranker's options; with ``device``, also ``--device`` (for commands that place the model on one)."""
    group = parser.add_argument_group("reranker")
    group.add_argument("--reranker", default=default_reranker,
                       help="registered reranker name (bm25, maxsim, mores, prettr, tk, cross-encoder, or a plugin's)")
    group.add_argument("--model", default=None,
                       help="trained checkpoint directory, or a backbone (HF hub name, local dir, or 'minilm')")
    group.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                       help="model config override, repeatable (e.g. --model-arg reuse=s1)")
    group.add_argument("--precision", choices=PRECISION_CHOICES, default="auto",
                       help="compute precision of the model; auto (default): bf16 where the hardware runs it natively "
                            "(AMX or AVX512-BF16 CPUs, CUDA with bf16), fp32 elsewhere (emulated bf16 is ~20x slower)")
    if device:
        group.add_argument("--device", type=device_name, default="auto", metavar="{auto,cpu,cuda,cuda:N}",
                           help="where the model computes; auto (default): cuda when torch.cuda.is_available(), "
                                "else cpu")


def device_name(value: str) -> str:
    """argparse ``type`` of every ``--device``: the name checked, a bad one a usage error."""
    try:
        return check_device_name(value)
    except ValueError as error:  # argparse shows an ArgumentTypeError's message as the usage error
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_model_args(items: list[str]) -> dict:
    """``["reuse=s1", "n_interaction_blocks=2"]`` → ``{"reuse": "s1", "n_interaction_blocks": 2}``; an item that is
    not ``KEY=VALUE`` exits with its ``error:`` line."""
    try:
        return dict(parse_model_arg(item) for item in items)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None


def setup_logging(verbose: bool = False, quiet: bool = False) -> None:
    """Other libraries' logs from WARNING (INFO with ``verbose``); this package's from INFO, so that what a command
    decides or does on its own (the precision it chose, first-run indexing and encoding, a resumed build) is shown
    without being a warning; ``quiet`` keeps only warnings."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("pyserini_mores").setLevel(logging.WARNING if quiet else logging.INFO)


def command_parser(prog: str, description: str | None,
                   define_args: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """A command's parser, its arguments defined by ``define_args`` and its module docstring as the description."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    define_args(parser)
    return parser


def run_command(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int | None],
                argv: list[str] | None) -> int:
    """Set up logging (``-v``: INFO) and run, as :func:`run_parsed`."""

    def logged_run(args: argparse.Namespace) -> int | None:
        setup_logging(args.verbose)
        return run(args)

    return run_parsed(parser, logged_run, argv)


def run_parsed(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int | None],
               argv: Sequence[str] | None, *, error_status: int = 2, exit_on_error: bool = False) -> int:
    """Parse ``argv`` (``-v/--verbose`` added to the parser and its subcommands) and return ``run(args)``'s exit
    status (``None`` is 0).

    An expected error (see :func:`is_expected_error`) becomes one ``error: <message>`` line on stderr and the exit
    status ``error_status``; with ``--verbose`` its traceback comes first. With ``exit_on_error`` the line is raised
    as ``SystemExit("error: <message>")`` instead (exit status 1), for commands whose callers catch that. Any other
    exception propagates with its traceback, and ``SystemExit`` (argparse's usage errors, a command's own
    ``error:`` exits) passes through.
    """
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    try:
        status = run(args)
    except Exception as error:
        if not is_expected_error(error):
            raise
        if getattr(args, "verbose", False):
            traceback.print_exc()
        if exit_on_error:
            raise SystemExit(f"error: {error_message(error)}") from None
        print(f"error: {error_message(error)}", file=sys.stderr)
        return error_status
    return 0 if status is None else status


# What a user can cause and fix: bad input, a path that is missing or of the wrong kind, an unknown name, no Java, no
# backbone, and the package's own such errors (a sidecar damaged, mismatched, missing, or its disk full).
_EXPECTED_ERRORS: tuple[type[Exception], ...] = (
    ValueError, KeyError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError,
    JavaNotFoundError, BackboneNotFoundError, UserFixableError,
)


def is_expected_error(error: BaseException) -> bool:
    """Whether ``error`` is one a command reports as an ``error:`` line rather than a traceback."""
    return isinstance(error, _EXPECTED_ERRORS)


def error_message(error: BaseException) -> str:
    """The sentence of an error: a KeyError's argument unquoted, the class name when there is no message."""
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    return str(error) or type(error).__name__


_VERBOSE_HELP = "more progress on stderr, and the traceback of an error"


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and each of its subcommands ``-v/--verbose``, unless one defines its own."""
    _add_verbose_option(parser, default=False)
    # argparse lists subcommand parsers only through this private action class.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):  # an alias shares its command's parser
                # Left out of the namespace unless given, so that `-v` before the subcommand is not reset.
                _add_verbose_option(subparser, default=argparse.SUPPRESS)


def _add_verbose_option(parser: argparse.ArgumentParser, default: Any) -> None:
    with contextlib.suppress(argparse.ArgumentError):  # raised when the command defines -v/--verbose itself
        parser.add_argument("-v", "--verbose", action="store_true", default=default, help=_VERBOSE_HELP)
