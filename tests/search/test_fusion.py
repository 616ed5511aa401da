"""Score interpolation of a reranker with its first stage (``--interpolate``)."""
from __future__ import annotations

import pytest

from pyserini_mores.search.__main__ import main as search_main
from pyserini_mores.search.fusion import interpolate, min_max
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
