"""First stages for :class:`~pyserini_mores.search.RerankingSearcher` besides BM25: BM25 with RM3 feedback through
Pyserini, a dense index searched with Pyserini's ``FaissSearcher``, Pyserini's ``HybridSearcher`` fusing that dense
index with BM25, and any other first stage's candidates read from a run.

A run's candidates are joined to the index by docid, never by position: each docid is looked up in the reranker's
sidecar (a binary search of its sorted docids) or, without a sidecar, in the Lucene index, and the row found becomes
the hit's ``lucene_docid``. Docids the index does not hold mean a run of another collection (or another version of
it): they are an error naming a few, unless the caller asks to skip them.
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .._jvm import import_pyserini
from ..formats import RunFormat, read_ranked_run
from ..models.backbones import OFFLINE_MINILM_NAMES, offline_minilm_path
from ..models.trust import check_model_directory
from ..types import RerankedHit

logger = logging.getLogger(__name__)

FIRST_STAGES: tuple[str, ...] = ("bm25", "bm25+rm3", "dense", "hybrid")
DENSE_FIRST_STAGES: tuple[str, ...] = ("dense", "hybrid")  # those that search a Pyserini dense index
SHOWN_IDS = 5  # ids named in an error or warning; the rest are counted
DOCID_CHECK_SAMPLES = 1000  # docids of a dense index looked up in the Lucene index when it is opened

Run = Mapping[str, Sequence[tuple[str, float]]]


@dataclass(frozen=True)
class Rm3:
    """RM3 pseudo-relevance feedback (Lavrenko and Croft 2001; Abdul-Jaleel et al. 2004) as Pyserini's
    ``LuceneSearcher.set_rm3`` takes it, with its defaults."""

    fb_terms: int = 10
    fb_docs: int = 10
    original_query_weight: float = 0.5

    def __post_init__(self):
        if self.fb_terms < 1 or self.fb_docs < 1:
            raise ValueError(f"RM3 needs fb_terms >= 1 and fb_docs >= 1, not {self.fb_terms} and {self.fb_docs}")
        if not 0.0 <= self.original_query_weight <= 1.0:
            raise ValueError(f"RM3 original_query_weight must be in [0, 1], not {self.original_query_weight}")


@dataclass(frozen=True)
class Dense:
    """A Pyserini dense index and the encoder of its queries.

    Attributes:
        index: a directory Pyserini's ``FaissSearcher`` reads (a faiss ``index`` file and a ``docid`` file, one
            docid a line in the index's order), or a Pyserini prebuilt dense index name.
        encoder: a Pyserini ``QueryEncoder``, or a Hugging Face model name or directory (``minilm``: the offline
            MiniLM-L6) encoded with Pyserini's ``AutoQueryEncoder`` with ``pooling`` and ``l2_norm``: it must be
            the encoder the documents were encoded with.
    """

    index: str | os.PathLike
    encoder: object = "minilm"
    pooling: str = "mean"
    l2_norm: bool = True


@dataclass(frozen=True)
class Hybrid:
    """How Pyserini's ``HybridSearcher`` fuses BM25 and dense scores, with the defaults of its ``search``.

    Every document in either searcher's top list gets ``alpha`` × its BM25 score + its dense score
    (``weight_on_dense``: BM25 + ``alpha`` × dense); a document missing from one list gets that list's lowest score.
    With ``normalization``, each list's scores are first centred on the middle of their range and divided by it.
    """

    alpha: float = 0.1
    normalization: bool = False
    weight_on_dense: bool = False

    def __post_init__(self):
        if not math.isfinite(self.alpha):
            raise ValueError(f"the hybrid first stage's alpha must be a finite number, not {self.alpha}")


def open_dense_searcher(dense: Dense):
    """Pyserini's ``FaissSearcher`` over ``dense.index`` with its query encoder (an encoder directory that asks to
    run code of its own is refused first: Pyserini's encoders load it without saying ``trust_remote_code=False``)."""
    encoder = dense.encoder
    path = None
    if isinstance(encoder, (str, os.PathLike)):
        path = offline_minilm_path() if str(encoder).lower() in OFFLINE_MINILM_NAMES else encoder
        check_model_directory(path)
    faiss = import_pyserini("pyserini.search.faiss")
    if path is not None:
        encoder = import_pyserini("pyserini.encode").AutoQueryEncoder(str(path), pooling=dense.pooling,
                                                                       l2_norm=dense.l2_norm)
    if os.path.isdir(dense.index):
        return faiss.FaissSearcher(str(dense.index), encoder)
    searcher = faiss.FaissSearcher.from_prebuilt_index(str(dense.index), encoder)
    if searcher is None:  # Pyserini prints why and returns None
        raise FileNotFoundError(f"dense index {dense.index} is neither a directory nor a Pyserini prebuilt index "
                                "that could be downloaded")
    return searcher


def check_dense_docids(dense_searcher, rows_for_docids: Callable[[Sequence[str]], Sequence[int]]) -> None:
    """Check that the Lucene index holds the dense index's documents (their docids at evenly spaced positions): the
    reranker, its sidecar and the texts come from the Lucene index."""
    docids = list(dense_searcher.docids or [])
    step = max(1, len(docids) // DOCID_CHECK_SAMPLES)
    sample = docids[::step]
    unknown = [docid for docid, row in zip(sample, rows_for_docids(sample)) if int(row) < 0]
    if unknown:
        raise ValueError(f"the dense index's documents are not the Lucene index's: {len(unknown)} of {len(sample)} "
                         f"docids checked are not in the Lucene index ({_some(unknown)})")


def dense_candidates(dense_searcher, queries: Sequence[str], qids: Sequence[str], depth: int, threads: int,
                     rows_for_docids: Callable[[Sequence[str]], Sequence[int]]) -> dict[str, list[RerankedHit]]:
    """The dense index's top ``depth`` for each query, joined to the Lucene index by docid (as a run's)."""
    found = dense_searcher.batch_search(list(queries), list(qids), k=depth, threads=threads)
    return _joined_by_docid(found, qids, depth, rows_for_docids)


def open_hybrid_searcher(dense_searcher, lucene_searcher):
    """Pyserini's ``HybridSearcher`` over a ``FaissSearcher`` and a ``LuceneSearcher`` (with the BM25 parameters set
    on it)."""
    return import_pyserini("pyserini.search.hybrid").HybridSearcher(dense_searcher, lucene_searcher)


def hybrid_candidates(hybrid_searcher, hybrid: Hybrid, queries: Sequence[str], qids: Sequence[str], depth: int,
                      threads: int,
                      rows_for_docids: Callable[[Sequence[str]], Sequence[int]]) -> dict[str, list[RerankedHit]]:
    """The top ``depth`` of Pyserini's fusion of each query's top ``depth`` BM25 hits and top ``depth`` dense hits
    (``HybridSearcher``'s ``k0`` and ``k`` both ``depth``, as Pyserini's hybrid command fuses ``--hits`` of each into
    ``--hits``), joined to the Lucene index by docid (as a run's). The union of the two lists holds at least
    ``depth`` documents whenever either searcher finds that many.

    Raises:
        ValueError: with ``hybrid.normalization``, a query whose BM25 or dense hits all have the same score (a
            single BM25 hit, say): Pyserini divides by the range of each list's scores.
    """
    fusion = dict(alpha=hybrid.alpha, normalization=hybrid.normalization, weight_on_dense=hybrid.weight_on_dense)
    try:
        found = hybrid_searcher.batch_search(list(queries), list(qids), k0=depth, k=depth, threads=threads, **fusion)
    except ZeroDivisionError as error:
        unnormalisable = [qid for query, qid in zip(queries, qids)
                          if _fails_to_normalise(hybrid_searcher, query, depth, fusion)]
        raise ValueError("Pyserini's hybrid normalization divides by the range of each searcher's scores, and the "
                         f"BM25 or dense hits of {len(unnormalisable)} queries all score the same "
                         f"({_some(unnormalisable)}): fuse these queries without normalization") from error
    return _joined_by_docid(found, qids, depth, rows_for_docids)


def _fails_to_normalise(hybrid_searcher, query: str, depth: int, fusion: dict) -> bool:
    try:
        hybrid_searcher.search(query, k0=depth, k=depth, **fusion)
    except ZeroDivisionError:
        return True
    return False


def _joined_by_docid(found: Mapping[str, Sequence], qids: Sequence[str], depth: int,
                     rows_for_docids: Callable[[Sequence[str]], Sequence[int]]) -> dict[str, list[RerankedHit]]:
    """Pyserini's hits by qid (best first) as candidates joined to the Lucene index by docid, as a run's."""
    run = {qid: [(hit.docid, float(hit.score)) for hit in found.get(qid, [])] for qid in qids}
    return candidates_from_run(run, qids, rows_for_docids, depth, warn=False)


def check_first_stage(name: str) -> str:
    if name not in FIRST_STAGES:
        raise ValueError(f"unknown first stage {name!r}: one of {', '.join(FIRST_STAGES)} (or candidates from a run)")
    return name


def enable_rm3(lucene_searcher, rm3: Rm3) -> None:
    """Make every search of Pyserini's ``lucene_searcher`` BM25 + RM3."""
    try:
        lucene_searcher.set_rm3(rm3.fb_terms, rm3.fb_docs, rm3.original_query_weight)
    except TypeError as error:  # Pyserini's way of saying the index stores no document vectors
        raise ValueError(f"the bm25+rm3 first stage needs an index with document vectors ({error}); rebuild it with "
                         "`python -m pyserini_mores.index`, which stores them (-storeDocvectors)") from error


class UnknownDocidsError(ValueError):
    """Candidates of a run whose docids the index does not hold.

    Attributes: ``docids`` (each unknown docid once, in the order met), ``candidates`` (how many candidates were
    looked up).
    """

    def __init__(self, docids: Sequence[str], candidates: int):
        self.docids, self.candidates = list(docids), candidates
        super().__init__(
            f"{len(self.docids)} of the run's docids are not in the index ({_some(self.docids)}; "
            f"{candidates} candidates looked up): a run of another collection, or of another version of it? "
            "Pass --skip-unknown-docids (skip_unknown_docids=True) to drop them")


def read_candidates(run: Run | str | os.PathLike, run_format: RunFormat | None = None) -> dict[str, list]:
    """qid → ``[(docid, score), ...]`` best first: read from a run file (see
    :func:`~pyserini_mores.formats.read_ranked_run`), or a mapping already in run order."""
    if isinstance(run, (str, os.PathLike)):
        return read_ranked_run(run, run_format=run_format)
    return {str(qid): [(str(docid), float(score)) for docid, score in hits] for qid, hits in run.items()}


def candidates_from_run(run: Run, topics: Iterable[str], rows_for_docids: Callable[[Sequence[str]], Sequence[int]],
                        depth: int | None, *, skip_unknown_docids: bool = False,
                        warn: bool = True) -> dict[str, list[RerankedHit]]:
    """Every topic's candidates from ``run``, as hits joined to the index: qid → the top ``depth`` (all when
    ``None``) of its run, in run order, each with its row (``lucene_docid``) from ``rows_for_docids``. Only those
    are looked up (a deep run costs nothing below ``depth``).

    Topics come in the order of ``topics``; a topic the run has no candidates for gets none. Queries of the run
    without a topic, and topics without candidates, are named in a warning (unless not ``warn``).

    Raises:
        UnknownDocidsError: docids among the candidates that the index does not hold (all of them counted), unless
            ``skip_unknown_docids``, which drops them with a warning: the query's next candidates take their place.
    """
    qids = list(dict.fromkeys(topics))
    if warn:
        _warn_unmatched(run, qids)
    rankings = {qid: list(run.get(qid, ())) for qid in qids}
    candidates: dict[str, list[RerankedHit]] = {qid: [] for qid in qids}
    looked_up = dict.fromkeys(qids, 0)
    unknown: dict[str, None] = {}
    skipped = 0
    pending = qids
    # Rounds of lookups: the top `depth` of each query first; a query that lost candidates to skipped docids looks
    # deeper into its run, so that it has `depth` candidates as if those docids had not been in it.
    while pending:
        wanted = {qid: rankings[qid][looked_up[qid]:looked_up[qid] + _room(candidates[qid], depth, rankings[qid])]
                  for qid in pending}
        docids = [docid for hits in wanted.values() for docid, _ in hits]
        rows = iter([int(row) for row in rows_for_docids(docids)] if docids else [])
        for qid, hits in wanted.items():
            looked_up[qid] += len(hits)
            for docid, score in hits:
                row = next(rows)
                if row >= 0:
                    candidates[qid].append(RerankedHit(docid=docid, score=float(score), lucene_docid=row))
                else:
                    unknown[docid] = None
                    skipped += 1
        if unknown and not skip_unknown_docids:
            raise UnknownDocidsError(list(unknown), sum(looked_up.values()))
        pending = [qid for qid in pending
                   if looked_up[qid] < len(rankings[qid]) and (depth is None or len(candidates[qid]) < depth)]
    if unknown:
        logger.warning("skipped %d candidates whose docids are not in the index (%d distinct: %s)",
                       skipped, len(unknown), _some(list(unknown)))
    return candidates


def _room(hits: list, depth: int | None, ranking: list) -> int:
    return len(ranking) if depth is None else depth - len(hits)


def lucene_rows_for_docids(lucene_searcher, docids: Sequence[str]) -> list[int]:
    """The Lucene internal docid (the row) of each external docid in Pyserini's ``lucene_searcher``'s index, -1 for
    docids it does not hold: one term lookup per docid."""
    from jnius import autoclass  # the JVM is running: the searcher started it

    utils = autoclass("io.anserini.index.IndexReaderUtils")
    reader = lucene_searcher.object.reader
    return [max(-1, int(utils.convertDocidToLuceneDocid(reader, docid))) for docid in docids]


def _warn_unmatched(run: Run, qids: list[str]) -> None:
    wanted = set(qids)
    without_topic = [qid for qid in run if qid not in wanted]
    without_run = [qid for qid in qids if not run.get(qid)]
    if without_topic:
        logger.warning("%d queries of the run have no topic and are not reranked: %s", len(without_topic),
                       _some(without_topic))
    if without_run:
        logger.warning("%d topics have no candidates in the run and get no hits: %s", len(without_run),
                       _some(without_run))


def _some(ids: Sequence[str]) -> str:
    shown = ", ".join(map(str, ids[:SHOWN_IDS]))
    return shown if len(ids) <= SHOWN_IDS else f"{shown}, ... ({len(ids) - SHOWN_IDS} more)"
