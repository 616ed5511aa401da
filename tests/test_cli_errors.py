"""Expected errors reach the user as one ``error:`` line and a non-zero exit; ``-v`` adds the traceback; unexpected
errors keep theirs. Every command has ``-v/--verbose``."""
from __future__ import annotations

import argparse
import importlib
import shutil
import subprocess
import sys

import pytest

from pyserini_mores._cli import run_parsed
from pyserini_mores._jvm import JavaNotFoundError
from pyserini_mores.sidecar import SidecarCorruptError, SidecarMismatchError

from conftest import RESOURCES

TOPICS = RESOURCES / "tiny_topics.tsv"


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture
def truncated_sidecar(maxsim_sidecar, tmp_path):
    copy = tmp_path / "sidecar"
    shutil.copytree(maxsim_sidecar, copy)
    tokens = copy / "tokens.bin"
    with open(tokens, "r+b") as stream:
        stream.truncate(tokens.stat().st_size - 10)
    return copy


def test_search_on_a_truncated_sidecar_prints_one_error_line(tiny_index, tiny_maxsim_dir, truncated_sidecar):
    command = [sys.executable, "-m", "pyserini_mores.search", "--index", str(tiny_index), "--topics", str(TOPICS),
               "--reranker", "maxsim", "--model", str(tiny_maxsim_dir), "--sidecar", str(truncated_sidecar),
               "--hits", "3"]
    quiet = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert quiet.returncode != 0
    assert "Traceback" not in quiet.stderr, quiet.stderr[-3000:]
    errors = _error_lines(quiet.stderr)
    assert len(errors) == 1, quiet.stderr[-3000:]
    assert "tokens.bin: file is truncated" in errors[0]

    verbose = subprocess.run([*command, "-v"], capture_output=True, text=True, timeout=600)
    assert verbose.returncode == quiet.returncode
    assert "Traceback (most recent call last)" in verbose.stderr
    assert "SidecarCorruptError" in verbose.stderr
    assert _error_lines(verbose.stderr) == errors


# ---- the runner, in process -----------------------------------------------------------------------------------------


def _run_raising(error: BaseException, *argv: str, error_status: int = 2) -> int:
    def run(args: argparse.Namespace) -> int:
        raise error

    return run_parsed(argparse.ArgumentParser(prog="tool"), run, list(argv), error_status=error_status)


@pytest.mark.parametrize("error, message", [
    (SidecarCorruptError("tokens.bin: file is truncated"), "tokens.bin: file is truncated"),
    (SidecarMismatchError("built for another index"), "built for another index"),
    (FileNotFoundError("index /x does not exist"), "index /x does not exist"),
    (JavaNotFoundError("needs Java 21+"), "needs Java 21+"),
    (ValueError("--hits must be positive"), "--hits must be positive"),
    (KeyError("unknown reranker 'monot5'"), "unknown reranker 'monot5'"),  # the sentence, not its repr
])
def test_expected_errors_are_one_line(error, message, capsys):
    assert _run_raising(error) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert _run_raising(error, error_status=1) == 1
    capsys.readouterr()
    assert _run_raising(error, "--verbose") == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("Traceback (most recent call last)") and stderr.endswith(f"\nerror: {message}\n")


def test_exit_on_error_raises_the_error_line(capsys):
    def run(args: argparse.Namespace) -> int:
        raise FileNotFoundError("no sidecar beside the index")

    for argv in ([], ["-v"]):
        with pytest.raises(SystemExit) as exit_info:
            run_parsed(argparse.ArgumentParser(prog="tool"), run, argv, exit_on_error=True)
        assert exit_info.value.code == "error: no sidecar beside the index"  # Python prints it, exit status 1
    assert capsys.readouterr().err.startswith("Traceback (most recent call last)")  # -v only


def test_unexpected_errors_keep_their_traceback():
    with pytest.raises(RuntimeError, match="a bug"):
        _run_raising(RuntimeError("a bug"))
    with pytest.raises(TypeError):
        _run_raising(TypeError("another"))


def test_run_returning_none_is_success_and_system_exit_passes_through():
    parser = argparse.ArgumentParser(prog="tool")
    assert run_parsed(parser, lambda args: None, []) == 0
    with pytest.raises(SystemExit) as exit_info:
        run_parsed(argparse.ArgumentParser(prog="tool"), lambda args: sys.exit("error: said by the command"), [])
    assert exit_info.value.code == "error: said by the command"


@pytest.mark.parametrize("module, argv", [
    ("search", []), ("explain", []), ("eval", []), ("bench", []), ("budget", []), ("index", []),
    ("sidecar", []), ("sidecar", ["info"]), ("sidecar", ["verify"]), ("sidecar", ["build"]),
    ("sidecar", ["assemble"]), ("sidecar", ["transcode"]),
    ("train", []), ("train", ["mine-negatives"]), ("train", ["train"]), ("train", ["pretrain-compressor"]),
    ("train", ["export-delta"]), ("train", ["fold-blocks"]), ("train", ["widen-ffn"]), ("train", ["average"]),
    ("train", ["recipes"]),
])
def test_every_command_has_a_verbose_flag(module, argv, capsys):
    main = importlib.import_module(f"pyserini_mores.{module}.__main__").main
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    assert "-v, --verbose" in capsys.readouterr().out
