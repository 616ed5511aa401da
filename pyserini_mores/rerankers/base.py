"""The reranker interface (pygaggle-compatible): ``rerank`` sorts what ``rescore`` scores."""
from __future__ import annotations

from abc import ABC, abstractmethod

from ..types import Query, Text


class Reranker(ABC):
    """Reorders candidates for a query.

    Subclasses implement :meth:`rescore` (set ``.score`` on every text, batched internally). ``needs_text`` tells
    callers whether candidates must carry their text or only their ids (rerankers reading a sidecar).
    """

    name: str = "reranker"
    needs_text: bool = True

    @abstractmethod
    def rescore(self, query: Query, texts: list[Text]) -> list[Text]:
        """Set a new ``score`` on each text and return them in the same order."""

    def rerank(self, query: Query | str, texts: list[Text]) -> list[Text]:
        """The same ``Text`` objects, with new scores, best first. Ties keep their input order.

        The score each text had before is kept in ``metadata['first_stage_score']``.
        """
        query = _as_query(query)
        for text in texts:
            text.metadata.setdefault("first_stage_score", text.score)
        rescored = self.rescore(query, list(texts))
        order = sorted(range(len(rescored)), key=lambda i: -rescored[i].score)
        return [rescored[i] for i in order]

    def close(self) -> None:
        """Release files and memory maps."""


class IdentityReranker(Reranker):
    """``bm25``: keeps the first-stage scores and order (the baseline, and a check that the plumbing is neutral)."""

    name = "bm25"
    needs_text = False

    def rescore(self, query: Query, texts: list[Text]) -> list[Text]:
        return texts


def _as_query(query: Query | str) -> Query:
    return query if isinstance(query, Query) else Query(text=query)
