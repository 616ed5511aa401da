"""``RerankingSearcher``: a drop-in for Pyserini's ``LuceneSearcher`` that reranks BM25's top ``rerank_depth``."""
from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from .._model_args import format_model_arg
from ..index import ResolvedIndex, fetch_texts, index_identity, open_searcher, resolve_index
from ..rerankers import Reranker, get_reranker
from ..sidecar import default_sidecar_path, open_sidecar
from ..types import Query, RerankedHit, RerankStats, hits_to_texts, texts_to_hits
from .calibration import Calibration, calibrate

logger = logging.getLogger(__name__)


class SidecarMissingError(FileNotFoundError):
    """A reranker that reads a sidecar was asked to run where none has been built."""


class _SearcherBudget:
    """The default of ``time_budget_ms`` arguments: the searcher's own :attr:`RerankingSearcher.time_budget_ms`."""

    def __repr__(self) -> str:
        return "SEARCHER_BUDGET"


SEARCHER_BUDGET = _SearcherBudget()


class RerankingSearcher:
    """BM25 retrieval with Pyserini, then a learned reranker over the top ``rerank_depth`` hits.

    ``search`` and ``batch_search`` have ``LuceneSearcher``'s signatures and return hits (``.docid``, ``.score``,
    ``.lucene_docid``) that Pyserini's run writers accept. Hits below ``rerank_depth`` keep their BM25 order,
    scored below every reranked hit. Every query goes through :meth:`rerank_hits`, which keeps nothing of the
    query on the searcher: one searcher serves several threads at once, and :meth:`search_with_stats` and
    :meth:`batch_search_with_stats` also return what the rerank stage did (:class:`~pyserini_mores.types.RerankStats`).

    Args:
        index: a Lucene index directory or a Pyserini prebuilt index name.
        reranker: a :class:`Reranker`, or a registered name (``bm25``, ``maxsim``, ``mores``, ...); with a name,
            ``reranker_kwargs`` go to its factory (e.g. ``model=``, ``remap_by_docid=``). A reranker whose sidecar
            is already open is refused when that sidecar was built for another index or model.
        k1, b: BM25 parameters (default: Pyserini's for the index).
        rerank_depth: how many BM25 hits are reranked.
        sidecar: for rerankers that read stored document representations: a path, ``"auto"`` (the default
            location beside the index, if built; else documents are encoded from their text, slowly) or ``None``.
        require_sidecar: fail instead of encoding text when the sidecar is missing.
        time_budget_ms: rerank-stage budget per query, in ms (BM25 excluded): each query is reranked to the
            largest depth ``n <= rerank_depth`` whose predicted cost fits (see :mod:`.calibration`); 0 keeps the
            BM25 order; ``None`` or ``inf`` reranks ``rerank_depth`` hits as without a budget. The depth chosen for
            a query is in its :class:`~pyserini_mores.types.RerankStats`.
        calibration: the cost model the budget uses; by default measured on first use and cached
            (:meth:`calibrate`).

    Example:
        >>> searcher = RerankingSearcher("indexes/debian", "maxsim", rerank_depth=100)  # doctest: +SKIP
        >>> hits = searcher.search("visualize ABI changes of a C library", k=10)  # doctest: +SKIP
    """

    def __init__(self, index: str | os.PathLike | ResolvedIndex, reranker: Reranker | str = "bm25", *,
                 k1: float | None = None, b: float | None = None, rerank_depth: int = 1000,
                 sidecar: str | os.PathLike | None = "auto", require_sidecar: bool = False,
                 time_budget_ms: float | None = None, calibration=None, **reranker_kwargs):
        if rerank_depth < 0:
            raise ValueError("rerank_depth must be >= 0")
        if time_budget_ms is not None and not time_budget_ms >= 0:
            raise ValueError(f"time_budget_ms must be >= 0 (or None for no budget), not {time_budget_ms}")
        self.index = index if isinstance(index, ResolvedIndex) else resolve_index(index)
        self.searcher = open_searcher(self.index)
        default_k1, default_b = self.index.default_bm25
        self.k1 = default_k1 if k1 is None else k1
        self.b = default_b if b is None else b
        self.searcher.set_bm25(self.k1, self.b)
        self.rerank_depth = rerank_depth
        self.time_budget_ms = time_budget_ms
        self.calibration: Calibration | None = calibration
        self._calibrating = threading.Lock()  # one measurement when several threads meet an uncalibrated budget
        self.reranker = get_reranker(reranker, **reranker_kwargs) if isinstance(reranker, str) else reranker
        self.sidecar_path: Path | None = None
        if hasattr(getattr(self.reranker, "sidecar", None), "check_built_for"):
            self._check_attached_sidecar()
        elif getattr(self.reranker, "model", None) is not None and self.reranker.model.store_width is not None \
                and getattr(self.reranker, "sidecar", None) is None and sidecar is not None:
            self.attach_sidecar(sidecar, require_sidecar)

    def attach_sidecar(self, sidecar: str | os.PathLike = "auto", required: bool = False) -> None:
        """Open the reranker's sidecar (``"auto"``: the default location beside the index) and check that it was
        built for this model and this index. A missing sidecar raises :class:`SidecarMissingError` (with the build
        command) when ``required`` or explicitly given, else documents are encoded from text."""
        model = self.reranker.model
        path = default_sidecar_path(self.index.path, self.reranker.name, model) if sidecar == "auto" else Path(sidecar)
        if not path.exists():
            if required or sidecar != "auto":
                raise SidecarMissingError(
                    f"no sidecar at {path}. Build it with:\n  {sidecar_build_command(self, path)}"
                )
            logger.warning("no sidecar at %s: documents will be encoded from their text (slow)", path)
            return
        self.reranker.sidecar = open_sidecar(path, expect_model_fingerprint=model.store_fingerprint(),
                                             expect_index=index_identity(self.searcher))
        self.sidecar_path = path

    def _check_attached_sidecar(self) -> None:
        """A reranker that arrives with its sidecar open (``get_reranker(..., sidecar=...)``, or set by hand) gets the
        checks :meth:`attach_sidecar` makes: built by its model, for this index (rows are Lucene docids)."""
        reader = self.reranker.sidecar
        model = getattr(self.reranker, "model", None)
        fingerprint = model.store_fingerprint() if model is not None and model.store_width is not None else None
        reader.check_built_for(model_fingerprint=fingerprint, index=index_identity(self.searcher))
        self.sidecar_path = Path(reader.path)

    @property
    def num_docs(self) -> int:
        return self.searcher.num_docs

    def search(self, q: str, k: int = 10) -> list[RerankedHit]:
        """The top ``k`` hits for query text ``q``. A query without BM25 terms (blank, or stopwords only) gets no
        hits, as from ``LuceneSearcher``, and the reranker is not called."""
        return self.search_with_stats(q, k)[0]

    def search_with_stats(self, q: str, k: int = 10) -> tuple[list[RerankedHit], RerankStats]:
        """:meth:`search`, and what its rerank stage did."""
        ranked, stats = self.rerank_hits(q, self.searcher.search(q, k=self.candidate_depth(k)))
        return ranked[:k], stats

    def batch_search(self, queries: Sequence[str], qids: Sequence[str], k: int = 10,
                     threads: int = 1) -> dict[str, list[RerankedHit]]:
        """``{qid: top-k hits}``, in the order of ``qids``: BM25 on ``threads`` threads, then the queries reranked on
        ``threads`` threads (each query's candidates in large batches). The hits do not depend on ``threads``."""
        return {qid: ranked for qid, (ranked, _) in self.batch_search_with_stats(queries, qids, k, threads).items()}

    def batch_search_with_stats(self, queries: Sequence[str], qids: Sequence[str], k: int = 10,
                                threads: int = 1) -> dict[str, tuple[list[RerankedHit], RerankStats]]:
        """:meth:`batch_search`, with what the rerank stage did for each query."""
        if len(queries) != len(qids):
            raise ValueError(f"{len(queries)} queries but {len(qids)} qids")
        candidates = self.first_stage(queries, qids, k, threads)

        def search_one(query: str, qid: str) -> tuple[list[RerankedHit], RerankStats]:
            ranked, stats = self.rerank_hits(query, candidates.get(qid, []))
            return ranked[:k], stats

        if threads <= 1 or len(qids) <= 1:
            results = list(map(search_one, queries, qids))
        else:
            # A budget without a cost model is calibrated on first use: here, once, rather than in a worker.
            self.depth_for(self.rerank_depth)
            with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rerank") as pool:
                results = list(pool.map(_leaving_the_jvm(search_one), queries, qids))
        return dict(zip(qids, results))

    def first_stage(self, queries: Sequence[str], qids: Sequence[str], k: int = 10,
                    threads: int = 1) -> dict[str, list]:
        """BM25's candidates for each query: the top ``max(k, rerank_depth)`` (:meth:`candidate_depth`) Pyserini
        hits, by qid; a query without hits may be absent. For callers that rerank them with :meth:`rerank_hits`."""
        return self.searcher.batch_search(list(queries), list(qids), k=self.candidate_depth(k), threads=threads)

    def candidate_depth(self, k: int) -> int:
        """BM25 hits retrieved for a top-``k`` search: enough for the rerank depth and for ``k``."""
        return max(k, self.rerank_depth)

    def rerank_hits(self, query: str, hits: Iterable, *,
                    time_budget_ms: float | None | _SearcherBudget = SEARCHER_BUDGET
                    ) -> tuple[list[RerankedHit], RerankStats]:
        """Rerank first-stage ``hits`` (Pyserini hits or :class:`RerankedHit` objects, best first) for ``query``.

        The top :meth:`depth_for` hits are reranked; the others keep their order, scored below every reranked hit.
        Returns every hit as a new :class:`RerankedHit` (``hits`` are not modified), and what the rerank stage
        did. Nothing of the query is kept on the searcher, so threads may call this at once.

        Args:
            time_budget_ms: the budget for this query (as the constructor's); default: :attr:`time_budget_ms`.
        """
        hits = list(hits)
        depth = self.depth_for(len(hits), time_budget_ms)
        head, tail = hits[:depth], hits[depth:]
        started = time.perf_counter()
        reranked = self.rerank_candidates(query, head)
        # With nothing to rerank the rerank stage does not run: 0 ms, not the cost of a function call.
        rerank_ms = (time.perf_counter() - started) * 1000 if head else 0.0
        ranked = reranked + _below(reranked, texts_to_hits(hits_to_texts(tail)), start_rank=depth + 1)
        return ranked, RerankStats(candidates=len(hits), depth=depth, rerank_ms=rerank_ms)

    def rerank_candidates(self, query: str, hits: Sequence) -> list[RerankedHit]:
        """Every one of ``hits`` reranked, best first: the rerank stage a time budget pays for (text fetch when the
        reranker needs text, query encoding, sidecar reads, scoring, sorting), and what the calibration times."""
        if not hits:
            return []
        texts = fetch_texts(self.searcher, [hit.docid for hit in hits]) if self.reranker.needs_text else None
        return texts_to_hits(self.reranker.rerank(Query(query), hits_to_texts(hits, texts)))

    def calibrate(self, recalibrate: bool = False, **options) -> Calibration:
        """The reranker's cost model on this machine (from the cache, else measured); ``options`` go to
        :func:`.calibration.calibrate`. Kept in :attr:`calibration`."""
        self.calibration = calibrate(self, recalibrate=recalibrate, **options)
        return self.calibration

    def depth_for(self, num_hits: int, time_budget_ms: float | None | _SearcherBudget = SEARCHER_BUDGET) -> int:
        """How many of ``num_hits`` BM25 hits are reranked under ``time_budget_ms`` (default: the searcher's
        :attr:`time_budget_ms`). A finite positive budget calibrates the searcher on first use."""
        budget = self.time_budget_ms if time_budget_ms is SEARCHER_BUDGET else time_budget_ms
        if budget is None or math.isinf(budget) or self.rerank_depth == 0:
            return min(self.rerank_depth, num_hits)
        if not budget >= 0:
            raise ValueError(f"time_budget_ms must be >= 0 (or None for no budget), not {budget}")
        depth = 0 if budget == 0 else self._cost_model().depth_for_budget(budget, self.rerank_depth)
        return min(depth, num_hits)

    def _cost_model(self) -> Calibration:
        with self._calibrating:
            if self.calibration is None:
                self.calibrate()
            return self.calibration

    def close(self) -> None:
        self.reranker.close()
        self.searcher.close()


_Result = TypeVar("_Result")


def _leaving_the_jvm(function: Callable[..., _Result]) -> Callable[..., _Result]:
    """``function`` for a pool thread, which detaches from the JVM afterwards: a thread that calls into Java (a
    text fetch does) is attached to the JVM, and one that ends attached stays registered there for good."""

    @functools.wraps(function)
    def run(*args):
        try:
            return function(*args)
        finally:
            from jnius import detach  # the JVM is running: the searcher started it

            detach()

    return run


def _below(head: list[RerankedHit], tail: list[RerankedHit], start_rank: int) -> list[RerankedHit]:
    """Re-score ``tail`` (in its BM25 order) strictly below every ``head`` score, since run evaluators sort by
    score, not by rank."""
    if not head or not tail:
        return tail
    floor = min(hit.score for hit in head) - 1.0
    for offset, hit in enumerate(tail):
        hit.score = floor - offset
        hit.first_stage_rank = start_rank + offset
    return tail


def sidecar_build_command(searcher: RerankingSearcher, output: Path) -> str:
    return build_command_for(searcher.index.prebuilt_name or searcher.index.path, searcher.reranker.name,
                             searcher.reranker.model, output)


def build_command_for(index, reranker: str, model, output: Path | None = None) -> str:
    """The ``sidecar build`` command that writes ``model``'s sidecar: the model as it was loaded (its source and
    overrides, printed so that ``--model-arg`` reads them back), and ``--output`` when not the default place."""
    parts = ["python -m pyserini_mores.sidecar build", f"--index {index}", f"--reranker {reranker}",
             f"--model {getattr(model, 'source', None) or model.config.backbone}"]
    parts += [f"--model-arg {format_model_arg(key, value)}"
              for key, value in getattr(model, "source_overrides", {}).items()]
    if output is not None:
        parts.append(f"--output {output}")
    return " ".join(parts)
