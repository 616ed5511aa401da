"""pygaggle-compatible ``Query`` and ``Text``, the hit objects the searcher returns (Pyserini-compatible), and what
the rerank stage did for a query (``RerankStats``)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Query:
    """A query: its text and, optionally, its id (pygaggle's ``Query``)."""

    text: str
    id: str | None = None


@dataclass(eq=False)
class Text:
    """A candidate document (pygaggle's ``Text``): text, metadata, score and title.

    ``metadata`` carries ``docid`` and, for candidates that come from a Lucene index, ``lucene_docid`` (the row of
    the document in the index and its sidecar). ``text`` may be ``None`` for rerankers that read stored
    representations only.
    """

    text: str | None
    metadata: dict[str, Any] = field(default_factory=dict)
    score: float = 0.0
    title: str | None = None

    @property
    def id(self) -> str | None:
        return self.metadata.get("docid")


@dataclass
class RerankedHit:
    """A search result with the attributes Pyserini's hits and output writers use."""

    docid: str
    score: float
    lucene_docid: int = -1
    first_stage_score: float | None = None
    first_stage_rank: int | None = None

    def __repr__(self) -> str:
        return f"RerankedHit(docid={self.docid!r}, score={self.score:.4f})"


@dataclass(frozen=True)
class RerankStats:
    """What the rerank stage did for one query.

    Attributes:
        candidates: first-stage hits the query had.
        depth: how many of them, from the top, the rerank stage was given (``rerank_depth``, or the depth a time
            budget buys); the others kept their first-stage order.
        rerank_ms: wall time of the rerank stage (text fetch when the reranker scores text, query encoding, sidecar
            reads, scoring, sorting), ms; 0.0 when nothing was reranked.
        scored: how many of the ``depth``, from the top, were scored and reranked (default: ``depth``); fewer when a
            time budget's deadline stopped the scoring, and the rest then kept their first-stage order too.
        deadline_cut: whether the deadline stopped the scoring before ``depth``.
    """

    candidates: int
    depth: int
    rerank_ms: float
    scored: int | None = None
    deadline_cut: bool = False

    def __post_init__(self):
        if self.scored is None:
            object.__setattr__(self, "scored", self.depth)


def hits_to_texts(hits: Iterable, texts: Iterable[str | None] | None = None) -> list[Text]:
    """Pyserini hits (``.docid``, ``.score``, ``.lucene_docid``) → ``Text`` objects, keeping the BM25 score."""
    hits = list(hits)
    texts = [None] * len(hits) if texts is None else list(texts)
    return [
        Text(
            text=text,
            metadata={"docid": hit.docid, "lucene_docid": int(getattr(hit, "lucene_docid", -1)),
                      "first_stage_score": float(hit.score), "first_stage_rank": rank},
            score=float(hit.score),
        )
        for rank, (hit, text) in enumerate(zip(hits, texts), start=1)
    ]


def texts_to_hits(texts: Iterable[Text]) -> list[RerankedHit]:
    return [
        RerankedHit(
            docid=text.metadata["docid"],
            score=float(text.score),
            lucene_docid=int(text.metadata.get("lucene_docid", -1)),
            first_stage_score=text.metadata.get("first_stage_score"),
            first_stage_rank=text.metadata.get("first_stage_rank"),
        )
        for text in texts
    ]
