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


__all__ = ["check_alpha", "interpolate", "min_max"]
