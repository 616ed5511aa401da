"""Pyserini itself, in the environment the README's set-up makes: its own commands and imports, in any order, with
the system's Java too old or absent, and without OpenAI credentials (the start-up hook, ``pyserini_mores._start_hook``).

Every check runs in a fresh interpreter of the test's own environment, as a user would type it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyserini_mores._jvm import MIN_JAVA_MAJOR, VECTOR_MODULE, read_java_runtime

from conftest import QUERIES, RESOURCES

JVM_DIR = Path("/usr/lib/jvm")
#: the failures Pyserini's own start met before the hook: a class of Java 21 on an older JVM, the option Pyserini
#: always gives on a runtime without the module, and the OpenAI SDK's refusal
JAVA_FAILURES = ("UnsupportedClassVersionError", f"Module {VECTOR_MODULE} not found", "Missing credentials")


def _system_java_homes(newer: bool) -> list[Path]:
    """The system's Java runtimes older than Java 21 (``newer=False``) or Java 21+ with the vector module."""
    homes = []
    for home in sorted(JVM_DIR.glob("*")) if JVM_DIR.is_dir() else []:
        runtime = read_java_runtime(home)
        if runtime is None or home.is_symlink():
            continue
        if (runtime.major >= MIN_JAVA_MAJOR and runtime.has_vector_module) if newer else runtime.major < MIN_JAVA_MAJOR:
            homes.append(home)
    return homes


def _environment(java: str) -> dict[str, str]:
    """The test's environment without OpenAI credentials, with ``java``: ``path`` (the system's ``java`` on PATH, no
    JAVA_HOME), ``old-home`` (JAVA_HOME at a system Java older than 21), ``none`` (no Java on PATH, no JAVA_HOME)."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("JAVA_HOME", "JDK_HOME", "JRE_HOME", "JVM_PATH") and not name.startswith("OPENAI_")}
    if java == "old-home":
        old = _system_java_homes(newer=False)
        if not old:
            pytest.skip(f"no Java older than {MIN_JAVA_MAJOR} in {JVM_DIR}")
        env["JAVA_HOME"] = str(old[0])
    elif java == "none":
        env["PATH"] = str(Path(sys.executable).parent)  # (the venv's commands only: `python`, no `java`)
    return env


def _run(args: list[str], env: dict[str, str], cwd: Path | None = None, timeout: int = 600):
    result = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    output = result.stdout + result.stderr
    assert not [failure for failure in JAVA_FAILURES if failure in output], output[-3000:]
    assert result.returncode == 0, output[-3000:]
    return result


@pytest.fixture(scope="module")
def start_hook_installed():
    """The hook is installed at interpreter start (by the ``.pth`` file the package's install puts in site-packages),
    and a program that never imports Pyserini loads nothing else of ours: no package, no pyjnius, no OpenAI."""
    ours = ("pyserini", "pyserini_mores", "pyserini_mores_models", "jnius", "jnius_config",
            "openai", "torch")
    script = ("import sys; print(json.dumps([type(f).__name__ for f in sys.meta_path])); "
              f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {ours!r})))")
    result = subprocess.run([sys.executable, "-c", "import json; " + script], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    finders, loaded = (json.loads(line) for line in result.stdout.splitlines())
    assert "PyseriniStartHook" in finders, (
        f"pyserini_mores_hook.pth is not installed for {sys.executable}: install the package as the README's "
        "set-up does (pip install -e .), which puts it in site-packages")
    assert loaded == ["pyserini_mores", "pyserini_mores._lazy", "pyserini_mores._start_hook"], loaded


@pytest.fixture(scope="module")
def topics_file(tmp_path_factory) -> Path:
    """The tiny collection's 16 test queries, as a Pyserini topics TSV."""
    path = tmp_path_factory.mktemp("topics") / "topics.tsv"
    path.write_text("".join(f"{qid}\t{text}\n" for qid, text in QUERIES.items()))
    return path


@pytest.fixture(scope="module")
def qrels_file(tmp_path_factory) -> Path:
    """The tiny qrels with judgments that no ranking of the tiny collection gets all right (graded too), so that
    the metrics of the runs below are not all 1."""
    path = tmp_path_factory.mktemp("qrels") / "qrels.txt"
    extra = ["q1 0 d01 1", "q1 0 d19 2", "q2 0 d02 1", "q5 0 d01 2", "q5 0 d13 1", "q8 0 d03 1", "q8 0 d20 2",
             "q12 0 d11 1", "q12 0 d07 2"]
    path.write_text((RESOURCES / "tiny_qrels.txt").read_text().rstrip("\n") + "\n" + "\n".join(extra) + "\n")
    return path


def _index_and_search(work: Path, topics: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """Pyserini's own indexer and BM25 search over the tiny collection: the index and the run."""
    (work / "docs").mkdir()
    shutil.copy(RESOURCES / "tiny_collection.jsonl", work / "docs" / "docs.jsonl")
    _run(["-m", "pyserini.index.lucene", "--collection", "JsonCollection", "--input", "docs", "--index", "index",
          "--generator", "DefaultLuceneDocumentGenerator", "--threads", "1", "--storeRaw", "--storePositions",
          "--storeDocvectors"], env, cwd=work)
    _run(["-m", "pyserini.search.lucene", "--index", "index", "--topics", str(topics),
          "--output", "run.trec", "--bm25", "--hits", "10"], env, cwd=work)
    run = work / "run.trec"
    assert {line.split()[0] for line in run.read_text().splitlines()} >= {"q1", "q2", "q5", "q8", "q12"}
    return work / "index", run


def _trec_eval(run: Path, qrels: Path, env: dict[str, str]) -> dict[str, float]:
    """``python -m pyserini.eval.trec_eval -c -m map -m ndcg_cut.10``: {measure: value} as printed (4 decimals)."""
    result = _run(["-m", "pyserini.eval.trec_eval", "-c", "-m", "map", "-m", "ndcg_cut.10", str(qrels), str(run)],
                  env)
    found = dict(re.findall(r"^(map|ndcg_cut_10)\s+all\s+([0-9.]+)$", result.stdout, flags=re.M))
    assert set(found) == {"map", "ndcg_cut_10"}, result.stdout
    return {measure: float(value) for measure, value in found.items()}


def _package_eval(run: Path, qrels: Path, env: dict[str, str], work: Path) -> dict[str, float]:
    report = work / f"{run.stem}.eval.json"
    _run(["-m", "pyserini_mores.eval", "--qrels", str(qrels), "--metrics", "MAP", "nDCG@10", "--json", str(report),
          "--", str(run)], env)
    [evaluated] = json.loads(report.read_text())["runs"].values()
    assert evaluated["path"] == str(run), evaluated["path"]
    return evaluated["aggregate"]


def _assert_same_metrics(trec_eval: dict[str, float], package: dict[str, float]) -> None:
    assert trec_eval == {"map": round(package["MAP"], 4), "ndcg_cut_10": round(package["nDCG@10"], 4)}, (
        trec_eval, package)


@pytest.mark.slow
def test_pyserini_commands_index_search_and_evaluate_and_the_package_reranks_their_run(
        start_hook_installed, topics_file, qrels_file, tiny_maxsim_dir, tmp_path):
    """With the system's Java on PATH and no JAVA_HOME: Pyserini indexes and searches, this package reranks that
    run, and Pyserini's trec_eval gives both runs the metrics the package's own eval gives them."""
    env = _environment("path")
    index, run = _index_and_search(tmp_path, topics_file, env)
    _run(["-m", "pyserini_mores.sidecar", "build", "--index", str(index), "--reranker", "maxsim", "--model",
          str(tiny_maxsim_dir), "--precision", "fp32"], env)
    reranked = tmp_path / "reranked.trec"
    _run(["-m", "pyserini_mores.search", "--index", str(index), "--topics", str(topics_file),
          "--run", str(run), "--reranker", "maxsim", "--model", str(tiny_maxsim_dir), "--precision", "fp32",
          "--rerank-depth", "10", "--hits", "10", "--output", str(reranked)], env)
    assert reranked.read_text() != run.read_text()
    metrics = {}
    for ranking in (run, reranked):
        metrics[ranking.name] = _trec_eval(ranking, qrels_file, env)
        _assert_same_metrics(metrics[ranking.name], _package_eval(ranking, qrels_file, env, tmp_path))
    assert all(0 < value < 1 for measures in metrics.values() for value in measures.values()), metrics


@pytest.mark.slow
@pytest.mark.parametrize("java", ["old-home", "none"])
def test_pyserini_commands_with_an_old_java_home_or_no_java(start_hook_installed, topics_file, qrels_file, java,
                                                            tmp_path):
    env = _environment(java)
    _, run = _index_and_search(tmp_path, topics_file, env)
    _assert_same_metrics(_trec_eval(run, qrels_file, env), _package_eval(run, qrels_file, env, tmp_path))


def test_pyserini_msmarco_passage_eval_starts(start_hook_installed):
    """Its module imports Pyserini's searchers (the JVM) before it fetches the official MS MARCO script: offline,
    the fetch is where it may stop, never at Java."""
    env = _environment("path")
    result = subprocess.run([sys.executable, "-m", "pyserini.eval.msmarco_passage_eval"], env=env,
                            capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert not [failure for failure in JAVA_FAILURES if failure in output], output[-3000:]
    assert result.returncode == 0 or "in download_evaluation_script" in output, output[-3000:]


_SEARCH = """
hits = LuceneSearcher({index!r}).search("text editor", k=2)
assert [hit.docid for hit in hits] == {expected!r}, [hit.docid for hit in hits]
"""
_AFTER = """
import os, json, jnius
home = jnius.autoclass("java.lang.System").getProperty("java.home")
openai_env = sorted(name for name in os.environ if name.startswith("OPENAI_"))
print(json.dumps({"java_home": home, "openai_env": openai_env, "path_head": os.environ["PATH"].split(os.pathsep)[0]}))
"""
#: what a user's program imports first: Pyserini alone, this package then Pyserini, this package's JVM start then
#: every Pyserini module a user would import
FIRST_IMPORTS = {
    "pyserini-first": "from pyserini.search.lucene import LuceneSearcher\n",
    "package-first": ("from pyserini_mores import RerankingSearcher\n"
                      "from pyserini.search.lucene import LuceneSearcher\n"),
    "ensure-jvm-first": ("import pyserini_mores\npyserini_mores.ensure_jvm()\nimport pyserini.search.faiss\n"
                         "import pyserini.index.lucene\nimport pyserini.eval.trec_eval\n"
                         "from pyserini.search.lucene import LuceneSearcher\n"),
}


def _python(script: str, env: dict[str, str]) -> dict:
    result = _run(["-c", script], env, timeout=300)
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("order", sorted(FIRST_IMPORTS))
def test_pyserini_imports_and_searches_in_any_import_order(start_hook_installed, tiny_index, order):
    """With the system's Java on PATH and no JAVA_HOME nor OPENAI_API_KEY, whatever is imported first: Pyserini
    searches, on a Java 21+ runtime that also comes first on PATH, and no OpenAI variable appears in the
    environment."""
    env = _environment("path")
    report = _python(FIRST_IMPORTS[order] + _SEARCH.format(index=str(tiny_index), expected=["d04", "d05"]) + _AFTER,
                     env)
    runtime = read_java_runtime(report["java_home"])
    assert runtime is not None and runtime.major >= MIN_JAVA_MAJOR, report
    assert report["path_head"] == str(Path(report["java_home"]) / "bin") and report["openai_env"] == [], report


def test_pyserini_keeps_a_java_21_java_home_and_its_vector_module(start_hook_installed, tiny_index):
    """A JAVA_HOME of Java 21+ is the one Pyserini's JVM runs on, with the module option Pyserini asks for."""
    newer = _system_java_homes(newer=True)
    if not newer:
        pytest.skip(f"no Java {MIN_JAVA_MAJOR}+ with {VECTOR_MODULE} in {JVM_DIR}")
    env = {**_environment("path"), "JAVA_HOME": str(newer[0])}
    script = (FIRST_IMPORTS["pyserini-first"] + _SEARCH.format(index=str(tiny_index), expected=["d04", "d05"])
              + "import jnius_config; print(jnius_config.get_options())" + _AFTER)
    result = _run(["-c", script], env, timeout=300)
    report = json.loads(result.stdout.splitlines()[-1])
    assert Path(report["java_home"]).resolve() == newer[0].resolve(), report
    assert f"--add-modules={VECTOR_MODULE}" in result.stdout, result.stdout


def test_the_openai_client_pyserini_builds_at_import_is_built_on_first_use(start_hook_installed):
    """Without a key the client stands in until used, then fails as the SDK does; a key set later is the one used."""
    script = """
import json, os
import pyserini.encode._openai as pyserini_openai
client = pyserini_openai.client
try:
    client.api_key
except Exception as error:
    refused = [type(error).__name__, "Missing credentials" in str(error)]
os.environ["OPENAI_API_KEY"] = "sk-set-later"
print(json.dumps({"refused": refused, "api_key": client.api_key}))
"""
    result = _run(["-c", script], _environment("path"))
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["refused"] == ["OpenAIError", True], report
    assert report["api_key"] == "sk-set-later", report
