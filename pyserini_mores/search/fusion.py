"""Score interpolation of a reranker with its first stage, as Pyserini's hybrid search fuses sparse and dense scores:
each list min–max normalised over the query's candidates, then ``alpha · reranker + (1 − alpha) · first stage``.

An extra, documented row in the results (``--interpolate``), with ``alpha`` chosen on dev queries: it can lift a
reranker that ranks some queries worse than BM25, but it is never how a reranker's own quality is reported.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..types import Text


def check_alpha(alpha: float) -> float:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"the interpolation weight alpha must be within [0, 1], not {alpha}")
    return alpha


def min_max(scores: Sequence[float]) -> list[float]:
    """``scores`` mapped onto [0, 1]; all equal (or one): all 0, so that the other list alone orders them."""
    low, high = min(scores, default=0.0), max(scores, default=0.0)
    if high == low:
        return [0.0] * len(scores)
    return [(score - low) / (high - low) for score in scores]


def interpolate(texts: Sequence[Text], alpha: float) -> list[Text]:
    """``texts`` (scored by a reranker, their first-stage score in ``metadata['first_stage_score']``) with
    ``score`` replaced by the interpolated score, best first (ties keep their order). The reranker's own score is
    kept in ``metadata['reranker_score']``."""
    check_alpha(alpha)
    texts = list(texts)
    learned = min_max([text.score for text in texts])
    first_stage = min_max([text.metadata["first_stage_score"] for text in texts])
    for text, learned_score, first_stage_score in zip(texts, learned, first_stage):
        text.metadata["reranker_score"] = text.score
        text.score = alpha * learned_score + (1.0 - alpha) * first_stage_score
    return sorted(texts, key=lambda text: -text.score)


RankedRun = dict[str, list[tuple[str, float]]]  # qid → [(docid, score)], as formats.read_ranked_run reads a run


def interpolate_runs(reranked: RankedRun, first_stage: RankedRun, alpha: float) -> dict[str, dict[str, float]]:
    """qid → {docid → interpolated score} over each query's candidates in ``reranked``, each fused by
    :func:`interpolate` with its score in ``first_stage`` (two run files fused without reranking again).

    Raises:
        ValueError: a reranked candidate the first-stage run does not score for its query.
    """
    fused = {}
    for qid, ranking in reranked.items():
        first_stage_scores = dict(first_stage.get(qid, []))
        missing = [docid for docid, _ in ranking if docid not in first_stage_scores]
        if missing:
            raise ValueError(f"query {qid}: the first-stage run does not score {len(missing)} reranked candidates "
                             f"(e.g. {missing[0]}): give the run the reranker reranked")
        texts = [Text(None, {"docid": docid, "first_stage_score": first_stage_scores[docid]}, score)
                 for docid, score in ranking]
        fused[qid] = {text.metadata["docid"]: text.score for text in interpolate(texts, alpha)}
    return fused


__all__ = ["check_alpha", "interpolate", "interpolate_runs", "min_max"]
