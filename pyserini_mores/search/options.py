"""What a :class:`~.searcher.RerankingSearcher` is built from, one object per stage, each checked when made so that a
mistake is refused before the index, the JVM or a model loads: :class:`FirstStageOptions` (which first stage, with
its parameters) and :class:`RerankStageOptions` (how deep, under which budget, with which sidecar). The reranker's
own are :class:`~pyserini_mores.rerankers.options.RerankerOptions`."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .first_stage import DENSE_FIRST_STAGES, Dense, Hybrid, Rm3, check_first_stage
from .fusion import check_alpha


@dataclass(frozen=True)
class FirstStageOptions:
    """The first stage: ``kind`` (``bm25``, ``bm25+rm3``, ``dense``, ``hybrid``), BM25's ``k1`` and ``b``
    (``None``: Pyserini's for the index), and the parameters of the kind that takes them: ``rm3`` (default:
    Pyserini's), ``dense`` (required by ``dense`` and ``hybrid``), ``hybrid`` (default: Pyserini's)."""

    kind: str = "bm25"
    k1: float | None = None
    b: float | None = None
    rm3: Rm3 | None = None
    dense: Dense | None = None
    hybrid: Hybrid | None = None

    def __post_init__(self):
        check_first_stage(self.kind)
        if self.k1 is not None and not self.k1 >= 0:
            raise ValueError(f"k1 must be >= 0, not {self.k1}")
        if self.b is not None and not 0 <= self.b <= 1:
            raise ValueError(f"b must be in [0, 1], not {self.b}")
        if self.rm3 is not None and self.kind != "bm25+rm3":
            raise ValueError(f"rm3= is for the bm25+rm3 first stage, not {self.kind!r}")
        if self.kind in DENSE_FIRST_STAGES and self.dense is None:
            raise ValueError(f"first_stage={self.kind!r} needs dense=Dense(index, encoder)")
        if self.dense is not None and self.kind not in DENSE_FIRST_STAGES:
            raise ValueError(f"dense= is for the dense and hybrid first stages, not {self.kind!r}")
        if self.hybrid is not None and self.kind != "hybrid":
            raise ValueError(f"hybrid= is for the hybrid first stage, not {self.kind!r}")
        # The kinds that take parameters get their defaults here, once, so that what runs is what is shown.
        if self.kind == "bm25+rm3" and self.rm3 is None:
            object.__setattr__(self, "rm3", Rm3())
        if self.kind == "hybrid" and self.hybrid is None:
            object.__setattr__(self, "hybrid", Hybrid())


@dataclass(frozen=True)
class RerankStageOptions:
    """How the rerank stage runs (see :class:`~.searcher.RerankingSearcher` for each).

    Attributes:
        rerank_depth: first-stage hits reranked per query (>= 0).
        time_budget_ms: the rerank stage's budget per query in ms (>= 0; ``None`` or ``inf``: none).
        enforce_deadline: under a finite budget, also stop scoring at its deadline.
        interpolate: ``alpha`` in [0, 1] of the fusion with the first stage's scores, or ``None``.
        sidecar: a path, ``"auto"`` (beside the index) or ``None`` (documents encoded from their text).
        encode_from_text: where the sidecar is missing, encode the documents from their text (slow) instead of
            refusing.
    """

    rerank_depth: int = 1000
    time_budget_ms: float | None = None
    enforce_deadline: bool = True
    interpolate: float | None = None
    sidecar: str | os.PathLike | None = "auto"
    encode_from_text: bool = False

    def __post_init__(self):
        if isinstance(self.rerank_depth, bool) or not isinstance(self.rerank_depth, int) or self.rerank_depth < 0:
            raise ValueError(f"rerank_depth must be an integer >= 0, not {self.rerank_depth!r}")
        if self.time_budget_ms is not None and not self.time_budget_ms >= 0:
            raise ValueError(f"time_budget_ms must be >= 0 (or None for no budget), not {self.time_budget_ms}")
        if self.interpolate is not None:
            check_alpha(self.interpolate)

    @property
    def budgeted(self) -> bool:
        """Whether a finite, positive budget decides each query's depth (and so needs the cost model)."""
        return self.time_budget_ms is not None and 0 < self.time_budget_ms < math.inf and self.rerank_depth > 0


__all__ = ["FirstStageOptions", "RerankStageOptions"]
