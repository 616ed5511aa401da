"""integrations/debian_packages/pipeline.py: the dry run prints every step and checks every command's arguments."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "integrations" / "debian_packages" / "pipeline.py"


@pytest.fixture(scope="module")
def pipeline():
    spec = importlib.util.spec_from_file_location("debian_pipeline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["debian_pipeline"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def data_dir(tmp_path):
    data = tmp_path / "debian-packages"
    data.mkdir()
    (data / "collection.tsv").write_text("1\tsome text\n")
    for split in ("train", "dev", "test"):
        (data / f"queries.{split}.tsv").write_text("q1\tsome query\n")
        (data / f"qrels.{split}.txt").write_text("q1 0 1 1\n")
    return data


def test_dry_run_prints_every_step_in_order_and_their_arguments_parse(pipeline, data_dir, tmp_path, capsys):
    assert pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "work"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    steps = [line.split("]")[0].lstrip("[") for line in out.splitlines() if line.startswith("[")]
    expected, teachers = ["index", "bm25-test", "negatives"], set()
    for model in pipeline.MODELS:  # a starting point's sidecar is built before, every other sidecar after training
        expected += (["compressor"] if model.needs_compressor else []) + (
            [f"sidecar-{model.name}"] if model.sidecar_first else [])
        if model.teacher and model.teacher not in teachers:  # the teacher's run and scored triples, once
            teachers.add(model.teacher)
            expected += [f"sidecar-{model.teacher}", f"rerank-{model.teacher}-train", f"negatives-{model.teacher}"]
        expected += [f"train-{model.name}"]
    for model in pipeline.MODELS:
        expected += ([f"sidecar-{model.name}"] if model.stores and not model.sidecar_first
                     and model.name not in teachers else []) + [f"rerank-{model.name}-test", f"speed-{model.name}"]
    assert steps == expected + ["eval-test"]
    assert teachers == {"maxsim"}
    # MORES learns from triples scored by the MaxSim teacher's run over the training queries
    work = tmp_path / "work"
    assert (f"--rerank-depth 50 --hits 50 --precision bf16 --output {work / 'runs' / 'maxsim.train.trec'}") in out
    assert f"--run {work / 'runs' / 'maxsim.train.trec'} --index" in out and "--teacher-scores" in out
    assert f"--recipe mores-debian --triples {work / 'triples.train.maxsim.tsv'}" in out
    assert f"--recipe cross-encoder-debian --triples {work / 'triples.train.maxsim.tsv'}" in out
    assert f"--recipe tk-debian --triples {work / 'triples.train.maxsim.tsv'}" in out  # its recipe's loss: distill
    assert "--recipe mores-debian" in out and "--model-arg n_interaction_blocks=1" in out
    # MORES starts from the trained MaxSim encoder and trains against its S1 sidecar, built first with the recipe's
    # model arguments (JSON values: tied=false, which the command line reads as the boolean)
    maxsim = work / "models" / "maxsim"
    assert ("[sidecar-mores-2ib] $ " + f"{sys.executable} -m pyserini_mores.sidecar build --index "
            f"{work / 'index'} --reranker mores --model {maxsim} --model-arg n_interaction_blocks=2") in out
    assert "--model-arg reuse=s1 --model-arg pooling=avg --model-arg tied=false --precision bf16" in out
    assert f"--output {work / 'models' / 'mores-2ib'}" in out and f"--resume --init {maxsim}" in out
    # PreTTR starts from the trained MaxSim encoder, and so does its compressor's pre-training; both train against
    # the sidecar of their start's layer-4 states, on MaxSim's scored triples
    assert ("[sidecar-prettr-l4] $ " + f"{sys.executable} -m pyserini_mores.sidecar build --index "
            f"{work / 'index'} --reranker prettr --model {maxsim} --model-arg join_layer=4") in out
    assert (f"--recipe prettr-debian --triples {work / 'triples.train.maxsim.tsv'} "
            f"--output {work / 'models' / 'prettr-l4'}") in out
    assert (f"--recipe prettr-compressor-debian --texts {data_dir / 'collection.tsv'} "
            f"--output {work / 'models' / 'prettr-compressor'} --init {maxsim}") in out
    assert ("[sidecar-prettr-l4-e128] $ " + f"{sys.executable} -m pyserini_mores.sidecar build --index "
            f"{work / 'index'} --reranker prettr --model {work / 'models' / 'prettr-compressor'}") in out
    assert not (tmp_path / "work" / "pipeline.json").exists(), "a dry run must not record anything as done"


def test_a_model_that_starts_from_another_brings_it_along(pipeline, data_dir, tmp_path, capsys):
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--models", "prettr-l4", "--dry-run"])
    out = capsys.readouterr().out
    assert "also training maxsim: prettr-l4 start from it or learn from it" in out
    assert "[train-cross-encoder]" not in out
    assert (out.index("[train-maxsim]") < out.index("[sidecar-prettr-l4]") < out.index("[train-prettr-l4]")
            < out.index("[rerank-prettr-l4-test]"))


def test_a_model_that_learns_from_a_teacher_brings_it_along(pipeline, data_dir, tmp_path, capsys):
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--models", "mores-1ib", "--dry-run"])
    out = capsys.readouterr().out
    assert "also training maxsim: mores-1ib start from it or learn from it" in out
    assert (out.index("[train-maxsim]") < out.index("[sidecar-maxsim]") < out.index("[rerank-maxsim-train]")
            < out.index("[negatives-maxsim]") < out.index("[train-mores-1ib]"))


def test_dry_run_of_one_model_skips_what_it_does_not_need(pipeline, data_dir, tmp_path, capsys):
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--models", "tk", "--splits", "dev",
                   "test", "--dry-run"])
    out = capsys.readouterr().out
    assert "[compressor]" not in out and "[train-cross-encoder]" not in out
    assert "[rerank-tk-dev]" in out and "[rerank-tk-test]" in out and "--baseline" not in out


def _train_commands(out: str) -> dict[str, str]:
    return {line.split("]")[0].removeprefix("[train-"): line for line in out.splitlines()
            if line.startswith("[train-")}


def test_each_row_trains_its_own_schedule_unless_the_pipeline_overrides_every_one(pipeline, data_dir, tmp_path,
                                                                                  capsys):
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--dry-run"])
    commands = _train_commands(capsys.readouterr().out)
    assert set(commands) == {model.name for model in pipeline.MODELS}
    for model in pipeline.MODELS:  # the row's schedule once, or none (the recipe's)
        expected = [str(model.max_steps)] if model.max_steps else []
        assert re.findall(r"--max-steps (\d+)", commands[model.name]) == expected, model.name
    assert re.findall(r"--max-steps (\d+)", commands["mores-2ib"]) == ["1000"]
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--dry-run", "--max-steps", "7"])
    for name, command in _train_commands(capsys.readouterr().out).items():
        assert command.count("--max-steps") == 1 and "--max-steps 7 --resume" in command, name


def test_bad_arguments_and_unknown_recipes_are_caught_without_running(pipeline):
    command = [sys.executable, "-m", "pyserini_mores.train", "train", "--recipe", "mores-debian", "--output", "x",
               "--no-such-flag"]
    with pytest.raises(SystemExit, match=r"\[train-x\] the command's arguments are rejected: .*--no-such-flag"):
        pipeline.check_arguments("train-x", command)
    command = [sys.executable, "-m", "pyserini_mores.train", "train", "--recipe", "no-such-recipe", "--output", "x"]
    with pytest.raises(SystemExit, match=r"\[train-x\] .*no-such-recipe"):
        pipeline.check_arguments("train-x", command)


def test_a_finished_step_whose_command_changed_is_not_skipped_silently(pipeline, data_dir, tmp_path, capsys):
    work = tmp_path / "w"
    pipeline.main(["--data", str(data_dir), "--work", str(work), "--models", "tk", "--dry-run"])
    command = next(line.split("$ ", 1)[1] for line in capsys.readouterr().out.splitlines()
                   if line.startswith("[train-tk] $ "))
    work.mkdir(exist_ok=True)
    journal = {"index": {"seconds": 1.0, "command": None},
               "train-tk": {"seconds": 60.0, "command": command.replace("--recipe tk-debian", "--recipe tk-old")}}
    (work / "pipeline.json").write_text(json.dumps(journal))
    (work / "index").mkdir(exist_ok=True)
    with pytest.raises(SystemExit, match=r"(?s)\[train-tk\] finished earlier with another command:\n  then: .*"
                                         r"--recipe tk-old.*\n  now:  .*--recipe tk-debian.*delete \"train-tk\" from"):
        pipeline.main(["--data", str(data_dir), "--work", str(work), "--models", "tk", "--dry-run"])
    journal["train-tk"]["command"] = command  # the same command: skipped as done
    (work / "pipeline.json").write_text(json.dumps(journal))
    pipeline.main(["--data", str(data_dir), "--work", str(work), "--models", "tk", "--dry-run"])
    assert "[train-tk] done (60 s), skipped" in capsys.readouterr().out


def test_missing_data_file_is_named(pipeline, data_dir, tmp_path):
    (data_dir / "qrels.test.txt").unlink()
    with pytest.raises(SystemExit, match=r"qrels\.test\.txt not found; --data must be the debian-packages folder"):
        pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--dry-run"])
