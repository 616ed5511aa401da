"""integrations/debian_packages/ensemble_teacher.py: the ensemble's order is --interpolate's fusion of the two runs,
its scores sit in the first teacher's range, and the written run is what mine-negatives --teacher-scores reads."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pyserini_mores.formats import read_ranked_run

REPOSITORY = Path(__file__).resolve().parents[2]
if str(REPOSITORY) not in sys.path:
    sys.path.append(str(REPOSITORY))

from integrations.debian_packages.ensemble_teacher import ensemble_run, main  # noqa: E402

# cross-encoder-like logits and MaxSim-like sums on another scale
FIRST = {"q1": [("a", 8.0), ("b", 4.0), ("c", -2.0)], "q2": [("x", 1.0), ("y", 1.0)]}
SECOND = {"q1": [("c", 30.0), ("b", 29.0), ("a", 10.0)], "q2": [("y", 3.0), ("x", 2.0)]}


def test_the_fused_scores_are_mapped_onto_the_first_runs_range():
    # q1 min-max: first a 1, b 0.6, c 0; second c 1, b 0.95, a 0; alpha 0.5 → a 0.5, b 0.775, c 0.5
    # back onto the first run's [-2, 8]: a 3, b 5.75, c 3
    run = ensemble_run(FIRST, SECOND, 0.5)
    assert run["q1"][0] == ("b", pytest.approx(5.75))
    assert dict(run["q1"]) == pytest.approx({"a": 3.0, "b": 5.75, "c": 3.0})
    # the first run ties q2 (range 0): every fused score collapses onto its single value
    assert dict(run["q2"]) == pytest.approx({"x": 1.0, "y": 1.0})


def test_alpha_one_keeps_the_first_teacher_exactly():
    run = ensemble_run(FIRST, SECOND, 1.0)
    assert run["q1"] == [("a", pytest.approx(8.0)), ("b", pytest.approx(4.0)), ("c", pytest.approx(-2.0))]


def test_a_candidate_the_second_teacher_did_not_score_is_an_error():
    with pytest.raises(ValueError, match=r"query q1: the first-stage run does not score 1 reranked candidates"):
        ensemble_run(FIRST, {"q1": SECOND["q1"][:2], "q2": SECOND["q2"]}, 0.5)


def test_the_written_run_reads_back_in_the_ensembles_order(tmp_path, capsys):
    def write(path, run):
        path.write_text("".join(f"{qid} Q0 {docid} {rank} {score} t\n" for qid, ranking in run.items()
                                for rank, (docid, score) in enumerate(ranking, 1)))
    write(tmp_path / "first.trec", FIRST)
    write(tmp_path / "second.trec", SECOND)
    assert main(["--first", str(tmp_path / "first.trec"), "--second", str(tmp_path / "second.trec"),
                          "--alpha", "0.5", "--output", str(tmp_path / "ensemble.trec")]) == 0
    assert "wrote 5 hits for 2 queries" in capsys.readouterr().out
    written = read_ranked_run(tmp_path / "ensemble.trec")
    assert [docid for docid, _ in written["q1"]] == ["b", "a", "c"]
    assert dict(written["q1"]) == pytest.approx({"a": 3.0, "b": 5.75, "c": 3.0}, abs=1e-6)
