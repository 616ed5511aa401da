"""The pipelines' dry-run check: a command parsed by the real parser of the CLI it calls."""
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
if str(REPOSITORY) not in sys.path:
    sys.path.append(str(REPOSITORY))

from integrations.commands import cli_parser, parse_arguments  # noqa: E402


@pytest.mark.parametrize("module", ["pyserini_mores.search", "pyserini_mores.sidecar", "pyserini_mores.train",
                                    "pyserini_mores.eval", "pyserini_mores.index"])
def test_each_cli_run_as_a_module_has_its_parser(module):
    assert cli_parser(module).prog == f"python -m {module}"


def test_a_search_command_parses_to_the_values_the_cli_would_use():
    parsed = parse_arguments(cli_parser("pyserini_mores.search"), ["--index", "idx", "--rerank-depth", 30])
    assert (parsed.index, parsed.rerank_depth) == ("idx", 30)


def test_a_rejected_flag_says_what_argparse_says():
    with pytest.raises(ValueError, match=r"unrecognized arguments: --no-such-flag"):
        parse_arguments(cli_parser("pyserini_mores.search"), ["--no-such-flag"])
    with pytest.raises(ValueError, match=r"argument --rerank-depth: must be an integer >= 0, not 'deep'"):
        parse_arguments(cli_parser("pyserini_mores.search"), ["--rerank-depth", "deep"])


def test_a_module_without_a_cli_is_refused_by_name():
    with pytest.raises(ValueError, match=r"no parser known for module pyserini_mores.no_such_command"):
        cli_parser("pyserini_mores.no_such_command")


def test_a_cli_whose_own_import_fails_is_not_reported_as_unknown(tmp_path, monkeypatch):
    # "fake" is a prefix of the CLI's own name, not one of its packages: the error is the dependency's
    (tmp_path / "fakecli").mkdir()
    (tmp_path / "fakecli" / "__init__.py").write_text("")
    (tmp_path / "fakecli" / "__main__.py").write_text("import fake\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="No module named 'fake'"):
        cli_parser("fakecli")
