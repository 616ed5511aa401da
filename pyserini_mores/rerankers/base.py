"""The reranker interface: pygaggle's ``rerank(query, texts)`` (never mutating its input), and sentence-transformers'
``rank(query, documents)`` and ``predict(pairs)`` for plain strings; ``rerank`` sorts what ``rescore`` scores."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from ..types import Query, Text, check_candidates, copy_candidates


class Reranker(ABC):
    """Reorders candidates for a query.

    Subclasses implement :meth:`rescore` (set ``.score`` on every text, batched internally). ``needs_text`` tells
    callers whether candidates must carry their text or only their ids (rerankers reading a sidecar).

    Example:
        >>> reranker = get_reranker("maxsim")  # doctest: +SKIP
        >>> reranker.rank("a text editor", ["Vim is a text editor.", "nginx is a web server."])  # doctest: +SKIP
        [{'corpus_id': 0, 'score': 9.1...}, {'corpus_id': 1, 'score': 4.2...}]
    """

    name: str = "reranker"
    needs_text: bool = True

    @abstractmethod
    def rescore(self, query: Query, texts: list[Text]) -> list[Text]:
        """Set a new ``score`` on each text and return them in the same order."""

    def rerank(self, query: Query | str, texts: list[Text]) -> list[Text]:
        """New ``Text`` objects for ``texts``, with new scores, best first; ties keep their input order. ``texts``
        are not modified (pygaggle's contract). The score each text had is kept in ``metadata['first_stage_score']``.

        Raises:
            CandidateError: a text without metadata or without ``metadata['docid']``, or two with the same docid.
        """
        query = _as_query(query)
        rescored = self.rescore(query, copy_candidates(texts))
        order = sorted(range(len(rescored)), key=lambda i: -rescored[i].score)
        return [rescored[i] for i in order]

    def score_documents(self, query: str, documents: Sequence[str | None] | None,
                        doc_ids: Sequence[str] | None = None, batch_size: int | None = None) -> np.ndarray:
        """The scores of ``documents`` for ``query``, in their order: float32 ``[len(documents)]``.

        Each document is a candidate named by its ``doc_ids`` entry, else by its position. Rerankers that read
        stored representations override this to read them (by ``doc_ids``) instead of encoding text.
        """
        texts = string_candidates(documents, doc_ids)
        scored = self.rescore(Query(query), texts)
        return np.array([text.score for text in scored], dtype=np.float32)

    def rank(self, query: str, documents: Sequence[str] | None, top_k: int | None = None,
             return_documents: bool = False, batch_size: int | None = None,
             doc_ids: Sequence[str] | None = None) -> list[dict]:
        """Rank plain-string ``documents`` for ``query``, as sentence-transformers' ``CrossEncoder.rank``.

        Args:
            documents: the documents' texts (may be ``None`` with ``doc_ids`` for a reranker that reads them from its
                sidecar).
            top_k: how many to return (default: all).
            return_documents: also return each document's text under ``"text"``.
            batch_size: candidates scored per model batch (default: the reranker's own).
            doc_ids: the documents' docids in the index: a reranker with a sidecar then reads their stored
                representations instead of encoding the texts (the same scores); without a sidecar they only name the
                documents.

        Returns:
            ``[{"corpus_id": position in documents, "score": float}, ...]`` best first (ties keep their order).

        Raises:
            CandidateError: two equal ``doc_ids``.
        """
        scores = self.score_documents(query, documents, doc_ids, batch_size)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        if top_k is not None:
            order = order[:max(0, top_k)]
        ranked = []
        for i in order:
            result = {"corpus_id": i, "score": float(scores[i])}
            if return_documents:
                result["text"] = None if documents is None else documents[i]
            ranked.append(result)
        return ranked

    def predict(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None) -> np.ndarray:
        """Scores of ``(query, document)`` string pairs, in their order: float32 ``[len(pairs)]``, as
        sentence-transformers' ``CrossEncoder.predict``. Each distinct query is encoded once, with its documents."""
        pairs = [tuple(pair) for pair in pairs]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError("predict takes (query, document) pairs")
        by_query: dict[str, list[int]] = {}
        for position, (query, _) in enumerate(pairs):
            by_query.setdefault(query, []).append(position)
        scores = np.zeros(len(pairs), dtype=np.float32)
        for query, positions in by_query.items():
            scores[positions] = self.score_documents(query, [pairs[i][1] for i in positions], batch_size=batch_size)
        return scores

    def close(self) -> None:
        """Release files and memory maps."""


class IdentityReranker(Reranker):
    """``bm25``: keeps the first-stage scores and order (the baseline, and a check that the plumbing is neutral).
    Plain strings have no first-stage score: :meth:`rank` keeps their order, every score 0."""

    name = "bm25"
    needs_text = False

    def rescore(self, query: Query, texts: list[Text]) -> list[Text]:
        return texts


def _as_query(query: Query | str) -> Query:
    return query if isinstance(query, Query) else Query(text=query)


def string_candidates(documents: Sequence[str | None] | None, doc_ids: Sequence[str] | None) -> list[Text]:
    """Candidates for plain strings: named by ``doc_ids`` (checked: one each, no two equal) or by position."""
    if documents is None and doc_ids is None:
        raise ValueError("give the documents' texts, or their doc_ids (for a reranker that reads a sidecar)")
    if documents is not None and doc_ids is not None and len(documents) != len(doc_ids):
        raise ValueError(f"{len(doc_ids)} doc_ids for {len(documents)} documents")
    count = len(documents) if documents is not None else len(doc_ids)
    texts = [Text(text=None if documents is None else documents[i],
                  metadata={"docid": str(doc_ids[i]) if doc_ids is not None else str(i)}) for i in range(count)]
    if doc_ids is not None:
        check_candidates(texts)
    return texts
