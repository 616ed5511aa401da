"""The GPU check's dry run: it needs no GPU, prints every command the check runs, and each of them parses with the
real parser of the CLI it calls; a wheelhouse without the project's wheel and an unknown argument are refused."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
SCRIPT = REPOSITORY / "integrations" / "gpu_check.sh"
if str(REPOSITORY) not in sys.path:
    sys.path.append(str(REPOSITORY))

from integrations.commands import cli_parser, parse_arguments  # noqa: E402


def _gpu_check(*args, tmp_path) -> subprocess.CompletedProcess:
    # the Python running the tests is the `python` the dry run checks the flags with
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "TMPDIR": str(tmp_path)}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600,
                          cwd=REPOSITORY)


def test_the_dry_run_prints_each_command_and_each_parses(tmp_path):
    result = _gpu_check("--dry-run", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("dry run: every file and flag the check uses exists")
    commands = [shlex.split(line[2:]) for line in result.stdout.splitlines() if line.startswith("+ ")]
    modules = [command[2] for command in commands if command[1] == "-m"]
    assert modules == ["pytest", "pyserini_mores.sidecar", "pyserini_mores.search", "pyserini_mores.search",
                       "pyserini_mores.bench"]
    devices = []
    for command in commands:
        if command[1] == "-m" and command[2].startswith("pyserini_mores."):
            parsed = parse_arguments(cli_parser(command[2]), command[3:])  # raises on a flag the CLI lacks
            devices.append(parsed.device)
    assert devices == ["cuda", "cuda", "cpu", "cuda"]
    search = next(command for command in commands if command[2] == "pyserini_mores.search")
    assert search[search.index("--rerank-depth") + 1] == "1000" and search[search.index("--max-queries") + 1] == "200"
    pytest_command = commands[0]
    assert pytest_command[-2:] == ["tests/test_device.py", "tests/test_device_commands.py"]
    assert all((REPOSITORY / path).is_file() for path in pytest_command[-2:])


def test_a_wheelhouse_without_the_project_wheel_and_unknown_arguments_are_refused(tmp_path):
    empty = tmp_path / "wheels"
    empty.mkdir()
    result = _gpu_check("--dry-run", "--wheelhouse", str(empty), tmp_path=tmp_path)
    assert result.returncode == 1
    assert result.stderr == f"error: {empty} holds no pyserini_mores wheel: fill it with --download first\n"
    result = _gpu_check("--fast", tmp_path=tmp_path)
    assert (result.returncode, result.stderr) == (2, "error: unknown argument --fast (see --help)\n")
    result = _gpu_check(tmp_path=tmp_path)  # the real check needs a wheelhouse before anything else
    assert result.returncode == 1
    assert result.stderr.startswith("error: --wheelhouse is required")
