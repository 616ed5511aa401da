"""Every mistake is answered in one ``error:`` line before any work starts (exit status 2, the flag named), and the
stops a user cannot prevent — Ctrl-C, a full disk, a query Lucene cannot run — end in one ``error:`` line of their
own, without a traceback, keeping what was searched."""
from __future__ import annotations

import errno
import importlib
import os
from pathlib import Path

import pytest

from pyserini_mores import _io as io_module
from pyserini_mores import get_reranker
from pyserini_mores.rerankers.options import RerankerOptions, UnknownConfigKeyError, UnknownModelError
from pyserini_mores.search import RerankingSearcher, SidecarMissingError
from pyserini_mores.search.__main__ import main as search_main
from pyserini_mores.search.partial import partial_directory
from pyserini_mores.search.searcher import QueryRefusedError

from conftest import RESOURCES

TOPICS = RESOURCES / "tiny_topics.tsv"
QRELS = RESOURCES / "tiny_qrels.txt"
MAXSIM_KEYS = "doc_max_length, normalize, projection_dim, query_max_length"


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _refused(main, argv, capsys, status: int = 2) -> str:
    """The one line ``main(argv)`` answers with (exit ``status``, nothing on stdout: no work started)."""
    try:
        returned = main(argv)
    except SystemExit as exit_info:
        returned = exit_info.code
    assert returned == status
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err, captured
    errors = _errors(captured.err)
    assert len(errors) == 1 and captured.err.strip().splitlines() == errors, captured.err
    return errors[0]


# ---- the reranker, its model and the model's config -------------------------------------------------------------


@pytest.mark.parametrize("model", [None, "minilm"], ids=["shipped", "backbone"])
def test_an_unknown_model_arg_is_refused_listing_the_keys_the_model_knows(tiny_index, model, capsys):
    argv = ["--index", str(tiny_index), "--topics", str(TOPICS), "--reranker", "maxsim",
            "--model-arg", "projecton_dim=64"] + (["--model", model] if model else [])
    assert _refused(search_main, argv, capsys) == (
        f"error: --model-arg 'projecton_dim' is not a setting of maxsim models; they know: {MAXSIM_KEYS}")


def test_an_unknown_config_key_is_refused_from_python_too(tiny_maxsim_dir):
    with pytest.raises(UnknownConfigKeyError, match=f"'projecton_dim' is not a setting of maxsim models; they "
                                                    f"know: {MAXSIM_KEYS}"):
        get_reranker("maxsim", model=tiny_maxsim_dir, projecton_dim=64)


def test_an_unknown_model_lists_the_shipped_ones_and_how_to_name_others(tiny_index, capsys):
    line = _refused(search_main, ["--index", str(tiny_index), "--topics", str(TOPICS), "--reranker", "maxsim",
                                  "--model", "debian-maxsimm"], capsys)
    assert line.startswith("error: unknown model 'debian-maxsimm': not a shipped model (debian-cross-encoder, "
                           "debian-maxsim, ")
    assert line.endswith("give a checkpoint or backbone directory, 'minilm' (the bundled backbone), or a Hugging "
                         "Face hub name as ORG/NAME (e.g. google-bert/bert-base-uncased)")
    with pytest.raises(UnknownModelError):
        get_reranker("maxsim", model="debian-maxsimm")


def test_an_unknown_reranker_is_refused_before_the_sample_loads(capsys):
    # no --index: the embedded sample would be prepared (and printed) first if the name were checked later
    assert _refused(search_main, ["--reranker", "monot5"], capsys) == (
        "error: unknown reranker 'monot5'; known rerankers: bm25, cross-encoder, maxsim, mores, prettr, tk")


def test_reranker_options_are_checked_when_made():
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, not 0"):
        RerankerOptions("maxsim", batch_size=0)
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16, not 'fp16'"):
        RerankerOptions("maxsim", precision="fp16")
    options = RerankerOptions.from_kwargs("maxsim", model="minilm", batch_size=8, projection_dim=16)
    assert (options.batch_size, options.config) == (8, {"projection_dim": 16})
    assert options.factory_kwargs()["projection_dim"] == 16
    with pytest.raises(TypeError, match="the bm25 reranker takes no options"):
        RerankerOptions.from_kwargs("bm25", model="minilm")


# ---- impossible values, named by their flag --------------------------------------------------------------------


@pytest.mark.parametrize("flag, value, expected", [
    ("--hits", "0", "an integer >= 1"), ("--rerank-depth", "-1", "an integer >= 0"),
    ("--threads", "0", "an integer >= 1"), ("--batch-size", "0", "an integer >= 1"),
    ("--rerank-batch-size", "0", "an integer >= 1"), ("--b", "1.5", "a number in [0, 1]"),
    ("--k1", "-1", "a number >= 0"), ("--time-budget-ms", "-5", "a number >= 0"),
    ("--time-budget-ms", "nan", "a number >= 0"),
    ("--max-queries", "0", "an integer >= 1"), ("--fb-terms", "0", "an integer >= 1"),
])
def test_an_impossible_value_is_refused_naming_its_flag(flag, value, expected, capsys):
    assert _refused(search_main, [flag, value], capsys) == (
        f"error: argument {flag}: must be {expected}, not '{value}' (see python -m pyserini_mores.search --help)")


def test_interpolate_out_of_range_is_refused_naming_its_flag(capsys):
    assert _refused(search_main, ["--interpolate", "2"], capsys) == (
        "error: --interpolate: the interpolation weight alpha must be within [0, 1], not 2")


def test_rerank_depth_is_checked_by_the_searcher_too(tiny_index):
    with pytest.raises(ValueError, match="rerank_depth must be an integer >= 0, not -1"):
        RerankingSearcher(tiny_index, "bm25", rerank_depth=-1)


# ---- long documents: the aggregation and the windows ----------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--reranker", "tk", "--aggregate", "avgcls"],
     "error: --aggregate avgcls averages the [CLS] vectors a model's head reads, and tk scores without one: use "
     "firstp, maxp, sump, firstmaxp"),
    (["--reranker", "maxsim", "--aggregate", "avgcls"],
     "error: --aggregate avgcls averages the [CLS] vectors a model's head reads, and maxsim scores without one: use "
     "firstp, maxp, sump, firstmaxp"),
    (["--reranker", "mores", "--window", "64"],
     "error: --window and --stride cut a document into windows: give --max-windows N too (the most windows of one "
     "document)"),
    (["--reranker", "mores", "--window", "64", "--max-windows", "1"],
     "error: --window and --stride cut a document into windows: give --max-windows N too (the most windows of one "
     "document)"),
    (["--reranker", "mores", "--window", "8", "--stride", "9", "--max-windows", "2"],
     "error: --stride 9 is longer than --window 8: text between windows would be read by none"),
    (["--max-windows", "0"],
     "error: argument --max-windows: must be an integer >= 1, not '0' (see python -m pyserini_mores.search --help)"),
])
def test_long_document_flags_are_refused_in_one_line_before_anything_loads(argv, message, capsys):
    assert _refused(search_main, argv, capsys) == message
    # argparse quotes the choices or not by Python version
    assert _refused(search_main, ["--aggregate", "meanp"], capsys).startswith(
        "error: argument --aggregate: invalid choice: 'meanp' (choose from ")


def test_windows_other_than_the_sidecars_are_refused_naming_both(tiny_index, tiny_maxsim_dir, maxsim_sidecar,
                                                                 capsys):
    argv = ["--index", str(tiny_index), "--topics", str(TOPICS), "--reranker", "maxsim", "--model",
            str(tiny_maxsim_dir), "--max-windows", "3"]
    assert _refused(search_main, argv, capsys) == (
        "error: windows --window 62 --stride 62 --max-windows 3 differ from the --window 62 --stride 62 "
        f"--max-windows 1 sidecar {maxsim_sidecar} stores; its windows are cut when it is built: leave out --window, "
        "--stride and --max-windows, or build a sidecar with these windows")


def test_the_aggregation_and_windows_reach_the_reranker_from_python(tiny_index, tiny_maxsim_dir):
    from pyserini_mores.windows import WindowOptions

    windows = WindowOptions(window=16, stride=8, max_windows=3)
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, sidecar=None, aggregate="sump",
                                 windows=windows)
    assert (searcher.reranker.aggregate, searcher.reranker.windows) == ("sump", windows)
    assert searcher.reranker.describe_windows() == "sump of at most 3 windows of 16 tokens every 8"
    assert searcher.reranker.windows_per_candidate is None
    assert searcher.search("a configurable text editor", k=5)
    assert 1 < searcher.reranker.windows_per_candidate <= 3  # the tiny documents are 10 to 40 tokens long
    searcher.close()
    reranker = get_reranker("maxsim", model=tiny_maxsim_dir, aggregate="firstp")
    assert (reranker.aggregate, reranker.windows) == ("firstp", None)
    assert reranker.describe_windows() == "firstp of 1 window of 62 tokens"
    with pytest.raises(TypeError, match="windows must be a WindowOptions, not int"):
        RerankerOptions("maxsim", windows=3)


# ---- exit status 2 for a usage error, in every command ------------------------------------------------------------


@pytest.mark.parametrize("module, argv, message", [
    ("search", ["--restart"], "error: --restart discards an interrupted search's FILE.partial: it goes with "
                              "--output FILE"),
    ("search", ["--index", "x"], "error: --index and --topics go together (give neither to run the embedded "
                                 "sample)"),
    ("sidecar", ["build", "--index", "x", "--output", "y"], "error: --reranker is required"),
    ("sidecar", ["build", "--index", "x", "--reranker", "tk", "--output", "y", "--window", "64"],
     "error: --window and --stride cut a document into windows: give --max-windows N too (the most windows of one "
     "document)"),
    ("train", ["mine-negatives", "--topics", "t", "--qrels", "q", "--output", "o"],
     "error: mine-negatives needs --index, or both --run and --collection"),
    ("train", ["mine-negatives", "--index", "x", "--topics", "t", "--qrels", "q", "--output", "o", "--depth", "0"],
     "error: argument --depth: must be an integer >= 1, not '0' (see python -m pyserini_mores.train "
     "mine-negatives --help)"),
    ("eval", ["run.trec", "--qrels", "q", "--margins", "2"],
     "error: --margins are fractions of the baseline in [0, 1), e.g. 0.02 (see python -m pyserini_mores.eval --help)"),
    ("bench", ["--device", "tpu"], "error: argument --device: device must be one of auto, cpu, cuda, cuda:N, not "
                                   "'tpu' (see python -m pyserini_mores.bench --help)"),
    ("budget", ["--output-dir", "o", "--budgets", "-1"], "error: --budgets are milliseconds >= 0 (or inf) (see "
                                                         "python -m pyserini_mores.budget --help)"),
    ("explain", ["--query", "q", "--output", "o", "--top", "0"], "error: argument --top: must be an integer >= 1, "
                                                                 "not '0' (see python -m pyserini_mores.explain "
                                                                 "--help)"),
    ("index", [], "error: the following arguments are required: --collection, --index (see python -m "
                  "pyserini_mores.index --help)"),
])
def test_every_command_exits_2_on_a_usage_error_with_one_line(module, argv, message, capsys, tmp_path,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    main = importlib.import_module(f"pyserini_mores.{module}.__main__").main
    assert _refused(main, argv, capsys) == message


@pytest.mark.parametrize("module, argv", [
    ("search", []), ("explain", []), ("budget", []), ("bench", []), ("eval", []), ("index", []), ("sidecar", ["build"]),
    ("train", ["mine-negatives"]),
])
def test_help_shows_every_default(module, argv, capsys):
    main = importlib.import_module(f"pyserini_mores.{module}.__main__").main
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    out = capsys.readouterr().out
    if module == "search":
        assert "--hits HITS           hits per query in the run (default: 1000)" in out
        assert "first-stage hits reranked per query (default: 1000)" in " ".join(out.split())
    if module == "explain":
        assert "to rank the documents (default: 10)" in " ".join(out.split())
    if module in ("search", "budget", "train"):
        assert "--threads THREADS" in out and "BM25 threads (default: 1)" in " ".join(out.split())


# ---- qrels that judge none of the topics --------------------------------------------------------------------------


def test_qrels_of_other_topics_are_refused_before_searching(tiny_index, tmp_path, capsys):
    qrels = tmp_path / "other.qrels"
    qrels.write_text("x1 0 d1 1\nx2 0 d2 1\n")
    output = tmp_path / "run.trec"
    assert _refused(search_main, ["--index", str(tiny_index), "--topics", str(TOPICS), "--qrels", str(qrels),
                                  "--output", str(output)], capsys) == (
        f"error: --qrels {qrels} judges none of the 4 topics' queries (its first query is 'x1', the topics' 'q1'): "
        "the qrels of other topics?")
    assert not output.exists() and not partial_directory(output).exists()


def test_qrels_judging_some_topics_warn_with_the_count(tiny_index, tmp_path, capsys, caplog):
    topics = tmp_path / "topics.tsv"
    topics.write_text("q1\ttext editor\nq2\tweb server reverse proxy\nzz\tpackage manager\n")
    assert search_main(["--index", str(tiny_index), "--topics", str(topics), "--qrels", str(QRELS),
                        "--hits", "5"]) == 0
    assert f"--qrels {QRELS} judges 2 of the 3 topics' queries: the metrics are of those 2" in caplog.text


# ---- the sidecar: the same refusal from Python and the command line ----------------------------------------------


def test_a_missing_sidecar_is_refused_alike_by_python_and_the_cli(tiny_index, tiny_maxsim_dir, tmp_path, capsys):
    sidecar = tmp_path / "no-sidecar"
    with pytest.raises(SidecarMissingError) as refused:
        RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, sidecar=sidecar)
    message = str(refused.value)
    assert message.startswith(f"no sidecar at {sidecar}: build it with `python -m pyserini_mores.sidecar build "
                              f"--index {tiny_index} --reranker maxsim --model {tiny_maxsim_dir} --output {sidecar}`")
    assert message.endswith("or encode the documents from their text instead (slow; --encode-from-text, or "
                            "encode_from_text=True in Python)")
    argv = ["--index", str(tiny_index), "--topics", str(TOPICS), "--reranker", "maxsim", "--model",
            str(tiny_maxsim_dir), "--sidecar", str(sidecar)]
    assert search_main(argv) == 2
    assert _errors(capsys.readouterr().err) == [f"error: {message}"]


def test_encoding_from_text_is_asked_for_explicitly(tiny_maxsim_dir, tmp_path):
    from pyserini_mores.index import build_lucene_index

    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "docs.jsonl").write_text((RESOURCES / "tiny_collection.jsonl").read_text())
    index = build_lucene_index(tmp_path / "jsonl", tmp_path / "index")  # no sidecar beside it
    with pytest.raises(SidecarMissingError):
        RerankingSearcher(index, "maxsim", model=tiny_maxsim_dir)
    searcher = RerankingSearcher(index, "maxsim", model=tiny_maxsim_dir, encode_from_text=True, rerank_depth=5)
    assert searcher.sidecar_path is None and searcher.reranker.needs_text
    bm25 = RerankingSearcher(index, "bm25").search("web server", k=5)
    assert sorted(hit.docid for hit in searcher.search("web server", k=5)) == sorted(hit.docid for hit in bm25)


# ---- Ctrl-C, a full disk, a query Lucene refuses ------------------------------------------------------------------


def _search(tiny_index, output, *extra) -> list[str]:
    return ["--index", str(tiny_index), "--topics", str(TOPICS), "--hits", "5", "--output", str(output), *extra]


def _ends_with_its_own_error_line(stderr: str) -> str:
    """The ``error:`` line, checked to start a line (after the progress bar's carriage returns) and to end stderr."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.rstrip("\n").split("\n")
    assert lines[-1].startswith("error: ") and "\r" not in lines[-1], stderr
    assert _errors(stderr) == [lines[-1]]
    return lines[-1]


def test_ctrl_c_ends_in_one_line_keeping_the_queries_searched(tiny_index, tmp_path, capsys, monkeypatch):
    output = tmp_path / "run.trec"
    rerank_hits = RerankingSearcher.rerank_hits
    calls = []

    def interrupted_at_the_fourth(self, query, hits, *args, **kwargs):
        calls.append(query)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return rerank_hits(self, query, hits, *args, **kwargs)

    monkeypatch.setattr(RerankingSearcher, "rerank_hits", interrupted_at_the_fourth)
    with pytest.raises(KeyboardInterrupt) as stopped:
        search_main(_search(tiny_index, output))
    assert isinstance(stopped.value, SystemExit) and stopped.value.code == 130  # a quiet exit, status 130
    line = _ends_with_its_own_error_line(capsys.readouterr().err)
    directory = partial_directory(output)
    assert line == (f"error: interrupted: the queries searched so far are kept in {directory}; the same command "
                    "resumes there")
    monkeypatch.undo()
    assert search_main(_search(tiny_index, output)) == 0
    assert f"Resuming the interrupted search in {directory}: 3 of 4 queries already searched" in \
        capsys.readouterr().out
    assert output.is_file() and not directory.exists()


def test_ctrl_c_outside_a_search_is_one_line_too(capsys, monkeypatch):
    from pyserini_mores.search import __main__ as search_module

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(search_module, "first_stage_options", interrupted)
    with pytest.raises(KeyboardInterrupt) as stopped:
        search_main([])
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "error: interrupted\n"


def test_a_full_disk_under_output_is_one_line_and_keeps_the_partial_search(tiny_index, tmp_path, capsys,
                                                                            monkeypatch):
    output = tmp_path / "run.trec"
    real_open = open

    class FullDiskStream:
        """The run file on a disk with no room left: every write fails as write(2) does."""

        def __init__(self, stream):
            self.stream = stream

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.stream.name)

        def __getattr__(self, name):
            return getattr(self.stream, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.stream.__exit__(*exc)

    def opened(file, mode="r", *args, **kwargs):
        stream = real_open(file, mode, *args, **kwargs)
        return FullDiskStream(stream) if Path(file).name == f"{output.name}.tmp" else stream

    monkeypatch.setattr(io_module, "open", opened, raising=False)
    assert search_main(_search(tiny_index, output)) == 2
    line = _ends_with_its_own_error_line(capsys.readouterr().err)
    assert line == (f"error: the disk is full writing {output}.tmp (No space left on device): free some space and "
                    "run the same command again")
    assert not output.exists() and partial_directory(output).is_dir()
    monkeypatch.undo()
    assert search_main(_search(tiny_index, output)) == 0
    assert f"Resuming the interrupted search in {partial_directory(output)}: 4 of 4" in capsys.readouterr().out


def test_an_over_long_query_is_one_line_naming_it(tiny_index, tmp_path, capsys):
    words = " ".join(f"w{number}" for number in range(20_000))[:100_000]
    topics = tmp_path / "topics.tsv"
    topics.write_text(f"q1\ttext editor\nq2\t{words}\nq3\tlinux\n")
    output = tmp_path / "run.trec"
    assert search_main(["--index", str(tiny_index), "--topics", str(topics), "--output", str(output)]) == 2
    line = _ends_with_its_own_error_line(capsys.readouterr().err)
    assert line == ("error: query q2 (100,000 characters) cannot be searched: it has more distinct terms than "
                    "Lucene's clause limit (1024); shorten it")
    assert partial_directory(output).is_dir() and not output.exists()
    with pytest.raises(QueryRefusedError, match="query q cannot|query q \\(100,000 characters\\)"):
        RerankingSearcher(tiny_index, "bm25").search(words, k=3)


def test_info_lines_only_with_verbose(tiny_index, tmp_path, caplog):
    argv = ["--index", str(tiny_index), "--topics", str(TOPICS), "--hits", "3", "--output", str(tmp_path / "run")]
    assert search_main(argv) == 0
    assert not [record for record in caplog.records if record.levelname == "INFO"]
    assert search_main([*argv, "-v"]) == 0
    assert [record.name for record in caplog.records if record.levelname == "INFO"] == ["pyserini_mores.formats"]
