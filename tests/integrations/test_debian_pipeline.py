"""integrations/debian_packages/pipeline.py: the dry run prints every step (the teacher before its students, the
short schedule or with --full the recipes') and checks every command's arguments; the journal refuses a changed
command."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random
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


def _steps(out: str) -> list[str]:
    """The steps whose commands a dry run printed, in order."""
    return [line.split("]")[0].lstrip("[") for line in out.splitlines() if line.startswith("[") and "] $ " in line]


def test_dry_run_prints_every_step_in_order_and_their_arguments_parse(pipeline, data_dir, tmp_path, capsys):
    assert pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "work"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    expected, scorings, mined = ["index", "bm25-test"], set(), set()
    rows = [model for model in pipeline.MODELS if not model.full_only]  # the default schedule's
    for model in rows:  # a starting point's sidecar is built before, every other sidecar after training
        expected += ([f"compressor-{model.name}"] if model.compressor_texts == "collection" else []) + (
            [f"sidecar-{model.name}"] if model.sidecar_first else [])
        if model.teacher and (model.teacher, model.teacher_scoring) not in scorings:  # its run and triples, once
            scorings.add((model.teacher, model.teacher_scoring))
            scoring = model.teacher_scoring
            candidates, second, with_bm25 = scoring.candidates, scoring.ensemble_with, scoring.bm25_alpha is not None
            pair = model.teacher + (f"+{second}" if second else "")
            name = pair + ("+bm25" if with_bm25 else "")
            for teacher in (model.teacher, second) if second else (model.teacher,):  # each step once
                built = f"sidecar-{teacher}" in expected or not pipeline.MODELS_BY_NAME[teacher].stores
                expected += ([] if built else [f"sidecar-{teacher}"]) + (
                    [] if f"rerank-{teacher}-{candidates}" in expected else [f"rerank-{teacher}-{candidates}"])
            fusions = ([f"ensemble-{pair}-{candidates}"] if second else []) + (
                [f"ensemble-{name}-{candidates}"] if with_bm25 else [])  # BM25's training run is made first
            expected += [step for step in fusions if step not in expected]
            expected += [f"negatives-{name}-{candidates}"]
        elif not model.teacher and model.bm25_negatives not in mined:  # BM25's training run once, each mining once
            expected += [] if mined else ["bm25-train"]
            mined.add(model.bm25_negatives)
            expected += ["negatives-bm25-{}x{}".format(*model.bm25_negatives)]
        expected += [f"train-{model.name}"]
    teachers = {teacher for teacher, _ in scorings}
    for model in rows:  # a row reading another's sidecar has none of its own
        expected += ([f"sidecar-{model.name}"] if model.stores and not model.sidecar_first and not model.sidecar_of
                     and model.name not in teachers else []) + [f"rerank-{model.name}-test", f"speed-{model.name}"]
    assert _steps(out) == expected + ["eval-test"]
    assert teachers == {"maxsim", "cross-encoder"} and mined == {(4, 30), (1, 50)}
    work, python = tmp_path / "work", sys.executable
    # The teacher first: the shipped cross-encoder's recipe on 4 negatives per training query from its BM25 top 30
    # (docs/results.md's commands), then MORES 2xIB started from it, against the S1 sidecar of its 4-layer document
    # module built first with the recipe's model arguments (JSON values: tied=false, which the command line reads as
    # the boolean), on the same triples
    bm25_train, teacher = work / "runs" / "bm25.train.trec", work / "models" / "cross-encoder"
    assert (f"[bm25-train] $ {python} -m pyserini_mores.search --index {work / 'index'} --topics "
            f"{data_dir / 'queries.train.tsv'} --hits 100 --threads 2 --output {bm25_train}") in out
    assert (f"[negatives-bm25-4x30] $ {python} -m pyserini_mores.train mine-negatives --run {bm25_train} --index "
            f"{work / 'index'} --topics {data_dir / 'queries.train.tsv'} --qrels {data_dir / 'qrels.train.txt'} "
            f"--negatives-per-query 4 --depth 30 --output {work / 'triples.train.bm25-4x30.tsv'}") in out
    assert (f"[train-cross-encoder] $ {python} -m pyserini_mores.train train --recipe cross-encoder-debian-teacher "
            f"--triples {work / 'triples.train.bm25-4x30.tsv'} --output {teacher}") in out
    assert (f"[sidecar-mores-2ib] $ {python} -m pyserini_mores.sidecar build --index {work / 'index'} --reranker "
            f"mores --model {teacher} --model-arg n_interaction_blocks=2 --model-arg document_layers=4 --model-arg "
            "reuse=s1 --model-arg tied=false --model-arg query_max_length=16 --model-arg doc_max_length=128 "
            "--precision auto\n") in out
    assert (f"[train-mores-2ib] $ {python} -m pyserini_mores.train train --recipe mores-2ib-debian-from-ce "
            f"--triples {work / 'triples.train.bm25-4x30.tsv'} --output {work / 'models' / 'mores-2ib'}") in out
    assert f"--max-steps 2000 --resume --init {teacher}\n" in out
    assert (out.index("[train-cross-encoder] $") < out.index("[sidecar-mores-2ib] $") < out.index("[train-mores-2ib] $")
            < out.index("[train-maxsim] $"))
    # Then MORES 2xIB distilled from the trained cross-encoder by Margin-MSE (the shipped debian-mores-2ib's second
    # stage): the teacher reranks and scores every candidate of the BM25 top 16 of 2,000 training queries drawn at
    # random (seed 29), 8 scored negatives per query are mined from all 16, and the distillation continues from the
    # trained MORES 2xIB against the same S1 sidecar (its recipe's --doc-sidecar default finds it): no sidecar step
    subset, ce_run = work / "queries.train2000.tsv", work / "runs" / "cross-encoder.train2000-top16.trec"
    scored = work / "triples.train.cross-encoder-train2000-top16.tsv"
    distilled = work / "models" / "mores-2ib-distilled"
    assert f"[queries-train2000] 2,000 training queries drawn at random (seed 29): {subset}\n" in out
    assert (f"[rerank-cross-encoder-train2000-top16] $ {python} -m pyserini_mores.search --index {work / 'index'} "
            f"--topics {subset} --reranker cross-encoder --model {teacher} --rerank-depth 16 --hits 16 "
            f"--precision auto --output {ce_run}\n") in out
    assert (f"[negatives-cross-encoder-train2000-top16] $ {python} -m pyserini_mores.train mine-negatives "
            f"--run {ce_run} --index {work / 'index'} --topics {subset} --qrels {data_dir / 'qrels.train.txt'} "
            f"--negatives-per-query 8 --depth 16 --teacher-scores --output {scored}\n") in out
    assert (f"[train-mores-2ib-distilled] $ {python} -m pyserini_mores.train train --recipe mores-2ib-debian-distilled "
            f"--triples {scored} --output {distilled} --dev-topics {data_dir / 'queries.dev.tsv'} --dev-qrels "
            f"{data_dir / 'qrels.dev.txt'} --dev-index {work / 'index'} --max-steps 500 --resume "
            f"--init {work / 'models' / 'mores-2ib'}\n") in out
    assert (out.index("[train-cross-encoder] $") < out.index("[train-mores-2ib] $")
            < out.index("[queries-train2000]") < out.index("[rerank-cross-encoder-train2000-top16] $")
            < out.index("[negatives-cross-encoder-train2000-top16] $") < out.index("[train-mores-2ib-distilled] $")
            < out.index("[train-maxsim] $"))
    assert "[sidecar-mores-2ib-distilled]" not in out
    assert (f"[rerank-mores-2ib-distilled-test] $ {python} -m pyserini_mores.search --index {work / 'index'} "
            f"--topics {data_dir / 'queries.test.tsv'} --reranker mores --model {distilled} --model-arg reuse=s1 "
            "--rerank-depth 100") in out
    assert f"{work / 'runs' / 'mores-2ib.test.trec'} {work / 'runs' / 'mores-2ib-distilled.test.trec'} " in out  # eval
    # Then, after MaxSim, the third stage: the cross-encoder and MaxSim each rerank the BM25 top 16 of 6,000 training
    # queries of the same shuffle, ensemble_teacher.py fuses the two runs (0.15 x the cross-encoder), negatives are
    # mined from the fused run, and the distilled row continues on them against the same sidecar
    subset6k, ensemble_run = work / "queries.train6000.tsv", work / "runs" / "cross-encoder+maxsim.train6000-top16.trec"
    ce_run6k = work / "runs" / "cross-encoder.train6000-top16.trec"
    maxsim_run6k = work / "runs" / "maxsim.train6000-top16.trec"
    assert f"[queries-train6000] 6,000 training queries drawn at random (seed 29): {subset6k}\n" in out
    assert (f"[rerank-maxsim-train6000-top16] $ {python} -m pyserini_mores.search --index {work / 'index'} --topics "
            f"{subset6k} --reranker maxsim --model {work / 'models' / 'maxsim'} --rerank-depth 16 --hits 16 "
            f"--precision auto --output {maxsim_run6k}\n") in out
    assert (f"[ensemble-cross-encoder+maxsim-train6000-top16] $ {python} {pipeline.ENSEMBLE_SCRIPT} --first {ce_run6k} "
            f"--second {maxsim_run6k} --alpha 0.15 --output {ensemble_run}\n") in out
    ensemble_scored = work / "triples.train.cross-encoder+maxsim-train6000-top16.tsv"
    assert (f"[negatives-cross-encoder+maxsim-train6000-top16] $ {python} -m pyserini_mores.train mine-negatives --run "
            f"{ensemble_run} --index {work / 'index'} --topics {subset6k} --qrels {data_dir / 'qrels.train.txt'} "
            f"--negatives-per-query 8 --depth 16 --teacher-scores --output {ensemble_scored}\n") in out
    assert (f"[train-mores-2ib-ensemble] $ {python} -m pyserini_mores.train train --recipe mores-2ib-debian-ensemble "
            f"--triples {ensemble_scored} --output {work / 'models' / 'mores-2ib-ensemble'}") in out
    assert f"--max-steps 500 --resume --init {distilled}\n" in out
    assert (out.index("[train-maxsim] $") < out.index("[rerank-cross-encoder-train6000-top16] $")
            < out.index("[rerank-maxsim-train6000-top16] $")
            < out.index("[ensemble-cross-encoder+maxsim-train6000-top16] $")
            < out.index("[train-mores-2ib-ensemble] $"))
    assert "[sidecar-mores-2ib-ensemble]" not in out
    # The three-way teacher: the same ensemble run fused once more with BM25's training run (0.85 x the ensemble),
    # mined again; MORES's fourth stage continues the third on it, the cross-encoder's second continues the first
    three_way_run = work / "runs" / "cross-encoder+maxsim+bm25.train6000-top16.trec"
    assert (f"[ensemble-cross-encoder+maxsim+bm25-train6000-top16] $ {python} {pipeline.ENSEMBLE_SCRIPT} --first "
            f"{ensemble_run} --second {work / 'runs' / 'bm25.train.trec'} --alpha 0.85 --output {three_way_run}\n"
            ) in out
    three_way_scored = work / "triples.train.cross-encoder+maxsim+bm25-train6000-top16.tsv"
    assert (f"[negatives-cross-encoder+maxsim+bm25-train6000-top16] $ {python} -m pyserini_mores.train mine-negatives "
            f"--run {three_way_run} --index {work / 'index'} --topics {subset6k} --qrels "
            f"{data_dir / 'qrels.train.txt'} --negatives-per-query 8 --depth 16 --teacher-scores --output "
            f"{three_way_scored}\n") in out
    assert (f"[train-mores-2ib-three-way] $ {python} -m pyserini_mores.train train --recipe "
            f"mores-2ib-debian-three-way --triples {three_way_scored} --output "
            f"{work / 'models' / 'mores-2ib-three-way'}") in out
    assert f"--max-steps 250 --resume --init {work / 'models' / 'mores-2ib-ensemble'}\n" in out
    assert (f"[train-cross-encoder-three-way] $ {python} -m pyserini_mores.train train --recipe "
            f"cross-encoder-debian-three-way --triples {three_way_scored} --output "
            f"{work / 'models' / 'cross-encoder-three-way'}") in out
    assert f"--max-steps 250 --resume --init {work / 'models' / 'cross-encoder'}\n" in out
    assert out.count("[ensemble-cross-encoder+maxsim-train6000-top16] $") == 1  # the two-way run is made once
    assert (out.index("[train-mores-2ib-ensemble] $")
            < out.index("[ensemble-cross-encoder+maxsim+bm25-train6000-top16] $")
            < out.index("[train-mores-2ib-three-way] $") < out.index("[train-cross-encoder-three-way] $"))
    assert "[sidecar-mores-2ib-three-way]" not in out and "[sidecar-cross-encoder-three-way]" not in out
    # MORES's fifth stage continues the fourth from text on the same triples, then builds a sidecar of its own (its
    # document module's upper layers trained) and reranks from it
    from_text = work / "models" / "mores-2ib-from-text"
    assert (f"[train-mores-2ib-from-text] $ {python} -m pyserini_mores.train train --recipe "
            f"mores-2ib-debian-from-text --triples {three_way_scored} --output {from_text}") in out
    assert f"--max-steps 250 --resume --init {work / 'models' / 'mores-2ib-three-way'}\n" in out
    assert (f"[sidecar-mores-2ib-from-text] $ {python} -m pyserini_mores.sidecar build --index {work / 'index'} "
            f"--reranker mores --model {from_text} --model-arg reuse=s1 --precision auto\n") in out
    assert (out.index("[train-mores-2ib-three-way] $") < out.index("[train-mores-2ib-from-text] $")
            < out.index("[sidecar-mores-2ib-from-text] $") < out.index("[rerank-mores-2ib-from-text-test] $"))
    # The MaxSim family: MaxSim on one negative per query from BM25's top 50; the others learn from triples scored
    # by its run over the training queries
    assert f"--recipe maxsim-debian --triples {work / 'triples.train.bm25-1x50.tsv'}" in out
    assert "--negatives-per-query 1 --depth 50" in out
    assert (f"--rerank-depth 50 --hits 50 --precision auto --output {work / 'runs' / 'maxsim.train-top50.trec'}") in out
    assert f"--run {work / 'runs' / 'maxsim.train-top50.trec'} --index" in out and "--teacher-scores" in out
    assert f"--recipe mores-debian --triples {work / 'triples.train.maxsim-train-top50.tsv'}" in out
    # its recipe's loss: distill
    assert f"--recipe tk-debian --triples {work / 'triples.train.maxsim-train-top50.tsv'}" in out
    assert "--recipe mores-debian" in out and "--model-arg n_interaction_blocks=1" in out
    # MORES 1xIB starts from the trained MaxSim encoder and trains against its S1 sidecar
    maxsim = work / "models" / "maxsim"
    assert ("[sidecar-mores-1ib] $ " + f"{python} -m pyserini_mores.sidecar build --index "
            f"{work / 'index'} --reranker mores --model {maxsim} --model-arg n_interaction_blocks=2") in out
    assert ("--model-arg reuse=s1 --model-arg pooling=avg --model-arg tied=false "
            "--model-arg n_interaction_blocks=1") in out
    assert f"--output {work / 'models' / 'mores-1ib'}" in out and f"--resume --init {maxsim}" in out
    # PreTTR starts from the trained MaxSim encoder, and so does its compressor's pre-training; both train against
    # the sidecar of their start's layer-4 states, on MaxSim's scored triples
    assert ("[sidecar-prettr-l4] $ " + f"{python} -m pyserini_mores.sidecar build --index "
            f"{work / 'index'} --reranker prettr --model {maxsim} --model-arg join_layer=4") in out
    assert (f"--recipe prettr-debian --triples {work / 'triples.train.maxsim-train-top50.tsv'} "
            f"--output {work / 'models' / 'prettr-l4'}") in out
    assert (f"--recipe prettr-compressor-debian --texts {data_dir / 'collection.tsv'} "
            f"--output {work / 'models' / 'prettr-l4-e128-compressor'} --resume --init {maxsim}") in out
    assert ("[sidecar-prettr-l4-e128] $ " + f"{python} -m pyserini_mores.sidecar build --index "
            f"{work / 'index'} --reranker prettr --model {work / 'models' / 'prettr-l4-e128-compressor'}") in out
    assert "--precision bf16" not in out  # auto: bf16 only where the CPU runs it natively
    assert not (tmp_path / "work").exists(), "a dry run must not write anything"


def test_a_model_that_starts_from_another_brings_it_along(pipeline, data_dir, tmp_path, capsys):
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--models", "prettr-l4", "--dry-run"])
    out = capsys.readouterr().out
    assert "also training maxsim: prettr-l4 start from it or learn from it" in out
    assert "[train-cross-encoder]" not in out
    assert (out.index("[train-maxsim]") < out.index("[sidecar-prettr-l4]") < out.index("[train-prettr-l4]")
            < out.index("[rerank-prettr-l4-test]"))
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--models", "mores-2ib", "--dry-run"])
    out = capsys.readouterr().out
    assert "also training cross-encoder: mores-2ib start from it or learn from it" in out
    assert _steps(out) == ["index", "bm25-test", "bm25-train", "negatives-bm25-4x30", "train-cross-encoder",
                           "sidecar-mores-2ib", "train-mores-2ib", "rerank-cross-encoder-test", "speed-cross-encoder",
                           "rerank-mores-2ib-test", "speed-mores-2ib", "eval-test"]
    # the distilled row needs MORES 2xIB (its start and its sidecar), and that row the cross-encoder (its teacher too)
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--models", "mores-2ib-distilled",
                   "--dry-run"])
    out = capsys.readouterr().out
    assert ("also training cross-encoder, mores-2ib: mores-2ib, mores-2ib-distilled start from it or learn from it"
            in out)
    assert _steps(out) == ["index", "bm25-test", "bm25-train", "negatives-bm25-4x30", "train-cross-encoder",
                           "sidecar-mores-2ib", "train-mores-2ib", "rerank-cross-encoder-train2000-top16",
                           "negatives-cross-encoder-train2000-top16", "train-mores-2ib-distilled",
                           "rerank-cross-encoder-test", "speed-cross-encoder", "rerank-mores-2ib-test",
                           "speed-mores-2ib", "rerank-mores-2ib-distilled-test", "speed-mores-2ib-distilled",
                           "eval-test"]


def test_a_model_that_learns_from_a_teacher_brings_it_along(pipeline, data_dir, tmp_path, capsys):
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--models", "mores-1ib", "--dry-run"])
    out = capsys.readouterr().out
    assert "also training maxsim: mores-1ib start from it or learn from it" in out
    assert (out.index("[train-maxsim]") < out.index("[sidecar-maxsim]") < out.index("[rerank-maxsim-train-top50]")
            < out.index("[negatives-maxsim-train-top50]") < out.index("[train-mores-1ib]"))


def test_a_model_that_learns_from_an_ensemble_teacher_brings_both_teachers_along(pipeline, data_dir, tmp_path,
                                                                                  capsys):
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--models", "mores-2ib-ensemble",
                   "--dry-run"])
    out = capsys.readouterr().out
    assert ("also training cross-encoder, maxsim, mores-2ib, mores-2ib-distilled: mores-2ib, mores-2ib-distilled, "
            "mores-2ib-ensemble start from it or learn from it") in out
    assert "[train-mores-1ib]" not in out and "[train-tk]" not in out
    assert (out.index("[train-maxsim]") < out.index("[sidecar-maxsim]") < out.index("[rerank-maxsim-train6000-top16]")
            < out.index("[ensemble-cross-encoder+maxsim-train6000-top16]") < out.index("[train-mores-2ib-ensemble]"))


def test_dry_run_of_one_model_skips_what_it_does_not_need(pipeline, data_dir, tmp_path, capsys):
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--models", "tk", "--splits", "dev",
                   "test", "--dry-run"])
    out = capsys.readouterr().out
    assert "[compressor-prettr-l4-e128]" not in out and "[train-cross-encoder]" not in out
    assert "[rerank-tk-dev]" in out and "[rerank-tk-test]" in out and "--baseline" not in out


def _train_commands(out: str) -> dict[str, str]:
    return {line.split("]")[0].removeprefix("[train-"): line for line in out.splitlines()
            if line.startswith("[train-") and "] $ " in line}


def _schedules(out: str) -> dict[str, int]:
    """The training steps each row's printed schedule announces (those it trains of a longer one, if it stops)."""
    return {match.group(1): int(match.group(2).replace(",", "")) for match in
            re.finditer(r"^\[train-(\S+)\] (?:up to )?([\d,]+) (?:training )?steps", out, re.M)}


def _recipe_steps(model) -> int:
    """The steps ``model``'s recipe trains: its schedule's, or fewer where it stops (stop_at_step)."""
    from pyserini_mores.train.recipes import read_recipe

    settings = read_recipe(model.recipe)["settings"]
    return min(settings["max_steps"], settings.get("stop_at_step", settings["max_steps"]))


def test_the_short_schedule_by_default_and_the_recipes_own_with_full(pipeline, data_dir, tmp_path, capsys):
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--dry-run"])
    out = capsys.readouterr().out
    commands = _train_commands(out)
    assert set(commands) == {model.name for model in pipeline.MODELS if not model.full_only}
    for model in (model for model in pipeline.MODELS if not model.full_only):  # the short schedule, or the recipe's
        expected = [str(model.short_steps)] if model.short_steps else []
        assert re.findall(r"--max-steps (\d+)", commands[model.name]) == expected, model.name
        assert _schedules(out)[model.name] == (model.short_steps or _recipe_steps(model)), model.name
        assert model.short_steps is None or model.short_steps < _recipe_steps(model), model.name
    # the teacher and its student: short schedules, with the time they are expected to take on 2 AVX2 cores
    assert re.findall(r"--max-steps (\d+)", commands["cross-encoder"] + commands["mores-2ib"]) == ["500", "2000"]
    assert ("[train-cross-encoder] up to 500 training steps (short schedule; --full: the recipe's "
            f"{_recipe_steps(pipeline.MODELS[0]):,}), ~2 s/step on 2 AVX2 cores in fp32: ~17 min plus dev "
            "evaluations") in out
    assert "[train-mores-2ib] up to 2,000 training steps (short schedule; --full: the recipe's 4,500), ~0.5 s/step" \
        in out
    distilled = next(model for model in pipeline.MODELS if model.name == "mores-2ib-distilled")
    assert _recipe_steps(distilled) == 1500  # the shipped model's recipe
    assert re.findall(r"--max-steps (\d+)", commands["mores-2ib-distilled"]) == ["500"]
    assert ("[train-mores-2ib-distilled] up to 500 training steps (short schedule; --full: the recipe's "
            f"{_recipe_steps(distilled):,})\n") in out

    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--dry-run", "--full"])
    out = capsys.readouterr().out
    commands = _train_commands(out)
    assert _steps(out)[:6] == ["index", "bm25-test", "bm25-train", "negatives-bm25-4x30", "train-cross-encoder",
                               "sidecar-mores-2ib"]  # the teacher before its students
    for model in (model for model in pipeline.MODELS if model.recipe):  # exactly the recipe's schedule
        assert "--max-steps" not in commands[model.name], model.name
        assert _schedules(out)[model.name] == _recipe_steps(model), model.name
    assert _schedules(out)["cross-encoder"] == 6000 and _schedules(out)["mores-2ib"] == 4500  # the shipped models'
    assert _schedules(out)["mores-2ib-distilled"] == _recipe_steps(distilled)
    assert "--max-steps" not in commands["mores-2ib-distilled"]
    assert "--recipe mores-2ib-debian-distilled" in commands["mores-2ib-distilled"]
    assert (_steps(out).index("train-mores-2ib") < _steps(out).index("rerank-cross-encoder-train2000-top16")
            < _steps(out).index("train-mores-2ib-distilled") < _steps(out).index("train-maxsim"))

    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--dry-run", "--max-steps", "7"])
    for name, command in _train_commands(capsys.readouterr().out).items():
        assert command.count("--max-steps") == 1 and "--max-steps 7 --resume" in command, name
    with pytest.raises(SystemExit):
        pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "w"), "--dry-run", "--full",
                       "--max-steps", "7"])
    assert "not allowed with argument --full" in capsys.readouterr().err


def test_the_shipped_mores_last_two_stages_run_only_with_full(pipeline, data_dir, tmp_path, capsys):
    """debian-mores-2ib's sixth and seventh stages: the seventh's teacher (the second-stage cross-encoder) reranks
    every training query, more than the default schedule's three hours allow."""
    work, python = tmp_path / "w", sys.executable
    pipeline.main(["--data", str(data_dir), "--work", str(work), "--dry-run"])
    assert not {"mores-2ib-from-text-more", "mores-2ib-all-queries"} & set(_train_commands(capsys.readouterr().out))

    pipeline.main(["--data", str(data_dir), "--work", str(work), "--dry-run", "--full"])
    out = capsys.readouterr().out
    commands, models = _train_commands(out), work / "models"
    three_way = work / "triples.train.cross-encoder+maxsim+bm25-train6000-top16.tsv"
    assert (f"[train-mores-2ib-from-text-more] $ {python} -m pyserini_mores.train train --recipe "
            f"mores-2ib-debian-from-text-more --triples {three_way} --output {models / 'mores-2ib-from-text-more'}") \
        in out
    assert commands["mores-2ib-from-text-more"].endswith(f"--resume --init {models / 'mores-2ib-from-text'}")
    # the second-stage cross-encoder scores the BM25 top 16 of every training query, not a subset
    ce_run = work / "runs" / "cross-encoder-three-way.train-top16.trec"
    scored = work / "triples.train.cross-encoder-three-way-train-top16.tsv"
    assert (f"[rerank-cross-encoder-three-way-train-top16] $ {python} -m pyserini_mores.search "
            f"--index {work / 'index'} --topics {data_dir / 'queries.train.tsv'} --reranker cross-encoder --model "
            f"{models / 'cross-encoder-three-way'} --rerank-depth 16 --hits 16 --precision auto --output {ce_run}\n") \
        in out
    assert (f"[negatives-cross-encoder-three-way-train-top16] $ {python} -m pyserini_mores.train mine-negatives "
            f"--run {ce_run} --index {work / 'index'} --topics {data_dir / 'queries.train.tsv'} --qrels "
            f"{data_dir / 'qrels.train.txt'} --negatives-per-query 8 --depth 16 --teacher-scores --output {scored}\n") \
        in out
    assert (f"[train-mores-2ib-all-queries] $ {python} -m pyserini_mores.train train --recipe "
            f"mores-2ib-debian-all-queries --triples {scored} --output {models / 'mores-2ib-all-queries'}") in out
    assert commands["mores-2ib-all-queries"].endswith(f"--resume --init {models / 'mores-2ib-from-text-more'}")
    steps = _steps(out)
    assert (steps.index("train-mores-2ib-from-text") < steps.index("train-mores-2ib-from-text-more")
            < steps.index("train-mores-2ib-all-queries"))
    assert steps.index("train-cross-encoder-three-way") < steps.index("rerank-cross-encoder-three-way-train-top16") \
        < steps.index("train-mores-2ib-all-queries")
    assert "rerank-mores-2ib-all-queries-test" in steps and "sidecar-mores-2ib-all-queries" in steps

    # named, they run without --full too, with what they need
    pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "named"), "--dry-run", "--models",
                   "mores-2ib-all-queries"])
    assert {"cross-encoder-three-way", "mores-2ib-from-text-more", "mores-2ib-all-queries"} <= \
        set(_train_commands(capsys.readouterr().out))


def test_the_shipped_tk_stages_run_only_with_full_on_the_all_query_teacher(pipeline, data_dir, tmp_path, capsys):
    """debian-tk's stages learn from the same teacher run as debian-mores-2ib's last stage (the first two from the
    same triples, the third from all 15 negatives of each query), each from the one before it; the shipped model
    averages two models continued from the third."""
    work, python = tmp_path / "w", sys.executable
    stages = ["tk-all-queries", "tk-all-queries-embeddings", "tk-all-negatives"]
    pipeline.main(["--data", str(data_dir), "--work", str(work), "--dry-run"])
    assert not set(stages) & set(_train_commands(capsys.readouterr().out))

    pipeline.main(["--data", str(data_dir), "--work", str(work), "--dry-run", "--full"])
    out = capsys.readouterr().out
    commands, models, steps = _train_commands(out), work / "models", _steps(out)
    scored = work / "triples.train.cross-encoder-three-way-train-top16.tsv"
    assert (f"[train-tk-all-queries] $ {python} -m pyserini_mores.train train --recipe tk-debian-all-queries "
            f"--triples {scored} --output {models / 'tk-all-queries'}") in out
    assert "--init" not in commands["tk-all-queries"]
    for before, stage in zip(stages, stages[1:]):
        assert commands[stage].endswith(f"--resume --init {models / before}")
        assert steps.index(f"train-{before}") < steps.index(f"train-{stage}")
    assert steps.count("negatives-cross-encoder-three-way-train-top16") == 1
    assert steps.count("rerank-cross-encoder-three-way-train-top16") == 1  # one teacher run, mined twice
    ce_run, all_negatives = work / "runs" / "cross-encoder-three-way.train-top16.trec", \
        work / "triples.train.cross-encoder-three-way-train-top16-15-negatives.tsv"
    assert (f"[negatives-cross-encoder-three-way-train-top16-15-negatives] $ {python} -m pyserini_mores.train "
            f"mine-negatives --run {ce_run} --index {work / 'index'} --topics {data_dir / 'queries.train.tsv'} --qrels "
            f"{data_dir / 'qrels.train.txt'} --negatives-per-query 15 --depth 16 --teacher-scores --output "
            f"{all_negatives}\n") in out
    assert f"--recipe tk-debian-all-negatives --triples {all_negatives} " in commands["tk-all-negatives"]
    assert f"sidecar-{stages[-1]}" in steps and f"rerank-{stages[-1]}-test" in steps

    # Then two models continued from the third stage, one more pass over the same triples and one on each query's
    # whole BM25 top 30 (the teacher reranks the first 8,000 training queries at that depth, all 29 negatives
    # mined), and their equal-weight average: the shipped debian-tk, searched like the other rows.
    assert commands["tk-all-negatives-again"].endswith(f"--resume --init {models / 'tk-all-negatives'}")
    assert f"--recipe tk-debian-all-negatives-again --triples {all_negatives} " in commands["tk-all-negatives-again"]
    first = work / "queries.train-first8000.tsv"
    deep_run = work / "runs" / "cross-encoder-three-way.train-first8000-top30.trec"
    deep = work / "triples.train.cross-encoder-three-way-train-first8000-top30.tsv"
    assert f"[queries-train-first8000] 8,000 training queries from the top of the file: {first}\n" in out
    assert (f"[rerank-cross-encoder-three-way-train-first8000-top30] $ {python} -m pyserini_mores.search --index "
            f"{work / 'index'} --topics {first} --reranker cross-encoder --model {models / 'cross-encoder-three-way'} "
            f"--rerank-depth 30 --hits 30 ") in out
    assert (f"--run {deep_run} --index {work / 'index'} --topics {first} --qrels {data_dir / 'qrels.train.txt'} "
            f"--negatives-per-query 29 --depth 30 --teacher-scores --output {deep}\n") in out
    assert commands["tk-depth-30"].endswith(f"--resume --init {models / 'tk-all-negatives'}")
    assert f"--recipe tk-debian-depth-30 --triples {deep} " in commands["tk-depth-30"]
    assert "tk-soup" not in commands
    assert (f"[average-tk-soup] $ {python} -m pyserini_mores.train average --model-type tk --model "
            f"{models / 'tk-all-negatives-again'} --model {models / 'tk-depth-30'} --output {models / 'tk-soup'} "
            "--overwrite\n") in out
    assert steps.index("train-tk-all-negatives-again") < steps.index("average-tk-soup")
    assert steps.index("train-tk-depth-30") < steps.index("average-tk-soup") < steps.index("sidecar-tk-soup")
    assert "rerank-tk-soup-test" in steps


def test_full_after_the_short_schedule_refuses_to_mix_them(pipeline, data_dir, tmp_path, capsys):
    work = tmp_path / "w"
    pipeline.main(["--data", str(data_dir), "--work", str(work), "--models", "cross-encoder", "--dry-run"])
    short = _train_commands(capsys.readouterr().out)["cross-encoder"].split("$ ", 1)[1]
    work.mkdir()
    (work / "pipeline.json").write_text(json.dumps({"train-cross-encoder": {"seconds": 1000.0, "command": short}}))
    with pytest.raises(SystemExit, match=r"(?s)\[train-cross-encoder\] finished earlier with another command:\n"
                                         r"  then: .*--max-steps 500 --resume\n  now:  .*cross-encoder-debian-teacher"):
        pipeline.main(["--data", str(data_dir), "--work", str(work), "--models", "cross-encoder", "--dry-run",
                       "--full"])


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


def test_the_teachers_training_queries_are_a_seeded_random_subset_or_the_first_written_once(
        pipeline, data_dir, tmp_path):
    lines = [f"q{number}\tquery number {number}\n" for number in range(10)]
    lines[-1] = lines[-1].rstrip("\n")  # a last line without its newline still ends one in the subset
    (data_dir / "queries.train.tsv").write_text("".join(lines))
    scoring = pipeline.TeacherScoring(depth=16, negatives=8, negative_depth=16, queries=4, seed=29)
    work = tmp_path / "w"
    dry = pipeline.Pipeline(data_dir, work, [], ["test"], 100, 5, None, dry_run=True)
    assert dry.training_topics(scoring) == work / "queries.train4.tsv" and not work.exists()
    work.mkdir()
    made = pipeline.Pipeline(data_dir, work, [], ["test"], 100, 5, None)
    path = made.training_topics(scoring)
    expected = list(lines)
    random.Random(29).shuffle(expected)  # the commands that made the shipped debian-mores-2ib's subset
    assert path.read_text() == "".join(line.rstrip("\n") + "\n" for line in expected[:4])
    os.utime(path, ns=(0, 0))
    made.training_topics(scoring)  # the same text: not rewritten, so the steps that read it are not redone
    assert path.stat().st_mtime_ns == 0
    path.write_text("stale\n")
    made.training_topics(scoring)
    assert path.read_text() == "".join(line.rstrip("\n") + "\n" for line in expected[:4])
    assert made.training_topics(pipeline.TeacherScoring()) == data_dir / "queries.train.tsv"  # all of them
    # Without a seed, the file's first queries in its order (the commands that made one of debian-tk's last stages)
    first = made.training_topics(pipeline.TeacherScoring(depth=30, negatives=29, negative_depth=30, queries=4))
    assert first == work / "queries.train-first4.tsv" and first.read_text() == "".join(lines[:4])


def _pipeline_recording_commands(pipeline, data_dir, tmp_path, monkeypatch):
    """A pipeline over ``tmp_path / "w"`` whose steps' commands are recorded in the returned list, not run."""
    import subprocess

    ran = []
    monkeypatch.setattr("integrations.steps.subprocess.run",
                        lambda command, **options: ran.append(command) or subprocess.CompletedProcess(command, 0))
    (tmp_path / "w").mkdir()
    return pipeline.Pipeline(data_dir, tmp_path / "w", [], ["test"], 100, 5, None), ran


def test_two_scorings_of_the_same_candidates_need_a_name_for_the_others_negatives(pipeline, data_dir, tmp_path,
                                                                                  monkeypatch):
    made, ran = _pipeline_recording_commands(pipeline, data_dir, tmp_path, monkeypatch)
    teacher = pipeline.MODELS_BY_NAME["cross-encoder"]
    first = pipeline.TeacherScoring(depth=16, negatives=8, negative_depth=16)
    made.scored_triples(teacher, first)
    with pytest.raises(ValueError, match=r"two scorings of cross-encoder's train-top16 would write the same run and "
                                         r"triples: name the other's negatives \(mining\) or give it other queries"):
        made.scored_triples(teacher, dataclasses.replace(first, negatives=15))
    reranked = len(ran)
    named = made.scored_triples(teacher, dataclasses.replace(first, negatives=15, mining="15-negatives"))
    assert named == tmp_path / "w" / "triples.train.cross-encoder-train-top16-15-negatives.tsv"
    assert len(ran) == reranked + 1 and ran[-1][3] == "mine-negatives", "the same teacher run, mined once more"
    # at another depth the candidates are others: their own run and triples, no name needed
    assert made.scored_triples(teacher, dataclasses.replace(first, depth=30)).name == \
        "triples.train.cross-encoder-train-top30.tsv"


def test_an_average_its_sidecar_and_runs_are_made_again_when_an_ingredient_is_retrained(pipeline, data_dir, tmp_path,
                                                                                     monkeypatch, capsys):
    made, ran = _pipeline_recording_commands(pipeline, data_dir, tmp_path, monkeypatch)
    soup = pipeline.MODELS_BY_NAME["tk-soup"]
    summaries = [made.model_dir(name) / "training_summary.json" for name in soup.average_of]
    for path in summaries:
        path.parent.mkdir(parents=True)
        path.write_text("{}")
        os.utime(path, ns=(10**18, 10**18))
    made.average(soup)
    assert len(ran) == 1 and ran[0][-3:] == ["--output", str(made.model_dir("tk-soup")), "--overwrite"]
    averaged = made.model_dir("tk-soup") / "config.json"  # what the command would have written
    averaged.parent.mkdir()
    averaged.write_text("{}")
    os.utime(averaged, ns=(2 * 10**18, 2 * 10**18))
    made.average(soup)
    assert len(ran) == 1 and "[average-tk-soup] done" in capsys.readouterr().out
    run = made.run_file("tk-soup", "test")
    run.parent.mkdir()
    run.write_text("")
    os.utime(run, ns=(2 * 10**18, 2 * 10**18))
    made.rerank(soup, "test")
    assert len(ran) == 1 and "[rerank-tk-soup-test] found" in capsys.readouterr().out
    os.utime(summaries[1], ns=(3 * 10**18, 3 * 10**18))  # the second ingredient retrained after the average
    made.average(soup)
    assert len(ran) == 2 and f"[average-tk-soup] {summaries[1]} is newer than {averaged}: running it again" in \
        capsys.readouterr().out
    os.utime(averaged, ns=(4 * 10**18, 4 * 10**18))  # as the command would have rewritten it
    made.rerank(soup, "test")  # so the run reranked by the old average is made again too
    assert len(ran) == 3 and ran[-1][ran[-1].index("--model") + 1] == str(made.model_dir("tk-soup"))
    made.steps.record("sidecar-tk-soup", 60.0, None)  # built from the old average, now: the new one needs its own
    made.build_sidecar(soup)
    assert len(ran) == 4 and ran[-1][2:4] == ["pyserini_mores.sidecar", "build"]


def test_a_start_made_from_another_rows_model_is_made_again_when_that_model_is(pipeline, data_dir, tmp_path,
                                                                               monkeypatch, capsys):
    made, ran = _pipeline_recording_commands(pipeline, data_dir, tmp_path, monkeypatch)
    wide = pipeline.MODELS_BY_NAME["tk-wide"]
    # the widened row's source: an average, whole once its config is written
    source = made.made_marker(pipeline.MODELS_BY_NAME["tk-soup"])
    source.parent.mkdir(parents=True)
    source.write_text("{}")
    os.utime(source, ns=(10**18, 10**18))
    start = made.widened_start(wide)
    assert len(ran) == 1 and ran[0][2:5] == ["pyserini_mores.train", "widen-ffn", "--model"]
    assert ran[0][-2:] == ["--output", str(start)]
    start.mkdir()
    (start / "config.json").write_text("{}")  # what the command would have written
    os.utime(start / "config.json", ns=(2 * 10**18, 2 * 10**18))
    assert made.widened_start(wide) == start
    assert len(ran) == 1 and "[widen-tk-wide] done" in capsys.readouterr().out
    os.utime(source, ns=(3 * 10**18, 3 * 10**18))  # the source averaged again after the start was widened from it
    made.widened_start(wide)
    assert len(ran) == 2 and ran[1] == ran[0]
    assert f"[widen-tk-wide] {source} is newer than {start / 'config.json'}: running it again" in \
        capsys.readouterr().out


def _dry_run_of(pipeline, data_dir, work, row: str, capsys) -> tuple[str, dict[str, str], list[str]]:
    """What a dry run of ``row`` (and the rows it needs) prints: the output, its train commands and its steps."""
    pipeline.main(["--data", str(data_dir), "--work", str(work), "--dry-run", "--models", row])
    out = capsys.readouterr().out
    return out, _train_commands(out), _steps(out)


def test_the_shipped_mores_1ib_is_folded_from_the_shipped_2ib_and_reads_its_sidecar(pipeline, data_dir, tmp_path,
                                                                                     capsys):
    work, python = tmp_path / "w", sys.executable
    pipeline.main(["--data", str(data_dir), "--work", str(work), "--dry-run"])
    assert not {"mores-1ib-depth-30", "mores-1ib-depth-30-more"} & set(_train_commands(capsys.readouterr().out))

    out, commands, steps = _dry_run_of(pipeline, data_dir, work, "mores-1ib-depth-30-more", capsys)
    models = work / "models"
    start = models / "mores-1ib-depth-30-start"
    assert (f"[fold-mores-1ib-depth-30] $ {python} -m pyserini_mores.train fold-blocks --model "
            f"{models / 'mores-2ib-all-queries'} --blocks 1 --output {start}\n") in out
    # the 2×IB's sidecar, built from its trained model before the 1×IB trains against it (and not built again)
    assert steps.index("train-mores-2ib-all-queries") < steps.index("sidecar-mores-2ib-all-queries") \
        < steps.index("train-mores-1ib-depth-30")
    assert steps.count("sidecar-mores-2ib-all-queries") == 1
    assert not {"sidecar-mores-1ib-depth-30", "sidecar-mores-1ib-depth-30-more"} & set(steps)
    first8000 = work / "triples.train.cross-encoder-three-way-train-first8000-top30.tsv"
    first14000 = work / "triples.train.cross-encoder-three-way-train-first14000-top30.tsv"
    assert f"--recipe mores-1ib-debian-depth-30 --triples {first8000} " in commands["mores-1ib-depth-30"]
    assert commands["mores-1ib-depth-30"].endswith(f"--resume --init {start}")
    assert f"--recipe mores-1ib-debian-depth-30-more --triples {first14000} " in commands["mores-1ib-depth-30-more"]
    assert commands["mores-1ib-depth-30-more"].endswith(f"--resume --init {models / 'mores-1ib-depth-30'}")
    assert "[queries-train-first14000] 14,000 training queries from the top of the file" in out
    assert (f"[rerank-mores-1ib-depth-30-more-test] $ {python} -m pyserini_mores.search --index {work / 'index'} "
            f"--topics {data_dir / 'queries.test.tsv'} --reranker mores --model {models / 'mores-1ib-depth-30-more'} "
            "--model-arg reuse=s1 ") in out


def test_the_shipped_mores_1ib_ends_on_top_100_groups_of_unseen_queries_against_the_same_sidecar(
        pipeline, data_dir, tmp_path, capsys):
    work = tmp_path / "w"
    out, commands, steps = _dry_run_of(pipeline, data_dir, work, "mores-1ib-depth-100", capsys)
    models = work / "models"
    assert "[queries-train14001-16000] 2,000 training queries after the file's first 14,000" in out
    deep_rerank = out.split("[rerank-cross-encoder-three-way-train14001-16000-top100] $ ")[1]
    assert "--rerank-depth 100 --hits 100 " in deep_rerank
    assert "--negatives-per-query 99 --depth 100 --teacher-scores" in out.split(
        "[negatives-cross-encoder-three-way-train14001-16000-top100] $ ")[1].splitlines()[0]
    next2000 = work / "triples.train.cross-encoder-three-way-train14001-16000-top100.tsv"
    assert f"--recipe mores-1ib-debian-depth-100 --triples {next2000} " in commands["mores-1ib-depth-100"]
    assert commands["mores-1ib-depth-100"].endswith(f"--resume --init {models / 'mores-1ib-depth-30-more'}")
    assert steps.index("train-mores-1ib-depth-30-more") < steps.index("train-mores-1ib-depth-100")
    assert "sidecar-mores-1ib-depth-100" not in steps


def test_the_shipped_mores_2ib_ends_on_top_100_groups_against_its_own_sidecar(pipeline, data_dir, tmp_path, capsys):
    work = tmp_path / "w"
    out, commands, steps = _dry_run_of(pipeline, data_dir, work, "mores-2ib-depth-100", capsys)
    next2000 = work / "triples.train.cross-encoder-three-way-train14001-16000-top100.tsv"
    assert f"--recipe mores-2ib-debian-depth-100 --triples {next2000} " in commands["mores-2ib-depth-100"]
    assert commands["mores-2ib-depth-100"].endswith(f"--resume --init {work / 'models' / 'mores-2ib-all-queries'}")
    # trained against the sidecar of the row it starts from, built before it trains, and not built again
    assert steps.index("sidecar-mores-2ib-all-queries") < steps.index("train-mores-2ib-depth-100")
    assert "sidecar-mores-2ib-depth-100" not in steps


def test_the_shipped_tk_is_the_soup_widened_and_trained_on_the_next_queries(pipeline, data_dir, tmp_path, capsys):
    work, python = tmp_path / "w", sys.executable
    out, commands, steps = _dry_run_of(pipeline, data_dir, work, "tk-wide", capsys)
    models = work / "models"
    start = models / "tk-wide-start"
    assert (f"[widen-tk-wide] $ {python} -m pyserini_mores.train widen-ffn --model {models / 'tk-soup'} "
            f"--ffn-dim 400 --seed 47 --output {start}\n") in out
    assert steps.index("average-tk-soup") < steps.index("widen-tk-wide") < steps.index("train-tk-wide")
    assert "[queries-train8001-14000] 6,000 training queries after the file's first 8,000" in out
    next6000 = work / "triples.train.cross-encoder-three-way-train8001-14000-top30.tsv"
    assert f"--recipe tk-debian-depth-30-wide --triples {next6000} " in commands["tk-wide"]
    assert commands["tk-wide"].endswith(f"--resume --init {start}")


def test_skipped_training_queries_are_the_next_lines_of_the_file(pipeline, tmp_path):
    data, work = tmp_path / "d", tmp_path / "w"
    data.mkdir()
    work.mkdir()
    (data / "queries.train.tsv").write_text("".join(f"q{i}\tquery {i}\n" for i in range(1, 11)))
    made = pipeline.Pipeline(data, work, [], ["test"], 100, 5, None)
    scoring = pipeline.TeacherScoring(depth=30, queries=3, skip=4)
    assert scoring.topics == "train5-7"
    assert made.training_topics(scoring).read_text() == "q5\tquery 5\nq6\tquery 6\nq7\tquery 7\n"
    with pytest.raises(ValueError, match="skip counts lines of the training queries' file: give it with queries and "
                                         "no seed"):
        pipeline.TeacherScoring(queries=3, skip=4, seed=1)


def test_pieces_cover_lines_only_when_they_follow_one_another_to_the_end(pipeline):
    cover = pipeline.covering_pieces
    assert cover([(0, 8000), (8000, 14000)], (0, 14000)) == [(0, 8000), (8000, 14000)]
    assert cover([(0, 5), (0, 3), (3, 10)], (0, 10)) == [(0, 3), (3, 10)]  # the longest start leads nowhere
    assert cover([(0, 8000), (8000, 14000)], (0, 13000)) == []  # the last piece runs past the end
    assert cover([(0, 8000), (9000, 14000)], (0, 14000)) == []  # a gap
    assert cover([(0, 14000)], (0, 14000)) == []  # the same lines: the run itself, not a join
    assert cover([(0, 8000), (8000, 14000)], None) == []  # a random subset or all queries


def test_a_teachers_run_over_queries_it_reranked_in_pieces_is_joined_not_reranked(pipeline, data_dir, tmp_path,
                                                                                  monkeypatch, capsys):
    made, ran = _pipeline_recording_commands(pipeline, data_dir, tmp_path, monkeypatch)
    teacher = pipeline.MODELS_BY_NAME["cross-encoder-three-way"]
    first, second = (pipeline.TeacherScoring(depth=30, queries=2), pipeline.TeacherScoring(depth=30, queries=1, skip=2))
    for scoring, text in ((first, "q1 Q0 d1 1 9.5 t\nq2 Q0 d2 1 8.0 t\n"), (second, "q3 Q0 d3 1 7.25 t\n")):
        run = made.run_file(teacher.name, scoring.candidates)
        run.parent.mkdir(exist_ok=True)
        run.write_text(text)  # as the reranking step would have written it
        made.teacher_run(teacher, scoring, tmp_path / "topics.tsv")
    reranked = len(ran)
    joined = made.teacher_run(teacher, pipeline.TeacherScoring(depth=30, queries=3), tmp_path / "topics.tsv")
    assert len(ran) == reranked and joined == made.run_file(teacher.name, "train-first3-top30")
    assert joined.read_text() == "q1 Q0 d1 1 9.5 t\nq2 Q0 d2 1 8.0 t\nq3 Q0 d3 1 7.25 t\n"
    assert (f"[join-cross-encoder-three-way-train-first3-top30] cross-encoder-three-way.train-first2-top30.trec, "
            f"cross-encoder-three-way.train3-3-top30.trec joined, not reranked again: {joined}"
            ) in capsys.readouterr().out
    # at another depth the pieces are other candidates: reranked
    made.teacher_run(teacher, pipeline.TeacherScoring(depth=16, queries=3), tmp_path / "topics.tsv")
    assert len(ran) == reranked + 1 and ran[-1][ran[-1].index("--rerank-depth") + 1] == "16"


def test_the_full_schedules_first_14000_teacher_run_joins_the_first_8000_and_the_next_6000(pipeline, data_dir,
                                                                                          tmp_path, capsys):
    work = tmp_path / "w"
    pipeline.main(["--data", str(data_dir), "--work", str(work), "--dry-run", "--full"])
    out = capsys.readouterr().out
    assert "rerank-cross-encoder-three-way-train-first14000-top30" not in _steps(out)
    runs = work / "runs"
    assert (f"[join-cross-encoder-three-way-train-first14000-top30] "
            f"cross-encoder-three-way.train-first8000-top30.trec, cross-encoder-three-way.train8001-14000-top30.trec "
            f"joined, not reranked again: "
            f"{runs / 'cross-encoder-three-way.train-first14000-top30.trec'}") in out


def test_the_shipped_prettr_e128s_stages_run_only_with_full_and_compress_last(pipeline, data_dir, tmp_path, capsys):
    work, python = tmp_path / "w", sys.executable
    pipeline.main(["--data", str(data_dir), "--work", str(work), "--dry-run"])
    assert not {"prettr-from-ce", "prettr-e128"} & set(_train_commands(capsys.readouterr().out))

    out, commands, steps = _dry_run_of(pipeline, data_dir, work, "prettr-e128", capsys)
    models, runs = work / "models", work / "runs"
    # the first stage against the layer-4 sidecar of the second-stage cross-encoder, on MORES 2xIB's depth-30 groups
    assert (f"[sidecar-prettr-from-ce] $ {python} -m pyserini_mores.sidecar build --index {work / 'index'} "
            f"--reranker prettr --model {models / 'cross-encoder-three-way'} --model-arg join_layer=4 ") in out
    assert steps.index("sidecar-prettr-from-ce") < steps.index("train-prettr-from-ce")
    mores30 = work / "triples.train.mores-2ib-all-queries-train-first8000-top30.tsv"
    assert f"--recipe prettr-debian-from-ce --triples {mores30} " in commands["prettr-from-ce"]
    assert commands["prettr-from-ce"].endswith(f"--resume --init {models / 'cross-encoder-three-way'}")
    assert "[train-prettr-from-ce] 2,250 steps of a 5,000-step schedule (the recipe's stop_at_step)" in out
    assert f"--recipe prettr-debian-from-text --triples {mores30} " in commands["prettr-from-text"]
    # the cross-encoder's top 16 of the same queries, cut from its run over every training query, not reranked
    top16 = runs / "cross-encoder-three-way.train-first8000-top16.trec"
    assert (f"[cut-cross-encoder-three-way-train-first8000-top16] queries.train-first8000.tsv's queries cut from "
            f"cross-encoder-three-way.train-top16.trec, not reranked again: {top16}") in out
    assert not [step for step in steps if step.startswith("rerank-cross-encoder-three-way-train-first8000-top30")]
    ce16 = work / "triples.train.cross-encoder-three-way-train-first8000-top16.tsv"
    assert f"--run {top16} " in out.split("[negatives-cross-encoder-three-way-train-first8000-top16] $ ")[1]
    assert f"--recipe prettr-debian-from-text-ce --triples {ce16} " in commands["prettr-from-text-ce"]
    # then the compressor under that model on the pairs of its triples, and the ranker fine-tuned with it in place
    compressor = models / "prettr-e128-compressor"
    assert (f"[compressor-prettr-e128] $ {python} -m pyserini_mores.train pretrain-compressor --recipe "
            f"prettr-compressor-debian --texts {ce16} --output {compressor} --resume --init "
            f"{models / 'prettr-from-text-ce'}\n") in out
    assert commands["prettr-e128"].endswith(f"--resume --init {compressor}")
    assert steps.index("train-prettr-from-text-ce") < steps.index("compressor-prettr-e128") \
        < steps.index("train-prettr-e128") < steps.index("sidecar-prettr-e128")


def test_a_teachers_run_over_some_training_queries_is_cut_from_its_run_over_all_of_them(pipeline, data_dir,
                                                                                        tmp_path, monkeypatch):
    made, ran = _pipeline_recording_commands(pipeline, data_dir, tmp_path, monkeypatch)
    teacher = pipeline.MODELS_BY_NAME["cross-encoder-three-way"]
    every = made.run_file(teacher.name, "train-top16")
    every.parent.mkdir()
    every.write_text("q1 Q0 d1 1 9.5 t\nq1 Q0 d2 2 3.0 t\nq2 Q0 d3 1 8.0 t\nq3 Q0 d4 1 7.25 t\n")
    made.teacher_run(teacher, pipeline.TeacherScoring(depth=16), data_dir / "queries.train.tsv")  # found made
    reranked = len(ran)
    topics = tmp_path / "topics.tsv"
    topics.write_text("q3\tthird\nq1\tfirst\n")
    cut = made.teacher_run(teacher, pipeline.TeacherScoring(depth=16, queries=2), topics)
    assert len(ran) == reranked and cut == made.run_file(teacher.name, "train-first2-top16")
    assert cut.read_text() == "q3 Q0 d4 1 7.25 t\nq1 Q0 d1 1 9.5 t\nq1 Q0 d2 2 3.0 t\n", "the topics' order"
    made.teacher_run(teacher, pipeline.TeacherScoring(depth=30, queries=2), topics)
    assert len(ran) == reranked + 1 and ran[-1][ran[-1].index("--rerank-depth") + 1] == "30", \
        "at another depth: reranked"


def test_a_training_found_finished_counts_the_time_of_all_its_invocations(pipeline, tmp_path):
    summary = tmp_path / "training_summary.json"
    summary.write_text(json.dumps({"seconds": 120.0, "total_seconds": 3000.0}))  # resumed after 2,880 s
    assert pipeline._summary_seconds(summary) == 3000.0
    summary.write_text(json.dumps({"seconds": 120.0, "total_seconds": None}))  # resumed from an older checkpoint
    assert pipeline._summary_seconds(summary) == 120.0
    summary.write_text(json.dumps({"seconds": 120.0}))  # written before summaries counted them
    assert pipeline._summary_seconds(summary) == 120.0
