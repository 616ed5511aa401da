"""integrations/debian_packages/tune_interpolation.py: the fusion of two run files is --interpolate's, value for
value, and the alpha it prints as best is the best of the grid."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "integrations" / "debian_packages" / "tune_interpolation.py"


@pytest.fixture(scope="module")
def tune():
    spec = importlib.util.spec_from_file_location("tune_interpolation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RERANKED = {"q1": [("a", 9.0), ("b", 5.0), ("c", 1.0)]}
FIRST_STAGE = {"q1": [("c", 30.0), ("b", 20.0), ("a", 10.0), ("z", 5.0)]}


def test_the_fused_scores_are_the_hand_computed_interpolation(tune):
    # reranker min-max: a 1, b 0.5, c 0; first stage over the reranked three: c 1, b 0.5, a 0
    fused = tune.fused_run(RERANKED, FIRST_STAGE, 0.25)["q1"]
    assert fused == pytest.approx({"a": 0.25, "b": 0.5, "c": 0.75})
    assert list(tune.fused_run(RERANKED, FIRST_STAGE, 1.0)["q1"]) == ["a", "b", "c"]  # the reranker alone
    assert list(tune.fused_run(RERANKED, FIRST_STAGE, 0.0)["q1"]) == ["c", "b", "a"]  # the first stage alone


def test_a_candidate_without_a_first_stage_score_is_an_error(tune):
    with pytest.raises(ValueError, match=r"query q1: the first-stage run does not score 1 reranked candidates "
                                         r"\(e.g. a\)"):
        tune.fused_run(RERANKED, {"q1": [("b", 2.0), ("c", 1.0)]}, 0.5)


def test_the_best_alpha_is_the_best_of_the_grid(tune, tmp_path, capsys):
    def write(path, run):
        path.write_text("".join(f"{qid} Q0 {docid} {rank} {score} t\n" for qid, ranking in run.items()
                                for rank, (docid, score) in enumerate(ranking, 1)))
    write(tmp_path / "reranked.trec", RERANKED)
    # min-max: reranker a 1, b 0.5, c 0; first stage c 1, b 0.95, a 0. Alone, either puts b second; at alpha 0.5
    # b leads (0.725 against 0.5 and 0.5)
    write(tmp_path / "first.trec", {"q1": [("c", 30.0), ("b", 29.0), ("a", 10.0)]})
    (tmp_path / "qrels.txt").write_text("q1 0 b 1\n")
    tune.main(["--reranked", str(tmp_path / "reranked.trec"), "--first-stage", str(tmp_path / "first.trec"),
               "--qrels", str(tmp_path / "qrels.txt"), "--alphas", "0", "0.5", "1"])
    out = capsys.readouterr().out
    assert "alpha 0: MRR@10 0.5000" in out and "alpha 1: MRR@10 0.5000" in out
    assert out.splitlines()[-1] == "best alpha 0.5: MRR@10 1.0000"
