"""pygaggle-compatible ``Query`` and ``Text``, the hit objects the searcher returns (Pyserini-compatible), and what
the rerank stage did for a query (``RerankStats``)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import UserFixableError

#: What :func:`hits_to_texts` may put in ``Text.text``.
TEXT_FIELDS = ("text", "raw", "contents")


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
    """A search result with the attributes of Pyserini's hits (``JScoredDoc``): ``docid``, ``score``,
    ``lucene_docid`` and ``lucene_document`` (the stored Lucene ``Document``), and the stored fields ``raw`` and
    ``contents`` as older Pyserini hits had them; Pyserini's run writers accept it.

    The searcher's hits read ``lucene_document`` from the index when first asked for, not before: a run of a
    thousand hits for each of thousands of queries holds no documents.
    """

    docid: str
    score: float
    lucene_docid: int = -1
    first_stage_score: float | None = None
    first_stage_rank: int | None = None
    # Plain attributes, not fields: dataclasses.asdict and == never see the Java document or the reader.
    _document = None
    _read_document = None

    def attach_document(self, document: Any = None, reader: Callable[[int], Any] | None = None) -> RerankedHit:
        """Give the hit its Lucene ``document``, or a ``reader`` (Lucene docid → ``Document``) that fetches it on
        first use. Returns the hit."""
        self._document, self._read_document = document, reader
        return self

    @property
    def lucene_document(self) -> Any:
        """The stored Lucene ``Document`` (Java), or ``None`` when the hit knows of no index."""
        if self._document is None and self._read_document is not None and self.lucene_docid >= 0:
            self._document = self._read_document(self.lucene_docid)
        return self._document

    @property
    def raw(self) -> str | None:
        """The document's stored ``raw`` field (for a JSON collection, the JSON record), if stored."""
        return _stored_field(self.lucene_document, "raw")

    @property
    def contents(self) -> str | None:
        """The document's stored ``contents`` field (indexes built with ``--storeContents``), if stored."""
        return _stored_field(self.lucene_document, "contents")

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


class CandidateError(UserFixableError, ValueError):
    """Candidates a reranker cannot tell apart: a ``Text`` without metadata or without a docid, or two with the same
    docid."""


def check_candidates(texts: Sequence[Text]) -> None:
    """Refuse candidates that are not one document each, named by a docid.

    Raises:
        CandidateError: naming the first candidate at fault (by position) and what it lacks or repeats.
    """
    docids = []
    for position, text in enumerate(texts):
        metadata = getattr(text, "metadata", None)
        if not isinstance(metadata, dict):
            raise CandidateError(f"candidate {position} has no metadata (got {type(metadata).__name__}): give every "
                                 "Text metadata={'docid': ...}")
        docid = metadata.get("docid")
        if docid is None:
            keys = ", ".join(map(str, metadata)) or "none"
            raise CandidateError(f"candidate {position} has no 'docid' in its metadata (keys: {keys}): give every "
                                 "Text metadata={'docid': ...}")
        docids.append(docid)
    check_unique_docids(docids)


def check_unique_docids(docids: Iterable[str]) -> None:
    """Raises :class:`CandidateError` naming the first docid given twice, and both its positions."""
    first_seen: dict[str, int] = {}
    for position, docid in enumerate(docids):
        if docid in first_seen:
            raise CandidateError(f"candidates {first_seen[docid]} and {position} have the same docid {docid!r}: "
                                 "each candidate must be a different document")
        first_seen[docid] = position


def copy_candidates(texts: Iterable[Text]) -> list[Text]:
    """New ``Text`` objects equal to ``texts`` (metadata copied one level deep), after :func:`check_candidates`; the
    score each had is kept in ``metadata['first_stage_score']`` unless already there. What a reranker scores, so that
    the caller's texts stay as they were (pygaggle's rerankers are non-destructive)."""
    texts = list(texts)
    check_candidates(texts)
    copies = []
    for text in texts:
        metadata = dict(text.metadata)
        metadata.setdefault("first_stage_score", text.score)
        copies.append(Text(text=text.text, metadata=metadata, score=text.score, title=getattr(text, "title", None)))
    return copies


def hits_to_texts(hits: Iterable, field: str = "text", *, texts: Iterable[str | None] | None = None) -> list[Text]:
    """Pyserini hits (``.docid``, ``.score``, ``.lucene_docid``, ``.lucene_document``) → ``Text`` objects, as
    pygaggle's ``hits_to_texts``: each keeps its hit's score, and its metadata the ``docid`` and the stored ``raw``
    field, plus ``lucene_docid`` and the first-stage score and rank.

    Args:
        field: what becomes ``Text.text``: ``"text"`` (the document's text as the rerankers read it: the
            ``contents`` field, else the ``contents``/``text`` of the raw JSON record with its title), or the stored
            ``"raw"`` or ``"contents"`` field verbatim (pygaggle's choices; ``raw`` is its default).
        texts: the texts themselves (e.g. fetched by the caller), one per hit; the hits' documents are then not read.
    """
    if field not in TEXT_FIELDS:
        raise ValueError(f"field must be one of {', '.join(TEXT_FIELDS)}, not {field!r}")
    hits = list(hits)
    if texts is not None:
        texts = list(texts)
        if len(texts) != len(hits):
            raise ValueError(f"{len(texts)} texts for {len(hits)} hits")
    converted = []
    for rank, hit in enumerate(hits, start=1):
        metadata = {"docid": hit.docid, "lucene_docid": int(getattr(hit, "lucene_docid", -1)),
                    "first_stage_score": float(hit.score), "first_stage_rank": rank}
        if texts is None:
            document = _document_of(hit)
            metadata["raw"] = _stored_field(document, "raw")
            text = _text_of(document, field, metadata["raw"])
        else:
            text = texts[rank - 1]
        converted.append(Text(text=text, metadata=metadata, score=float(hit.score)))
    return converted


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


def first_stage_hits(hits: Iterable) -> list[RerankedHit]:
    """Pyserini hits (or :class:`RerankedHit` objects) in their given order as new :class:`RerankedHit` objects, each
    with its first-stage score and rank (and the way to read its document, from a :class:`RerankedHit`)."""
    copies = []
    for rank, hit in enumerate(hits, start=1):
        copy = RerankedHit(docid=hit.docid, score=float(hit.score), lucene_docid=int(getattr(hit, "lucene_docid", -1)),
                           first_stage_score=float(hit.score), first_stage_rank=rank)
        if isinstance(hit, RerankedHit):
            copy.attach_document(hit._document, hit._read_document)
        copies.append(copy)
    return copies


def _document_of(hit) -> Any:
    """The hit's Lucene ``Document`` (Java), or ``None``; older Pyserini hits carried ``raw``/``contents`` instead."""
    return getattr(hit, "lucene_document", None)


def _stored_field(document: Any, name: str) -> str | None:
    return None if document is None else document.get(name)


def _text_of(document: Any, field: str, raw: str | None) -> str | None:
    if document is None:
        return None
    if field == "raw":
        return raw
    if field == "contents":
        return _stored_field(document, "contents")
    from ._jvm import import_pyserini  # the JVM is running: the hit came from it
    from .index import document_text

    return document_text(import_pyserini("pyserini.index.lucene").Document(document))
