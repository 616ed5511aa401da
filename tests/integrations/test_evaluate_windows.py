"""integrations/manpages/evaluate_windows.py: saved window scores evaluated under FirstMaxP with other weights of the
first window, against rankings worked out by hand."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "integrations" / "manpages" / "evaluate_windows.py"


def _load():
    spec = importlib.util.spec_from_file_location("manpages_evaluate_windows", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


evaluate_windows = _load()


def test_first_weights_rank_by_the_weighted_first_and_best_window(tmp_path):
    # Document a: first window 4, best 4; b: first 0, best 10.
    # w * first + (1 - w) * best: a = 4 at every w; b = 10 - 10 w: 8 at w = 0.2, 5 at 0.5, 2 at 0.8.
    # The relevant document is a, ranked first only at w = 0.8 (MRR@10 1), else second (0.5).
    saved = {"q1/docids": np.array(["b", "a"]), "q1/window_scores": np.array([0.0, 10.0, 4.0]),
             "q1/owners": np.array([0, 0, 1])}
    np.savez(tmp_path / "windows.npz", **saved)
    (tmp_path / "qrels.txt").write_text("q1 0 a 1\n")
    out = tmp_path / "table.json"
    assert evaluate_windows.main(["--qrels", str(tmp_path / "qrels.txt"), "--windows", str(tmp_path / "windows.npz"),
                                  "--first-weights", "0.2", "0.5", "0.8", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    weighted = {row["first_weight"]: row["MRR@10"] for row in rows if "first_weight" in row}
    assert weighted == {0.2: 0.5, 0.5: 0.5, 0.8: 1.0}
    plain = {row["aggregation"]: row["MRR@10"] for row in rows if "first_weight" not in row}
    assert plain["firstmaxp"] == weighted[0.5]
    assert plain["firstp"] == 1.0 and plain["maxp"] == 0.5


def test_a_query_in_two_files_has_the_second_files_candidates_after_the_firsts(tmp_path):
    # The top 2 (b, a) in one file, candidates 3-4 (c, d) in another, as --skip-candidates 2 saves them: c's windows
    # belong to candidate 2 of the joined ranking, d's to 3. By MaxP c 9, a 4, b 3, d 1; by FirstP a 4, b 3, d 1, c 0;
    # at depth 2 only b and a are ranked.
    np.savez(tmp_path / "top.npz", **{"q1/docids": np.array(["b", "a"]), "q1/window_scores": np.array([3.0, 1.0, 4.0]),
                                      "q1/owners": np.array([0, 0, 1]), "q1/avgcls": np.array([2.0, 4.0])})
    np.savez(tmp_path / "next.npz", **{"q1/docids": np.array(["c", "d"]), "q1/window_scores": np.array([0.0, 9.0, 1.0]),
                                       "q1/owners": np.array([0, 0, 1])})
    joined = evaluate_windows.load([str(tmp_path / "top.npz"), str(tmp_path / "next.npz")])["q1"]
    assert joined["docids"].tolist() == ["b", "a", "c", "d"]
    assert joined["owners"].tolist() == [0, 0, 1, 2, 2, 3]
    assert "avgcls" not in joined  # saved for only a part of the candidates
    (tmp_path / "qrels.txt").write_text("q1 0 c 1\n")
    out = tmp_path / "table.json"
    assert evaluate_windows.main(["--qrels", str(tmp_path / "qrels.txt"), "--windows", str(tmp_path / "top.npz"),
                                  str(tmp_path / "next.npz"), "--depths", "2", "4", "--json", str(out)]) == 0
    mrr = {(row["aggregation"], row["depth"]): row["MRR@10"] for row in json.loads(out.read_text())["rows"]}
    assert mrr[("maxp", 2)] == 0.0 and mrr[("maxp", 4)] == 1.0 and mrr[("firstp", 4)] == 0.25
