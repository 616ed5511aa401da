"""Score interpolation of a reranker with its first stage (``--interpolate``)."""
from __future__ import annotations

import pytest

from pyserini_mores.search.__main__ import main as search_main
from pyserini_mores.search.fusion import interpolate, interpolate_runs, min_max
from pyserini_mores.types import Text

from conftest import RESOURCES

TOPICS = RESOURCES / "tiny_topics.tsv"
QRELS = RESOURCES / "tiny_qrels.txt"


def _texts(reranker_scores, first_stage_scores):
    return [Text(text=None, metadata={"docid": f"d{i}", "first_stage_score": first}, score=learned)
            for i, (learned, first) in enumerate(zip(reranker_scores, first_stage_scores))]


def test_min_max_maps_onto_the_unit_interval_and_equal_scores_onto_zero():
    assert min_max([2.0, 4.0, 3.0]) == [0.0, 1.0, 0.5]
    assert min_max([7.0, 7.0]) == [0.0, 0.0] and min_max([]) == []


def test_interpolated_scores_equal_the_weighted_normalised_scores():
    # reranker 0, 10, 5 → 0, 1, 0.5; first stage 30, 20, 10 → 1, 0.5, 0; alpha 0.25
    fused = interpolate(_texts([0.0, 10.0, 5.0], [30.0, 20.0, 10.0]), 0.25)
    assert [(text.id, text.score) for text in fused] == [("d0", 0.75), ("d1", 0.625), ("d2", 0.125)]
    assert [text.metadata["reranker_score"] for text in fused] == [0.0, 10.0, 5.0]


@pytest.mark.parametrize("alpha,order", [(1.0, ["d1", "d2", "d0"]), (0.0, ["d0", "d1", "d2"])])
def test_the_extreme_weights_give_one_list_alone(alpha, order):
    assert [text.id for text in interpolate(_texts([0.0, 10.0, 5.0], [30.0, 20.0, 10.0]), alpha)] == order


def test_a_weight_outside_the_unit_interval_is_refused():
    with pytest.raises(ValueError, match=r"alpha must be within \[0, 1\], not 1.5"):
        interpolate(_texts([1.0], [1.0]), 1.5)


RERANKED = {"q1": [("a", 9.0), ("b", 5.0), ("c", 1.0)]}
FIRST_STAGE = {"q1": [("c", 30.0), ("b", 20.0), ("a", 10.0), ("z", 5.0)]}


def test_two_runs_fuse_into_the_hand_computed_interpolation():
    # reranker min-max: a 1, b 0.5, c 0; first stage over the reranked three: c 1, b 0.5, a 0
    fused = interpolate_runs(RERANKED, FIRST_STAGE, 0.25)["q1"]
    assert fused == pytest.approx({"a": 0.25, "b": 0.5, "c": 0.75})
    assert list(interpolate_runs(RERANKED, FIRST_STAGE, 1.0)["q1"]) == ["a", "b", "c"]  # the reranker alone
    assert list(interpolate_runs(RERANKED, FIRST_STAGE, 0.0)["q1"]) == ["c", "b", "a"]  # the first stage alone


def test_fusing_runs_refuses_a_candidate_without_a_first_stage_score():
    with pytest.raises(ValueError, match=r"query q1: the first-stage run does not score 1 reranked candidates "
                                         r"\(e.g. a\)"):
        interpolate_runs(RERANKED, {"q1": [("b", 2.0), ("c", 1.0)]}, 0.5)


def test_cli_interpolation_at_zero_keeps_the_first_stage_ranking(tiny_index, tiny_maxsim_dir, maxsim_sidecar, tmp_path,
                                                                capsys):
    common = ["--index", str(tiny_index), "--topics", str(TOPICS), "--hits", "5", "--reranker", "maxsim",
              "--model", str(tiny_maxsim_dir), "--rerank-depth", "10"]
    assert search_main(common + ["--output", str(tmp_path / "bm25.trec"), "--reranker", "bm25"]) == 0
    assert search_main(common + ["--output", str(tmp_path / "fused.trec"), "--interpolate", "0",
                                 "--qrels", str(QRELS)]) == 0
    assert "maxsim + BM25 (alpha 0)" in capsys.readouterr().out

    def ranking(path):
        return [line.split()[:3:2] for line in path.read_text().splitlines()]

    assert ranking(tmp_path / "fused.trec") == ranking(tmp_path / "bm25.trec")
    assert search_main(common + ["--interpolate", "2"]) == 2
    assert "alpha must be within [0, 1], not 2" in capsys.readouterr().err
