"""The README's Python snippet ("Using it from Python") runs as written: on the embedded sample, with the shipped
reranker reading its sidecar, never silently encoding from text."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Using it from Python"


def readme_python_block() -> str:
    """The first ```python block of the README's section on Python use."""
    section = README.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, f"no python block under {SECTION!r} in {README}"
    return found.group(1)


def test_the_snippet_is_python_on_the_shipped_default():
    block = readme_python_block()
    ast.parse(block)  # valid as written, with no placeholder such as `...` standing for an argument
    assert "..." not in block
    assert 'model="minilm"' not in block, "the untrained backbone ranks at random: the snippet shows the shipped model"


@pytest.mark.slow
def test_the_snippet_runs_as_written(tmp_path):
    """In a fresh process, as a user would run it (the package's cache, so the sample and its sidecar are built
    once); any warning that documents are encoded from their text fails it."""
    script = tmp_path / "snippet.py"
    script.write_text(readme_python_block(), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "PYTHONWARNINGS": "default"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "encoded from their text" not in done.stderr, done.stderr[-3000:]
