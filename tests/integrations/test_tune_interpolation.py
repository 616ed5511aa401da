"""integrations/debian_packages/tune_interpolation.py: the alpha it prints as best is the best of the grid (the fusion
itself, ``fusion.interpolate_runs``, is tested in tests/search/test_fusion.py)."""
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
