"""A resumable step runner for the reproduction pipelines: each step is one command, journaled when it finishes.

The journal (a JSON file in the pipeline's working directory) holds, per finished step, its seconds, finish time,
command and, when asked for, its standard output. A re-run skips journaled steps, so a killed pipeline continues
where it stopped (training, sidecar builds and searches with ``--output`` also resume from inside an interrupted
step), and refuses to skip a step whose command has changed since: its outputs are those of the old command, and a
results table would silently mix the two. A step that fails or is killed (non-zero exit) is not journaled, and the
journal is replaced atomically, so a kill never leaves it half-written.

Outputs made before a pipeline kept a journal are adopted: a step that declares ``outputs`` is recorded as done when
they all exist (and none is older than the step's ``inputs``). A journaled step whose outputs have become older
than one of its inputs (a model retrained, a run rewritten) runs again; one that declares inputs but no outputs (a
sidecar build, whose directory the pipeline does not name) runs again when an input is newer than the step's finish.

Both ``integrations/debian_packages/pipeline.py`` and ``integrations/msmarco_passage/reproduce.py`` run their
commands through :class:`StepRunner`.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pyserini_mores._io import write_json_atomic

FINISHED_FORMAT = "%Y-%m-%d %H:%M:%S"  # the journal's finish times, local time


class StepFailed(SystemExit):
    """A step's command exited with a non-zero code (or was killed by a signal: a negative code)."""

    def __init__(self, step: str, returncode: int):
        super().__init__(f"[{step}] failed with exit code {returncode}; fix it and re-run the same command: finished "
                         "steps are skipped")
        self.step, self.returncode = step, returncode


def stale_reason(outputs: Sequence[Path], inputs: Sequence[Path]) -> str | None:
    """Why existing ``outputs`` are out of date (an input newer than the oldest of them), or None: up to date, or an
    output missing (nothing to compare)."""
    if not outputs or not all(Path(path).exists() for path in outputs):
        return None
    oldest = min(outputs, key=lambda path: Path(path).stat().st_mtime)
    for path in inputs:
        if Path(path).exists() and Path(path).stat().st_mtime > Path(oldest).stat().st_mtime:
            return f"{path} is newer than {oldest}"
    return None


class StepRunner:
    """Runs, skips and journals the steps of one pipeline (journal at ``journal``).

    ``dry_run``: print each step's command once (calling ``check(step, command)`` on it, to catch a bad flag
    without running anything) and write nothing.
    """

    def __init__(self, journal: Path, *, dry_run: bool = False,
                 check: Callable[[str, list], None] | None = None):
        self.path = Path(journal)
        self.dry_run = dry_run
        self.check = check
        self.journal: dict[str, dict] = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self._shown: set[str] = set()

    # ---- reading the journal ---------------------------------------------------------------------------------------
    def total_seconds(self) -> float:
        return sum(entry.get("seconds") or 0.0 for entry in self.journal.values())

    def stdout(self, step: str) -> str | None:
        return (self.journal.get(step) or {}).get("stdout")

    def finished(self, step: str, outputs: Sequence[Path] = (), inputs: Sequence[Path] = ()) -> bool:
        """Whether :meth:`run` would skip ``step`` (ignoring ``always``)."""
        if step in self.journal:
            return self._stale_reason(step, outputs, inputs) is None
        return self._made_before_journal(outputs, inputs)

    # ---- running ---------------------------------------------------------------------------------------------------
    def run(self, step: str, command: Sequence, *, display: str | None = None, outputs: Sequence[Path] = (),
            inputs: Sequence[Path] = (), capture: bool = False, always: bool = False,
            seconds_from: Callable[[Path], float] | None = None, note: str | None = None) -> str | None:
        """Run ``command`` as ``step`` unless it is done; returns its standard output when ``capture`` (the
        journaled one when skipped).

        Args:
            display: the command as printed and journaled (default: ``command`` shell-quoted).
            outputs: files the command writes (its last one last): existing before the journal knew the step, they
                mark it done (``seconds_from(outputs[-1])`` gives its seconds, when given).
            inputs: files the command reads: a journaled step whose outputs (without outputs: whose finish) are
                older than one of them runs again.
            always: run it even when journaled (a cheap step whose result depends on everything before).
            note: printed before the command when it runs (what the step is expected to cost, say).

        Raises:
            StepFailed: the command exited non-zero (nothing journaled).
            SystemExit: the step is journaled with another command.
        """
        shown = display if display is not None else shlex.join(map(str, command))
        if step in self.journal and not always:
            stale = self._stale_reason(step, outputs, inputs)
            if stale is None:
                self._check_same_command(step, shown)
                print(f"[{step}] done ({self.journal[step].get('seconds') or 0:.0f} s), skipped")
                return self.stdout(step)
            print(f"[{step}] {stale}: running it again")
        elif not always and self._made_before_journal(outputs, inputs):
            print(f"[{step}] found {outputs[-1]}, recorded as done")
            if not self.dry_run:
                self.record(step, seconds_from(Path(outputs[-1])) if seconds_from else 0.0, shown,
                            note="finished before this pipeline's journal")
            return None
        if self.dry_run:
            if step not in self._shown:  # printed once, as a real run journals it once
                self._shown.add(step)
                if note:
                    print(f"[{step}] {note}")
                print(f"[{step}] $ {shown}", flush=True)
                if self.check is not None:
                    self.check(step, list(command))
            return None
        if note:
            print(f"[{step}] {note}")
        print(f"[{step}] $ {shown}", flush=True)
        started = time.perf_counter()
        arguments = [str(part) for part in command]
        completed = subprocess.run(arguments, stdout=subprocess.PIPE, text=True) if capture else \
            subprocess.run(arguments)
        if capture:
            sys.stdout.write(completed.stdout)
        if completed.returncode != 0:
            raise StepFailed(step, completed.returncode)
        self.record(step, time.perf_counter() - started, shown, **({"stdout": completed.stdout} if capture else {}))
        return completed.stdout if capture else None

    def record(self, step: str, seconds: float, command: str | None, **extra) -> None:
        """Journal ``step`` as finished; the journal file is replaced whole or not at all."""
        self.journal[step] = {"seconds": round(seconds, 1), "finished": time.strftime(FINISHED_FORMAT),
                              "command": command, **extra}
        write_json_atomic(self.path, self.journal)

    # ---- helpers ---------------------------------------------------------------------------------------------------
    def _stale_reason(self, step: str, outputs: Sequence[Path], inputs: Sequence[Path]) -> str | None:
        """Why journaled ``step`` is out of date: by its outputs' age, or without outputs by its journaled finish."""
        if outputs:
            return stale_reason(outputs, inputs)
        finished = self.journal[step].get("finished")
        if not finished or not inputs:
            return None
        # the journal keeps whole seconds: an input written in the second the step finished is not taken as newer
        finish = time.mktime(time.strptime(finished, FINISHED_FORMAT)) + 1
        for path in inputs:
            if Path(path).exists() and Path(path).stat().st_mtime > finish:
                return f"{path} is newer than the step (finished {finished})"
        return None

    def _check_same_command(self, step: str, command: str) -> None:
        recorded = self.journal[step].get("command")
        if recorded is not None and recorded != command:
            raise SystemExit(f"[{step}] finished earlier with another command:\n  then: {recorded}\n  now:  {command}\n"
                             f"To redo it, move its outputs aside and delete \"{step}\" from {self.path}; to keep "
                             "it, run with the settings it was made with.")

    @staticmethod
    def _made_before_journal(outputs: Sequence[Path], inputs: Sequence[Path]) -> bool:
        return bool(outputs) and all(Path(path).exists() for path in outputs) and stale_reason(outputs, inputs) is None
