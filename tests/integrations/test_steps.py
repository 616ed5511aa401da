"""integrations/steps.py: the journal of the reproduction pipelines — skip what is journaled, refuse a changed
command, never journal a failed or killed step, replace the journal atomically, print commands in a dry run."""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
if str(REPOSITORY) not in sys.path:
    sys.path.append(str(REPOSITORY))

from integrations.steps import StepFailed, StepRunner  # noqa: E402


def _touch(path: Path) -> list[str]:
    """A command that appends a line to ``path`` (so each run can be counted)."""
    return [sys.executable, "-c", f"open({str(path)!r}, 'a').write('ran\\n')"]


def test_a_journaled_step_is_skipped_and_its_output_returned(tmp_path, capsys):
    journal, marker = tmp_path / "pipeline.json", tmp_path / "marker"
    printed = [sys.executable, "-c", "print('median 12.5 ms')"]
    assert StepRunner(journal).run("speed", printed, capture=True) == "median 12.5 ms\n"
    StepRunner(journal).run("write", _touch(marker))
    assert marker.read_text() == "ran\n"
    entry = json.loads(journal.read_text())["write"]
    assert entry["command"] == shlex.join(_touch(marker)) and entry["seconds"] >= 0 and entry["finished"]
    capsys.readouterr()

    again = StepRunner(journal)  # a re-run of the pipeline: a new process reading the journal
    again.run("write", _touch(marker))
    assert again.run("speed", printed, capture=True) == "median 12.5 ms\n"  # from the journal, not run
    assert marker.read_text() == "ran\n"
    out = capsys.readouterr().out
    assert re.search(r"^\[write\] done \(\d+ s\), skipped$", out, re.M) and "$ " not in out
    again.run("write", _touch(marker), always=True)
    assert marker.read_text() == "ran\nran\n"


def test_a_journaled_step_whose_command_changed_is_refused(tmp_path):
    journal, marker = tmp_path / "pipeline.json", tmp_path / "marker"
    StepRunner(journal).run("train", _touch(marker) + ["--max-steps", "500"])
    with pytest.raises(SystemExit, match=(
            r"(?s)^\[train\] finished earlier with another command:\n  then: .*--max-steps 500\n  now:  .*"
            r"--max-steps 4500\nTo redo it, move its outputs aside and delete \"train\" from "
            + str(journal).replace(".", r"\.") + "; to keep it, run with the settings it was made with.$")):
        StepRunner(journal).run("train", _touch(marker) + ["--max-steps", "4500"])
    assert marker.read_text() == "ran\n"


@pytest.mark.parametrize("ending, returncode", [("sys.exit(3)", 3), ("os.kill(os.getpid(), signal.SIGKILL)", -9)])
def test_a_failed_or_killed_step_is_not_journaled(tmp_path, ending, returncode):
    journal = tmp_path / "pipeline.json"
    runner = StepRunner(journal)
    runner.run("index", [sys.executable, "-c", "pass"])
    before = journal.read_text()
    command = [sys.executable, "-c", f"import os, signal, sys; {ending}"]
    with pytest.raises(StepFailed, match=rf"\[train\] failed with exit code {returncode}; fix it and re-run") as error:
        runner.run("train", command)
    assert error.value.returncode == returncode
    assert journal.read_text() == before and "train" not in StepRunner(journal).journal


def test_the_journal_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    journal = tmp_path / "pipeline.json"
    runner = StepRunner(journal)
    runner.record("index", 1.0, "index it")
    before = journal.read_text()
    runner.journal["note"] = {"big": "x" * 100_000}

    def killed(*args):  # the process dies after writing the new journal's text, before it replaces the old one
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        runner.record("train", 2.0, "train it")
    monkeypatch.undo()
    assert journal.read_text() == before
    with pytest.raises(TypeError):  # a value JSON cannot hold fails half-way through the text: nothing replaced
        runner.record("train", 2.0, "train it", stdout=object())
    assert journal.read_text() == before
    assert [path.name for path in tmp_path.iterdir()] == ["pipeline.json"]  # no temporary file left behind


def test_dry_run_prints_each_command_once_checks_it_and_writes_nothing(tmp_path, capsys):
    journal, marker = tmp_path / "pipeline.json", tmp_path / "marker"
    checked = []
    runner = StepRunner(journal, dry_run=True, check=lambda step, command: checked.append((step, command)))
    for _ in range(2):
        assert runner.run("write", _touch(marker), note="~1 s") is None
    out = capsys.readouterr().out
    assert out == f"[write] ~1 s\n[write] $ {shlex.join(_touch(marker))}\n"
    assert checked == [("write", _touch(marker))]
    assert not marker.exists() and not journal.exists()


def test_outputs_made_before_the_journal_are_adopted_and_stale_ones_made_again(tmp_path, capsys):
    journal, source, output = tmp_path / "pipeline.json", tmp_path / "run.trec", tmp_path / "eval.json"
    source.write_text("run\n")
    output.write_text("{}\n")
    os.utime(source, (1_000, 1_000))
    runner = StepRunner(journal)
    runner.run("eval", _touch(output), outputs=[output], inputs=[source], seconds_from=lambda path: 42.0)
    assert output.read_text() == "{}\n"  # not run
    assert f"[eval] found {output}, recorded as done" in capsys.readouterr().out
    assert runner.journal["eval"]["seconds"] == 42.0
    assert runner.journal["eval"]["note"] == "finished before this pipeline's journal"
    assert runner.finished("eval", [output], [source])

    os.utime(source, (output.stat().st_mtime + 10,) * 2)  # the run rewritten since: evaluate again
    assert not runner.finished("eval", [output], [source])
    runner.run("eval", _touch(output), outputs=[output], inputs=[source])
    assert f"[eval] {source} is newer than {output}: running it again" in capsys.readouterr().out
    assert output.read_text() == "{}\nran\n"


def test_a_step_without_outputs_runs_again_when_an_input_changes_after_it_finished(tmp_path, capsys):
    journal, model, marker = tmp_path / "pipeline.json", tmp_path / "config.json", tmp_path / "marker"
    model.write_text("{}\n")
    os.utime(model, (1_000, 1_000))
    runner = StepRunner(journal)
    runner.run("sidecar", _touch(marker), inputs=[model])
    runner.run("sidecar", _touch(marker), inputs=[model])
    assert marker.read_text() == "ran\n" and "[sidecar] done" in capsys.readouterr().out
    finished = runner.journal["sidecar"]["finished"]
    later = time.mktime(time.strptime(finished, "%Y-%m-%d %H:%M:%S")) + 5
    os.utime(model, (later, later))  # the model retrained after its sidecar was built
    assert not StepRunner(journal).finished("sidecar", inputs=[model])
    StepRunner(journal).run("sidecar", _touch(marker), inputs=[model])
    assert marker.read_text() == "ran\nran\n"
    assert f"[sidecar] {model} is newer than the step (finished {finished}): running it again" in \
        capsys.readouterr().out
