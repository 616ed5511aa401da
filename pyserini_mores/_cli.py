"""Argument groups shared by the command-line tools, so every command names things the same way, and the
runner that reports a command's expected errors as one ``error:`` line."""
from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ._jvm import JavaNotFoundError
from ._model_args import parse_model_arg
from .errors import InterruptedExit, UsageExit, UserFixableError
from .models.backbones import BackboneNotFoundError
from .precision import PRECISION_CHOICES, check_device_name


def define_first_stage_args(parser: argparse.ArgumentParser, *,
                            index_help: str = "Lucene index directory or Pyserini prebuilt index name (default: the "
                                              "embedded sample)",
                            rerank_depth: int | None = 1000,
                            rerank_depth_help: str = "first-stage hits reranked per query",
                            threads_help: str | None = "BM25 threads") -> argparse._ArgumentGroup:
    """The first stage's options, named and checked the same in every command: ``--index``, ``--k1``, ``--b``,
    ``--threads`` (unless ``threads_help`` is ``None``) and ``--rerank-depth`` (unless ``rerank_depth`` is
    ``None``), whose default it is."""
    group = parser.add_argument_group("first stage")
    group.add_argument("--index", help=index_help)
    group.add_argument("--k1", type=non_negative_float, default=None,
                       help="BM25 k1 (default: Pyserini's for the index)")
    group.add_argument("--b", type=unit_float, default=None,
                       help="BM25 b in [0, 1] (default: Pyserini's for the index)")
    if threads_help is not None:
        group.add_argument("--threads", type=positive_int, default=1, help=threads_help)
    if rerank_depth is not None:
        group.add_argument("--rerank-depth", type=non_negative_int, default=rerank_depth, help=rerank_depth_help)
    return group


def define_model_args(parser: argparse.ArgumentParser, *, default_reranker: str | None = None,
                      device: bool = False) -> None:
    """The reranker's options; with ``device``, also ``--device`` (for commands that place the model on one)."""
    group = parser.add_argument_group("reranker")
    group.add_argument("--reranker", default=default_reranker,
                       help="registered reranker name (bm25, maxsim, mores, prettr, tk, cross-encoder, or a plugin's)")
    group.add_argument("--model", default=None,
                       help="a shipped model's name, a trained checkpoint directory, or a backbone (a Hugging Face "
                            "hub name ORG/NAME, a local directory, or 'minilm') (default: the reranker's shipped "
                            "model)")
    group.add_argument("--model-arg", action="append", type=model_arg, default=[], metavar="KEY=VALUE",
                       help="model config override, repeatable (e.g. --model-arg reuse=s1); the keys are the "
                            "model's config fields")
    group.add_argument("--precision", choices=PRECISION_CHOICES, default="auto",
                       help="compute precision of the model; auto (default): bf16 where the hardware runs it natively "
                            "(AMX or AVX512-BF16 CPUs, CUDA with bf16), fp32 elsewhere (emulated bf16 is ~20x slower)")
    if device:
        group.add_argument("--device", type=device_name, default="auto", metavar="{auto,cpu,cuda,cuda:N}",
                           help="where the model computes; auto (default): cuda when torch.cuda.is_available(), "
                                "else cpu")


def define_window_args(parser: argparse.ArgumentParser) -> None:
    """How a learned reranker reads documents longer than its model does: ``--aggregate``, ``--window``,
    ``--stride``, ``--max-windows`` (read back by :func:`window_options`)."""
    from .windows import AGGREGATIONS, DEFAULT_AGGREGATION

    group = parser.add_argument_group("long documents")
    group.add_argument("--aggregate", choices=AGGREGATIONS, default=None,
                       help="how a document's window scores make its score: firstp (the first window's), maxp (the "
                            "best), sump (their sum), avgcls (the model's head on the mean of the windows' [CLS] "
                            f"vectors: prettr, mores, cross-encoder) (default: {DEFAULT_AGGREGATION})")
    group.add_argument("--window", type=positive_int, default=None, metavar="N",
                       help="tokens per window, scoring from text (default: what the model reads of a document)")
    group.add_argument("--stride", type=positive_int, default=None, metavar="N",
                       help="tokens from one window's start to the next's (default: --window, no overlap)")
    group.add_argument("--max-windows", type=positive_int, default=None, metavar="N",
                       help="the most windows of one document, scoring from text (default: 1, the model's "
                            "truncation; a sidecar's windows are the ones it was built with)")


def window_options(args: argparse.Namespace) -> dict[str, Any]:
    """The reranker keywords of :func:`define_window_args`' flags: ``aggregate`` and ``windows`` (a
    :class:`~pyserini_mores.windows.WindowOptions`, checked), each only when given."""
    from .windows import WindowOptions

    options: dict[str, Any] = {}
    if args.aggregate is not None:
        options["aggregate"] = args.aggregate
    if args.window is not None or args.stride is not None or args.max_windows is not None:
        # a window or stride without --max-windows N > 1 is refused by WindowOptions itself
        options["windows"] = WindowOptions(args.window, args.stride, args.max_windows or 1)
    return options


def device_name(value: str) -> str:
    """argparse ``type`` of every ``--device``: the name checked, a bad one a usage error."""
    try:
        return check_device_name(value)
    except ValueError as error:  # argparse shows an ArgumentTypeError's message as the usage error
        raise argparse.ArgumentTypeError(str(error)) from None


def model_arg(value: str) -> tuple[str, object]:
    """argparse ``type`` of ``--model-arg``: ``KEY=VALUE`` parsed (:func:`parse_model_arg`), anything else a usage
    error."""
    try:
        return parse_model_arg(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--model-arg ")) from None


def _number(convert: Callable[[str], Any], check: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    """An argparse ``type``: ``convert(value)``, refused (a usage error naming the flag) unless ``check`` holds."""

    def parse(value: str) -> Any:
        try:
            number = convert(value)
        except ValueError:
            number = None
        if number is None or not check(number):
            raise argparse.ArgumentTypeError(f"must be {what}, not '{value}'")
        return number

    parse.__name__ = what  # argparse names the type in some messages
    return parse


positive_int = _number(int, lambda number: number > 0, "an integer >= 1")
non_negative_int = _number(int, lambda number: number >= 0, "an integer >= 0")
non_negative_float = _number(float, lambda number: number >= 0, "a number >= 0")  # NaN fails every comparison
unit_float = _number(float, lambda number: 0 <= number <= 1, "a number in [0, 1]")


def parse_model_args(items: list[str | tuple[str, Any]]) -> dict:
    """``["reuse=s1", "n_interaction_blocks=2"]`` → ``{"reuse": "s1", "n_interaction_blocks": 2}`` (items that
    ``--model-arg`` already parsed pass as they are); an item that is not ``KEY=VALUE`` exits with its ``error:``
    line."""
    try:
        return dict(item if isinstance(item, tuple) else parse_model_arg(item) for item in items)
    except ValueError as error:
        raise UsageExit(str(error)) from None


def setup_logging(verbose: bool = False, quiet: bool = False) -> None:
    """Warnings only; with ``verbose`` also INFO lines (what a command decides or does on its own: the precision it
    chose, first-run indexing and encoding, a resumed build). ``quiet`` keeps only warnings either way."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("pyserini_mores").setLevel(logging.INFO if verbose and not quiet else logging.WARNING)


class _ShowsDefaults(argparse.HelpFormatter):
    """Every option's default at the end of its help, unless the help already says it or there is none to show
    (a flag, an unset option)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if "default" in help_text or not action.option_strings or isinstance(action, argparse._HelpAction):
            return help_text
        if action.default in (None, False, [], argparse.SUPPRESS):
            return help_text
        return f"{help_text} (default: %(default)s)" if help_text else "(default: %(default)s)"


class HelpFormatter(_ShowsDefaults, argparse.RawDescriptionHelpFormatter):
    """The description as written, and every option's default (:class:`_ShowsDefaults`)."""


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Make ``parser``'s help show every option's default, keeping how it lays out the rest."""
    if not issubclass(parser.formatter_class, _ShowsDefaults):
        parser.formatter_class = type(f"ShowsDefaults{parser.formatter_class.__name__}",
                                      (_ShowsDefaults, parser.formatter_class), {})


def command_parser(prog: str, description: str | None,
                   define_args: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """A command's parser, its arguments defined by ``define_args`` and its module docstring as the description."""
    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)
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
               argv: Sequence[str] | None, *, error_status: int = 2, exit_on_error: bool = False,
               usage_exit: bool = False) -> int:
    """Parse ``argv`` (``-v/--verbose`` added to the parser and its subcommands) and return ``run(args)``'s exit
    status (``None`` is 0).

    An expected error (see :func:`is_expected_error`) becomes one ``error: <message>`` line on stderr and the exit
    status ``error_status``; with ``--verbose`` its traceback comes first. With ``exit_on_error`` the line is raised
    as ``SystemExit("error: <message>")`` instead (exit status 1), for commands whose callers catch that; with
    ``usage_exit``, printed and raised as :class:`~.errors.UsageExit` (exit status 2). Ctrl-C is one
    ``error: interrupted`` line, then :class:`~.errors.InterruptedExit` (a quiet exit, status 130). Any other
    exception propagates with its traceback, and ``SystemExit`` (argparse's usage errors, a command's own ``error:``
    exits) passes through, a :class:`~.errors.UsageExit`'s line printed first.
    """
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    try:
        status = run(args)
    except UsageExit as usage:
        _end_progress_bars()
        print(usage.args[0], file=sys.stderr)
        raise
    except KeyboardInterrupt as interrupt:
        _end_progress_bars()
        if getattr(args, "verbose", False):
            traceback.print_exc()
        stop = interrupt if isinstance(interrupt, InterruptedExit) else InterruptedExit()
        print(stop.args[0], file=sys.stderr)
        raise stop from None
    except Exception as error:
        if not is_expected_error(error):
            raise
        _end_progress_bars()
        if getattr(args, "verbose", False):
            traceback.print_exc()
        if exit_on_error:
            raise SystemExit(f"error: {error_message(error)}") from None
        print(f"error: {error_message(error)}", file=sys.stderr)
        if usage_exit:
            raise UsageExit(error_message(error)) from None
        return error_status
    return 0 if status is None else status


def _end_progress_bars() -> None:
    """Close the progress bars an error left open, so that its line starts on a line of its own, not after a bar's
    carriage return."""
    tqdm_module = sys.modules.get("tqdm")
    if tqdm_module is None:
        return
    for bar in list(getattr(tqdm_module.tqdm, "_instances", ())):
        with contextlib.suppress(Exception):  # a bar half torn down must not hide the error itself
            bar.close()


# What a user can cause and fix: bad input, a path that is missing or of the wrong kind, an unknown name, no Java, no
# backbone, and the package's own such errors (a sidecar damaged, mismatched, missing, or its disk full).
_EXPECTED_ERRORS: tuple[type[Exception], ...] = (
    ValueError, KeyError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError,
    JavaNotFoundError, BackboneNotFoundError, UserFixableError,
)


def is_expected_error(error: BaseException) -> bool:
    """Whether ``error`` is one a command reports as an ``error:`` line rather than a traceback: the user-fixable
    kinds above, and a full disk."""
    return isinstance(error, _EXPECTED_ERRORS) or (isinstance(error, OSError) and error.errno == errno.ENOSPC)


def error_message(error: BaseException) -> str:
    """The sentence of an error: a KeyError's argument unquoted, a full disk said in words with the file, the class
    name when there is no message."""
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    if isinstance(error, OSError) and error.errno == errno.ENOSPC and not isinstance(error, UserFixableError):
        where = f" writing {error.filename}" if error.filename else ""
        return f"the disk is full{where} ({error.strerror or 'No space left on device'}): free some space and run " \
               "the same command again"
    return str(error) or type(error).__name__


_VERBOSE_HELP = "more progress on stderr, and the traceback of an error"


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and each of its subcommands ``-v/--verbose``, unless one defines its own, and help that shows
    every default."""
    _add_verbose_option(parser, default=False)
    show_defaults(parser)
    answer_in_one_line(parser)
    # argparse lists subcommand parsers only through this private action class.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):  # an alias shares its command's parser
                # Left out of the namespace unless given, so that `-v` before the subcommand is not reset.
                _add_verbose_option(subparser, default=argparse.SUPPRESS)
                show_defaults(subparser)
                answer_in_one_line(subparser)


def answer_in_one_line(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` report a usage error as one ``error:`` line that names the flag (and where the options are
    listed), exit status 2, instead of argparse's usage block followed by the error."""

    def error(message: str):
        parser.exit(2, f"error: {message} (see {parser.prog} --help)\n")

    parser.error = error  # argparse calls self.error: the instance's own wins


def _add_verbose_option(parser: argparse.ArgumentParser, default: Any) -> None:
    with contextlib.suppress(argparse.ArgumentError):  # raised when the command defines -v/--verbose itself
        parser.add_argument("-v", "--verbose", action="store_true", default=default, help=_VERBOSE_HELP)
