"""integrations/msmarco_passage: the reproduction script's dry run (offline, as in CI), its failures on real problems,
its step execution and skipping, its download helper, and the comparison with the papers' numbers."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

INTEGRATION = Path(__file__).resolve().parents[2] / "integrations" / "msmarco_passage"
REPRODUCE = INTEGRATION / "reproduce.py"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"msmarco_passage_{name}", INTEGRATION / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


reproduce = _load("reproduce")
compare = _load("compare")


def test_dry_run_prints_every_command_and_passes_offline(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(REPRODUCE), "--output-dir", str(out), "--dry-run"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = done.stdout
    expected = [
        f"reproduce.py fetch-qrels msmarco-passage-dev-subset {out}/data/qrels.dev.txt",
        f"reproduce.py fetch-qrels dl20-passage {out}/data/qrels.dl20.txt",
        f"reproduce.py download {reproduce.TRIPLES_URL} --member triples.train.small.tsv",
        f"python -m pyserini_mores.search --index msmarco-v1-passage --topics msmarco-passage-dev-subset "
        f"--output {out}/runs/bm25.dev.trec --hits 1000",
        f"python -m pyserini_mores.train train --recipe cross-encoder-msmarco --triples "
        f"{out}/downloads/triples.train.small.tsv --output {out}/models/cross-encoder --resume",
        f"python -m pyserini_mores.train train --recipe mores-msmarco --triples "
        f"{out}/downloads/triples.train.small.tsv --output {out}/models/mores-1ib --resume "
        "--model-arg n_interaction_blocks=1",
        f"python -m pyserini_mores.train pretrain-compressor --recipe prettr-compressor-msmarco --texts "
        f"{out}/downloads/triples.train.small.tsv --output {out}/models/prettr-l11-e256-compressor --resume",
        f"python -m pyserini_mores.train train --recipe prettr-msmarco --init {out}/models/prettr-l11-e256-compressor",
        f"--model-arg compression_dim=256 --dev-topics {out}/data/topics.dev.tsv --dev-qrels {out}/data/qrels.dev.txt "
        "--dev-index msmarco-v1-passage",
        f"python -m pyserini_mores.train train --recipe tk-msmarco --init {out}/downloads/glove.42B.300d.txt",
        f"python -m pyserini_mores.sidecar build --index msmarco-v1-passage --reranker mores --model "
        f"{out}/models/mores-2ib --model-arg reuse=s1 --output {out}/sidecars/mores-2ib",
        f"python -m pyserini_mores.search --index msmarco-v1-passage --topics dl20 --output {out}/runs/tk.dl20.trec "
        f"--hits 1000 --rerank-depth 1000 --reranker tk --model {out}/models/tk --sidecar {out}/sidecars/tk",
        f"python -m pyserini_mores.eval --qrels {out}/data/qrels.dl19.txt {out}/runs/bm25.dl19.trec",
        f"--baseline {out}/runs/cross-encoder.dl19.trec --metrics MRR@10 MRR nDCG@10 MAP R@10 R@100 R@1000 "
        f"--relevance-level 2 --json {out}/eval/dl19.json",
        f"compare.py --results-dir {out} --output {out}/comparison.md",
    ]
    missing = [command for command in expected if command not in printed]
    assert not missing, printed
    # 4 data + 2 downloads + 3 BM25 + 7 training (one compressor) + 5 sidecars + 18 reranking + 3 eval + compare
    assert printed.count("\n  $ ") == 43
    assert "ok: all 43 commands' arguments are accepted by their CLIs' own parsers" in printed
    assert "Pyserini knows the topics and qrels" in printed
    assert "Dry run OK: 43 command(s) to run" in printed and "could not be checked offline" in printed
    assert not out.exists()  # a dry run writes nothing


def dry_run(capsys, *args: str) -> tuple[int, str]:
    code = reproduce.main(["--dry-run", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_dry_run_with_an_unknown_recipe_fails(tmp_path, capsys):
    code, printed = dry_run(capsys, "--output-dir", str(tmp_path / "out"), "--recipe", "mores-2ib=no-such-recipe",
                            "--models", "mores-2ib", "--topic-sets", "dl19")
    assert code == 1
    assert "ERROR: unknown recipe 'no-such-recipe'; shipped recipes: cross-encoder-debian" in printed
    assert "problem(s) found (ERROR above); nothing was run." in printed


def test_dry_run_with_an_unwritable_output_directory_fails(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, printed = dry_run(capsys, "--output-dir", str(blocker / "out"), "--models", "cross-encoder",
                            "--topic-sets", "dl19")
    assert code == 1
    assert f"ERROR: output directory {blocker / 'out'} cannot be created: {blocker} is not a directory" in printed


def test_dry_run_checks_training_settings_and_given_files(tmp_path, capsys):
    # A recipe that parses but that `train` would reject (pointwise groups are 2 examples; 3 do not split).
    recipe = tmp_path / "odd-batch.json"
    recipe.write_text(json.dumps({"command": "train", "settings": {"model_type": "mores", "init": "bert-base-uncased",
                                                                   "batch_size": 3}}))
    code, printed = dry_run(capsys, "--output-dir", str(tmp_path / "out"), "--models", "mores-2ib",
                            "--recipe", f"mores-2ib={recipe}", "--triples", str(tmp_path / "missing.tsv"),
                            "--tolerance", "nDCG@10=lots", "--topic-sets", "dl19")
    assert code == 1
    assert "batch_size=3 must be a multiple of it" in printed
    assert f"ERROR: --triples {tmp_path / 'missing.tsv'}: no such file" in printed
    assert "--tolerance expects a number or METRIC=NUMBER, got 'nDCG@10=lots'" in printed


def test_dry_run_of_later_steps_needs_what_earlier_steps_make(tmp_path, capsys):
    out = tmp_path / "out"
    code, printed = dry_run(capsys, "--output-dir", str(out), "--only", "rerank", "--models", "mores-2ib",
                            "--topic-sets", "dl19")
    assert code == 1
    assert (f"ERROR: step rerank needs {out}/sidecars/mores-2ib/manifest.json, which does not exist yet (the sidecar "
            "step makes it; select it too)") in printed
    assert "train train" not in printed  # only the selected step's commands are listed


# ---- running steps, on a synthetic results directory ---------------------------------------------------------------

def _write_run(path: Path, ranks: dict[str, int]) -> None:
    """A 10-deep TREC run per query with the query's relevant document ``rel-<qid>`` at the given rank."""
    lines = []
    for qid, relevant_rank in ranks.items():
        for rank in range(1, 11):
            docid = f"rel-{qid}" if rank == relevant_rank else f"other-{qid}-{rank}"
            lines.append(f"{qid} Q0 {docid} {rank} {100 - rank} synthetic")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _synthetic_dev_results(root: Path) -> None:
    (root / "data").mkdir(parents=True)
    (root / "data" / "qrels.dev.txt").write_text("".join(f"{qid} 0 rel-{qid} 1\n" for qid in "1234"))
    # MRR@10: BM25 (1/5+1/5+1/5+1/7)/4 = 0.1857 (paper 0.1875: within 0.01); MORES 2xIB (1/2+1/2+1/5+1/5)/4 = 0.35
    # (0.3456: within); cross-encoder (1/2+1/2+1/5+1/10)/4 = 0.325 (0.3527: 0.028 off)
    _write_run(root / "runs" / "bm25.dev.trec", {"1": 5, "2": 5, "3": 5, "4": 7})
    _write_run(root / "runs" / "mores-2ib.dev.trec", {"1": 2, "2": 2, "3": 5, "4": 5})
    _write_run(root / "runs" / "cross-encoder.dev.trec", {"1": 2, "2": 2, "3": 5, "4": 10})


def _row(report: str, *cells: str) -> str:
    matches = [line for line in report.splitlines() if all(f"| {cell} |" in line for cell in cells)]
    assert len(matches) == 1, (cells, report)
    return matches[0]


def test_eval_and_compare_steps_run_then_skip(tmp_path, capsys):
    root = tmp_path / "results"
    _synthetic_dev_results(root)
    args = ["--output-dir", str(root), "--models", "cross-encoder", "mores-2ib", "--topic-sets", "dev",
            "--only", "eval", "compare"]
    code = reproduce.main(args)
    printed = capsys.readouterr().out
    assert code == 1  # the cross-encoder is outside the tolerance: the last step (compare) says so
    assert f"$ python -m pyserini_mores.eval --qrels {root}/data/qrels.dev.txt" in printed
    payload = json.loads((root / "eval" / "dev.json").read_text())
    assert payload["runs"]["mores-2ib.dev.trec"]["aggregate"]["MRR@10"] == pytest.approx(0.35)
    report = (root / "comparison.md").read_text()
    assert "| 0.3500 | +0.0044 | ±0.01 | ✓ |" in _row(report, "mores-2ib", "dev", "MRR@10")
    assert "| 0.3250 | -0.0277 | ±0.01 | ✗ |" in _row(report, "cross-encoder", "BERT ranker", "dev", "MRR@10")
    assert "✓" in _row(report, "bm25", "dev", "MRR@10", "0.1875")
    assert "not run" in _row(report, "tk", "dev", "MRR@10")

    journal = json.loads((root / "pipeline.json").read_text())
    assert journal["eval-dev"]["command"].startswith(f"python -m pyserini_mores.eval --qrels {root}/data/qrels.dev")
    assert "compare" not in journal  # it exited 1 (numbers outside the tolerance): not finished

    code = reproduce.main(args)  # eval is journaled and its output is newer than its runs: skipped; compare always runs
    printed = capsys.readouterr().out
    assert "[eval-dev] done (" in printed and "[eval-dev] $" not in printed
    assert "$ python integrations/msmarco_passage/compare.py" in printed or "compare.py --results-dir" in printed

    _write_run(root / "runs" / "mores-2ib.dev.trec", {"1": 1, "2": 1, "3": 1, "4": 1})  # a newer run: eval again
    reproduce.main(args)
    printed = capsys.readouterr().out
    assert f"[eval-dev] {root}/runs/mores-2ib.dev.trec is newer than {root}/eval/dev.json: running it again" in printed
    assert f"$ python -m pyserini_mores.eval --qrels {root}/data/qrels.dev.txt" in printed


def test_outputs_made_before_the_journal_are_adopted_and_a_changed_command_is_refused(tmp_path, capsys):
    root = tmp_path / "results"
    _synthetic_dev_results(root)
    args = ["--output-dir", str(root), "--models", "cross-encoder", "mores-2ib", "--topic-sets", "dev",
            "--only", "eval"]
    reproduce.main(args)
    capsys.readouterr()
    (root / "pipeline.json").unlink()  # an eval made before the pipeline kept a journal
    assert reproduce.main(args) == 0
    assert f"[eval-dev] found {root}/eval/dev.json, recorded as done" in capsys.readouterr().out
    assert json.loads((root / "pipeline.json").read_text())["eval-dev"]["note"] == (
        "finished before this pipeline's journal")
    # the same outputs asked for with another command (another model set): refused, not silently kept
    with pytest.raises(SystemExit, match=r"(?s)\[eval-dev\] finished earlier with another command:\n  then: .*"
                                         r"cross-encoder\.dev\.trec.*\n  now:  .*delete \"eval-dev\" from"):
        reproduce.main(["--output-dir", str(root), "--models", "mores-2ib", "--topic-sets", "dev", "--only", "eval"])


def test_dry_run_marks_journaled_commands_done(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    plan = reproduce.build_plan(reproduce.parse_options(["--output-dir", str(out), "--models", "tk", "--dry-run"]))
    train = next(command for command in plan if command.name == "train-tk")
    (out / "pipeline.json").write_text(json.dumps({"train-tk": {"seconds": 5.0, "command": train.display()}}))
    code, printed = dry_run(capsys, "--output-dir", str(out), "--models", "tk", "--only", "train")
    assert code == 0, printed
    assert f"  $ {train.display()}    # done (train-tk), skipped" in printed
    assert "Dry run OK: 0 command(s) to run" in printed


def test_compare_marks_numbers_and_claims_from_an_eval_json(tmp_path, capsys):
    root = tmp_path / "results"
    (root / "eval").mkdir(parents=True)
    runs = {"cross-encoder.dev.trec": {"MRR@10": 0.3500}, "mores-2ib.dev.trec": {"MRR@10": 0.3300},
            "mores-1ib.dev.trec": {"MRR@10": 0.3340}}
    (root / "eval" / "dev.json").write_text(json.dumps({
        "qrels": "qrels.dev.txt", "relevance_level": 1, "baseline": "cross-encoder.dev.trec", "test_metric": "MRR@10",
        "runs": {name: {"path": f"runs/{name}", "aggregate": values} for name, values in runs.items()},
        "non_inferiority": {
            "mores-2ib.dev.trec": [{"margin": 0.02, "non_inferior": False, "p_value": 0.4},
                                   {"margin": 0.05, "non_inferior": True, "p_value": 0.01}],
            "mores-1ib.dev.trec": [{"margin": 0.02, "non_inferior": False, "p_value": 0.3},
                                   {"margin": 0.05, "non_inferior": True, "p_value": 0.001}]}}))
    code = compare.main(["--results-dir", str(root), "--tolerance", "0.02", "--tolerance", "MRR=0.05"])
    report = capsys.readouterr().out
    assert code == 1
    assert "| +0.0006 | ±0.02 | ✓ |" in _row(report, "mores-1ib", "dev", "MRR@10")
    assert "| -0.0156 | ±0.02 | ✓ |" in _row(report, "mores-2ib", "dev", "MRR@10")
    assert "| -0.0027 | ±0.02 | ✓ |" in _row(report, "cross-encoder", "dev", "MRR@10", "BERT ranker")
    assert "| info |" in _row(report, "cross-encoder", "dev", "MRR@10", "TK paper's BERT-Base")
    assert "| ±0.05 | not run |" in _row(report, "mores-2ib", "dl19", "MRR")
    assert "| no (p = 0.4) | ✗ |" in _row(report, "mores-2ib non-inferior to cross-encoder at 2% (dev MRR@10)", "yes")
    assert "| yes (p = 0.001) | ✓ |" in _row(report, "mores-1ib non-inferior to cross-encoder at 5% (dev MRR@10)",
                                             "yes")
    assert "4 of 5 checked numbers within tolerance; 1 outside" in report


def test_compare_evaluates_runs_without_an_eval_json(tmp_path, capsys):
    root = tmp_path / "results"
    _synthetic_dev_results(root)
    assert compare.main(["--results-dir", str(root)]) == 1
    report = capsys.readouterr().out
    assert "| 0.3500 | +0.0044 | ±0.01 | ✓ |" in _row(report, "mores-2ib", "dev", "MRR@10")
    assert "| 0.1857 | -0.0018 | ±0.01 | ✓ |" in _row(report, "bm25", "dev", "MRR@10", "0.1875")
    assert "| mores-2ib | 0.3500 |" in report  # the table of all our results


def test_compare_rejects_a_missing_results_directory(tmp_path, capsys):
    assert compare.main(["--results-dir", str(tmp_path / "nothing")]) == 2
    assert f"error: results directory {tmp_path / 'nothing'} does not exist" in capsys.readouterr().err


def test_paper_results_cite_a_source_for_every_number():
    paper = compare.load_paper_results()
    models = {row["model"] for row in paper["results"]}
    assert models - {"bm25"} <= set(reproduce.MODELS)
    assert all(row["source"].split()[0] in ("MORES", "EARL", "TK", "Pyserini") for row in paper["results"])
    mores_2ib = {(row["topic_set"], row["metric"]): row["value"] for row in paper["results"]
                 if row["model"] == "mores-2ib"}
    assert mores_2ib == {("dev", "MRR@10"): 0.3456, ("dl19", "MRR"): 0.9283, ("dl19", "nDCG@10"): 0.7026,
                         ("dl19", "MAP"): 0.4777}


def test_download_resumes_nothing_and_extracts_one_member(tmp_path, capsys):
    source = tmp_path / "source"
    source.mkdir()
    (source / "triples.train.small.tsv").write_text("query\tpositive\tnegative\n")
    (source / "other.txt").write_text("not this one")
    with tarfile.open(tmp_path / "triples.tar.gz", "w:gz") as bundle:
        bundle.add(source / "other.txt", arcname="other.txt")
        bundle.add(source / "triples.train.small.tsv", arcname="triples.train.small.tsv")
    with zipfile.ZipFile(tmp_path / "glove.zip", "w") as bundle:
        bundle.write(source / "triples.train.small.tsv", arcname="glove.txt")
    target = tmp_path / "downloads" / "triples.tsv"
    assert reproduce.main(["download", (tmp_path / "triples.tar.gz").as_uri(), "--member",
                           "triples.train.small.tsv", "--output", str(target)]) == 0
    assert target.read_text() == "query\tpositive\tnegative\n"
    assert not list(target.parent.glob("*.part"))
    glove = tmp_path / "downloads" / "glove.txt"
    assert reproduce.main(["download", (tmp_path / "glove.zip").as_uri(), "--member", "glove.txt",
                           "--output", str(glove)]) == 0
    assert glove.read_text() == "query\tpositive\tnegative\n"
    assert reproduce.main(["download", (tmp_path / "glove.zip").as_uri(), "--member", "missing.txt",
                           "--output", str(tmp_path / "downloads" / "missing.txt")]) == 2
    assert "has no member missing.txt" in capsys.readouterr().err
