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

from .._jvm import import_pyserini
from .._model_args import format_model_arg
from ..formats import RunFormat
from ..index import ResolvedIndex, fetch_texts, index_identity, open_searcher, resolve_index
from ..models.loading import shipped_model_path
from ..rerankers import Reranker, get_reranker
from ..rerankers.learned import check_windows_before_loading
from ..rerankers.options import RerankerOptions
from ..rerankers.pacing import BatchPace, QueryPace
from ..sidecar import SidecarContentMismatchError, default_sidecar_path, open_sidecar
from ..types import (
    Query,
    RerankedHit,
    RerankStats,
    check_unique_docids,
    first_stage_hits,
    hits_to_texts,
    texts_to_hits,
)
from .calibration import PROBE_INTERVAL, Calibration, CostRefit, calibrate, save_calibration
from .first_stage import (
    Dense,
    Hybrid,
    Rm3,
    Run,
    candidates_from_run,
    check_dense_docids,
    dense_candidates,
    enable_rm3,
    hybrid_candidates,
    lucene_rows_for_docids,
    open_dense_searcher,
    open_hybrid_searcher,
    read_candidates,
)
from .fusion import interpolate
from .options import FirstStageOptions, RerankStageOptions

logger = logging.getLogger(__name__)


class SidecarMissingError(FileNotFoundError):
    """A reranker that reads a sidecar was asked to run where none has been built."""


class _SearcherBudget:
    """The default of ``time_budget_ms`` arguments: the searcher's own :attr:`RerankingSearcher.time_budget_ms`."""

    def __repr__(self) -> str:
        return "SEARCHER_BUDGET"


SEARCHER_BUDGET = _SearcherBudget()


class RerankingSearcher:
    """A first stage (BM25 with Pyserini, BM25 + RM3, a Pyserini dense index, its hybrid with BM25, or a run:
    :meth:`rerank_run`), then a learned reranker over the top ``rerank_depth`` hits.

    A drop-in for ``LuceneSearcher``: ``search`` and ``batch_search`` have its signatures and return hits with its
    attributes (``.docid``, ``.score``, ``.lucene_docid``, ``.lucene_document``, and ``.raw``, ``.contents``) that
    Pyserini's run writers accept; its other methods (``doc``, ``batch_doc``, ``doc_by_field``, ``set_bm25``,
    ``set_qld``, ``set_rm3``, ``set_rocchio``, ``get_feedback_terms``, ``get_similarity``, ``num_docs``, ...) are the
    first stage's Lucene searcher's, and those that change its scoring change the candidates reranked.

    Hits below ``rerank_depth`` keep their BM25 order, scored below every reranked hit. Every query goes through
    :meth:`rerank_hits`, which keeps nothing of the query on the searcher: one searcher serves several threads at
    once, and :meth:`search_with_stats` and :meth:`batch_search_with_stats` also return what the rerank stage did
    (:class:`~pyserini_mores.types.RerankStats`).

    Args:
        index: a Lucene index directory or a Pyserini prebuilt index name.
        reranker: a :class:`Reranker`, a registered name (``bm25``, ``maxsim``, ``mores``, ...) or its
            :class:`~pyserini_mores.rerankers.options.RerankerOptions`; with a name, ``reranker_kwargs`` go to its
            factory (e.g. ``model=``, ``precision=``, ``device="cuda"``, ``remap_by_docid=``, config keys), checked
            before anything loads. A reranker whose sidecar is already open is refused when that sidecar was built for
            another index or model.
        k1, b: BM25 parameters (default: Pyserini's for the index).
        first_stage: a :class:`~.options.FirstStageOptions` (then without ``k1``, ``b``, ``rm3``, ``dense``,
            ``hybrid``), or its kind: ``"bm25"``; ``"bm25+rm3"``: BM25 with RM3 feedback through Pyserini's
            ``set_rm3`` (the index must store document vectors, as the package's indexer does), with ``rm3``'s
            parameters; ``"dense"``: the candidates of ``dense``, a Pyserini dense index searched with Pyserini's
            ``FaissSearcher``, joined to this Lucene index by docid (it must hold the dense index's documents:
            checked on a sample when opened); ``"hybrid"``: Pyserini's ``HybridSearcher`` over this index's BM25
            (``k1``, ``b``) and ``dense``, its fused candidates joined by docid in the same way. Each query's top
            :meth:`candidate_depth` of the fusion come from the top :meth:`candidate_depth` of each searcher. To
            rerank any other first stage's candidates, pass its run to :meth:`rerank_run`.
        rm3: RM3's ``fb_terms``, ``fb_docs`` and ``original_query_weight`` (default: Pyserini's).
        dense: with ``first_stage="dense"`` or ``"hybrid"``, the dense index and its query encoder
            (:class:`~.first_stage.Dense`).
        hybrid: with ``first_stage="hybrid"``, the fusion's ``alpha``, ``normalization`` and ``weight_on_dense``
            (:class:`~.first_stage.Hybrid`; default: Pyserini's).
        rerank_depth: how many BM25 hits are reranked.
        sidecar: for rerankers that read stored document representations: a path, ``"auto"`` (the default
            location beside the index) or ``None`` (documents encoded from their text, slowly). A missing sidecar
            raises :class:`SidecarMissingError`, with the command that builds it.
        encode_from_text: where the ``"auto"`` sidecar is missing, encode documents from their text instead.
        require_sidecar: ``False`` is ``encode_from_text=True``; ``True`` (refusing) is the default.
        time_budget_ms: rerank-stage budget per query, in ms (BM25 excluded): each query is reranked to the
            largest depth ``n <= rerank_depth`` whose predicted cost fits (see :mod:`.calibration`); 0 keeps the
            BM25 order; ``None`` or ``inf`` reranks ``rerank_depth`` hits as without a budget. The depth chosen for
            a query is in its :class:`~pyserini_mores.types.RerankStats`.
        calibration: the cost model the budget uses; by default measured on first use and cached
            (:meth:`calibrate`).
        enforce_deadline: under a finite budget, also stop scoring at the budget's deadline (see
            :meth:`rerank_hits`), so that queries slower than predicted (a cold page cache, a busy machine) keep
            within it, and follow the rerank times observed: a cost model measured by :meth:`calibrate` is refitted
            (and saved) when they drift from it (:class:`~.calibration.CostRefit`). ``False``: the depth from the
            cost model only, so runs do not depend on timing (the same on any number of threads, run after run).
        interpolate: ``alpha`` in [0, 1] — the reranked hits' scores become ``alpha`` × the reranker's plus
            ``1 − alpha`` × the first stage's, each min–max normalised per query (:mod:`.fusion`); ``None`` (the
            default): the reranker's scores alone.

    Example:
        >>> searcher = RerankingSearcher("indexes/debian", "maxsim", rerank_depth=100)  # doctest: +SKIP
        >>> hits = searcher.search("visualize ABI changes of a C library", k=10)  # doctest: +SKIP
    """

    def __init__(self, index: str | os.PathLike | ResolvedIndex,
                 reranker: Reranker | RerankerOptions | str = "bm25", *,
                 k1: float | None = None, b: float | None = None, first_stage: str | FirstStageOptions = "bm25",
                 rm3: Rm3 | None = None, dense: Dense | None = None, hybrid: Hybrid | None = None,
                 rerank_depth: int = 1000,
                 sidecar: str | os.PathLike | None = "auto", require_sidecar: bool | None = None,
                 encode_from_text: bool = False,
                 time_budget_ms: float | None = None, calibration=None, enforce_deadline: bool = True,
                 interpolate: float | None = None, **reranker_kwargs):
        # Every option is checked before the index, the JVM or a model loads.
        if isinstance(first_stage, FirstStageOptions):
            if any(value is not None for value in (k1, b, rm3, dense, hybrid)):
                raise TypeError("k1, b, rm3, dense and hybrid are part of the FirstStageOptions given as first_stage")
            first_stage_options = first_stage
        else:
            first_stage_options = FirstStageOptions(first_stage, k1=k1, b=b, rm3=rm3, dense=dense, hybrid=hybrid)
        if require_sidecar is False:  # the former way to ask for text encoding where the sidecar is missing
            encode_from_text = True
        stage = RerankStageOptions(rerank_depth=rerank_depth, time_budget_ms=time_budget_ms,
                                   enforce_deadline=enforce_deadline, interpolate=interpolate, sidecar=sidecar,
                                   encode_from_text=encode_from_text)
        reranker_options = None
        if isinstance(reranker, RerankerOptions):
            if reranker_kwargs:
                raise TypeError(f"{', '.join(sorted(reranker_kwargs))}: part of the RerankerOptions given as reranker")
            reranker_options = reranker.resolved()
        elif isinstance(reranker, str):
            reranker_options = RerankerOptions.from_kwargs(reranker, **reranker_kwargs).resolved()
        elif reranker_kwargs:
            raise TypeError(f"{', '.join(sorted(reranker_kwargs))}: options of a reranker built by name, not of the "
                            "Reranker given")
        if reranker_options is not None and stage.sidecar not in (None, "auto"):
            # a sidecar named here stores its windows: other windows are refused before the model loads
            check_windows_before_loading(stage.sidecar, reranker_options.windows)
        self.first_stage_options, self.stage_options = first_stage_options, stage

        self.index = index if isinstance(index, ResolvedIndex) else resolve_index(index)
        self.searcher = open_searcher(self.index)
        default_k1, default_b = self.index.default_bm25
        self.k1 = default_k1 if first_stage_options.k1 is None else first_stage_options.k1
        self.b = default_b if first_stage_options.b is None else first_stage_options.b
        self.searcher.set_bm25(self.k1, self.b)
        self.first_stage_name = first_stage_options.kind
        self.rm3 = first_stage_options.rm3
        if self.rm3 is not None:
            enable_rm3(self.searcher, self.rm3)
        self.dense = first_stage_options.dense
        self.dense_searcher = open_dense_searcher(self.dense) if self.dense is not None else None
        self.hybrid = first_stage_options.hybrid
        self.hybrid_searcher = open_hybrid_searcher(self.dense_searcher, self.searcher) if self.hybrid else None
        self.rerank_depth = stage.rerank_depth
        self.time_budget_ms = stage.time_budget_ms
        self.enforce_deadline = stage.enforce_deadline
        self.interpolate = stage.interpolate
        self.calibration: Calibration | None = calibration
        self._calibrating = threading.Lock()  # one measurement when several threads meet an uncalibrated budget
        self._drift: CostRefit | None = None  # set by calibrate(): a cost model handed in is the caller's to keep
        self._pace = BatchPace()  # the times of recent scoring batches under a deadline, which pace the next ones
        self._calibration_cache: str | os.PathLike | None = None
        self._warned_depth_zero: set[float] = set()
        self._unreranked = 0  # budgeted queries whose depth was 0: one in PROBE_INTERVAL reranks one candidate
        self._refits = 0  # how often this searcher refitted its cost model (the first is a warning)
        self.reranker = reranker if reranker_options is None else \
            get_reranker(reranker_options.name, **reranker_options.factory_kwargs())
        self.sidecar_path: Path | None = None
        if hasattr(getattr(self.reranker, "sidecar", None), "check_built_for"):
            self._check_attached_sidecar()
        elif getattr(self.reranker, "model", None) is not None and self.reranker.model.store_width is not None \
                and getattr(self.reranker, "sidecar", None) is None and stage.sidecar is not None:
            self.attach_sidecar(stage.sidecar, required=not stage.encode_from_text)
        if self.dense_searcher is not None:
            check_dense_docids(self.dense_searcher, self.rows_for_docids)

    def attach_sidecar(self, sidecar: str | os.PathLike = "auto", required: bool = False) -> None:
        """Open the reranker's sidecar (``"auto"``: the default location beside the index) and check that it was
        built for this model and this index. A missing sidecar raises :class:`SidecarMissingError` (with the build
        command) when ``required`` or explicitly given, else documents are encoded from text."""
        model = self.reranker.model
        path = default_sidecar_path(self.index.path, self.reranker.name, model) if sidecar == "auto" else Path(sidecar)
        if not path.exists():
            if required or sidecar != "auto":
                raise SidecarMissingError(missing_sidecar_message(path, sidecar_build_command(self, path)))
            logger.warning("no sidecar at %s: documents will be encoded from their text (slow)", path)
            return
        try:
            self.reranker.sidecar = open_sidecar(path, expect_model_fingerprint=model.store_fingerprint(),
                                                 expect_index=index_identity(self.searcher))
        except SidecarContentMismatchError as error:
            raise self._stale_sidecar_error(error, path) from None
        self.sidecar_path = path

    def _stale_sidecar_error(self, error: SidecarContentMismatchError, path: Path) -> SidecarContentMismatchError:
        """``error`` with the exact command that rebuilds the sidecar at ``path`` for this index and model."""
        command = f"{sidecar_build_command(self, path)} --overwrite"
        return SidecarContentMismatchError(error.summary, f"rebuild it: `{command}`", changed=error.changed,
                                           examples=error.examples)

    def _check_attached_sidecar(self) -> None:
        """A reranker that arrives with its sidecar open (``get_reranker(..., sidecar=...)``, or set by hand) gets the
        checks :meth:`attach_sidecar` makes: built by its model, for this index (rows are Lucene docids)."""
        reader = self.reranker.sidecar
        model = getattr(self.reranker, "model", None)
        fingerprint = model.store_fingerprint() if model is not None and model.store_width is not None else None
        try:
            reader.check_built_for(model_fingerprint=fingerprint, index=index_identity(self.searcher))
        except SidecarContentMismatchError as error:
            raise self._stale_sidecar_error(error, Path(reader.path)) from None
        self.sidecar_path = Path(reader.path)

    @property
    def num_docs(self) -> int:
        return self.searcher.num_docs

    def search(self, q: str, k: int = 10, query_generator=None, fields: dict | None = None,
               strip_segment_id: bool = False, remove_dups: bool = False) -> list[RerankedHit]:
        """The top ``k`` hits for query text ``q``. A query without BM25 terms (blank, or stopwords only) gets no
        hits, as from ``LuceneSearcher``, and the reranker is not called.

        ``query_generator``, ``fields``, ``strip_segment_id`` and ``remove_dups`` go to the first stage's
        ``LuceneSearcher.search`` (BM25 first stages only); the reranker reads the query text ``q``."""
        return self.search_with_stats(q, k, query_generator=query_generator, fields=fields,
                                      strip_segment_id=strip_segment_id, remove_dups=remove_dups)[0]

    def search_with_stats(self, q: str, k: int = 10, query_generator=None, fields: dict | None = None,
                          strip_segment_id: bool = False, remove_dups: bool = False
                          ) -> tuple[list[RerankedHit], RerankStats]:
        """:meth:`search`, and what its rerank stage did."""
        _check_query_text(q)
        if self.dense_searcher is not None:
            self._refuse_lucene_options(query_generator, fields, strip_segment_id, remove_dups)
            candidates = self.first_stage([q], ["q"], k)["q"]
        else:
            candidates = self._lucene_search([q], ["q"], self.candidate_depth(k), query_generator=query_generator,
                                             fields=fields or {}, strip_segment_id=strip_segment_id,
                                             remove_dups=remove_dups)["q"]
        ranked, stats = self.rerank_hits(q, candidates)
        return ranked[:k], stats

    def batch_search(self, queries: Sequence[str], qids: Sequence[str], k: int = 10, threads: int = 1,
                     query_generator=None, fields: dict | None = None) -> dict[str, list[RerankedHit]]:
        """``{qid: top-k hits}``, in the order of ``qids``: BM25 on ``threads`` threads, then the queries reranked on
        ``threads`` threads (each query's candidates in large batches). The hits do not depend on ``threads``.
        ``query_generator`` and ``fields`` go to the first stage's ``LuceneSearcher.batch_search``."""
        return {qid: ranked for qid, (ranked, _) in self.batch_search_with_stats(
            queries, qids, k, threads, query_generator=query_generator, fields=fields).items()}

    def batch_search_with_stats(self, queries: Sequence[str], qids: Sequence[str], k: int = 10,
                                threads: int = 1, query_generator=None, fields: dict | None = None
                                ) -> dict[str, tuple[list[RerankedHit], RerankStats]]:
        """:meth:`batch_search`, with what the rerank stage did for each query."""
        if len(queries) != len(qids):
            raise ValueError(f"{len(queries)} queries but {len(qids)} qids")
        for query in queries:
            _check_query_text(query)
        candidates = self.first_stage(queries, qids, k, threads, query_generator=query_generator, fields=fields)

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
                    threads: int = 1, query_generator=None, fields: dict | None = None) -> dict[str, list]:
        """The first stage's (BM25's, BM25 + RM3's, the dense index's or the hybrid's) candidates for each query: the
        top ``max(k, rerank_depth)`` (:meth:`candidate_depth`) Pyserini hits, by qid; a query without hits may be
        absent. For callers that rerank them with :meth:`rerank_hits`. ``query_generator`` and ``fields`` are
        ``LuceneSearcher.batch_search``'s (BM25 first stages only)."""
        if self.dense_searcher is not None:
            self._refuse_lucene_options(query_generator, fields)
        if self.hybrid_searcher is not None:
            return hybrid_candidates(self.hybrid_searcher, self.hybrid, queries, qids, self.candidate_depth(k),
                                     threads, self.rows_for_docids)
        if self.dense_searcher is not None:
            return dense_candidates(self.dense_searcher, queries, qids, self.candidate_depth(k), threads,
                                    self.rows_for_docids)
        return self._lucene_search(queries, qids, self.candidate_depth(k), threads,
                                   query_generator=query_generator, fields=fields or {})

    def _lucene_search(self, queries: Sequence[str], qids: Sequence[str], depth: int, threads: int = 1, *,
                       query_generator=None, fields: dict | None = None, **search_options) -> dict[str, list]:
        """Pyserini's search (one query; ``search_options`` are ``LuceneSearcher.search``'s
        ``strip_segment_id`` and ``remove_dups``) or batch search, a query Lucene refuses (more distinct terms than
        its clause limit) named."""
        options = dict(query_generator=query_generator, fields=fields or {})
        try:
            if len(queries) == 1:  # Lucene's own exception; a batch's says only that a task failed
                return {qids[0]: self.searcher.search(queries[0], k=depth, **options, **search_options)}
            return self.searcher.batch_search(list(queries), list(qids), k=depth, threads=threads, **options)
        except Exception as error:
            if type(error).__name__ != "JavaException":  # Java exceptions arrive as jnius.JavaException
                raise
            raise lucene_refusal(self.searcher, queries, qids, error) from None

    def rerank_run(self, run: Run | str | os.PathLike, topics: dict[str, str], k: int = 10, *,
                   run_format: RunFormat | None = None,
                   skip_unknown_docids: bool = False) -> dict[str, list[RerankedHit]]:
        """Rerank another first stage's candidates: ``{qid: top-k hits}`` for every topic (qid → text), in the
        topics' order, from ``run``, instead of BM25's.

        Each query's top :meth:`candidate_depth` candidates of the run are its first stage (see
        :meth:`run_first_stage`): the top :meth:`depth_for` of them are reranked, the others keep the run's order
        below them, as BM25's hits in :meth:`search`.

        Args:
            run: a run file (TREC or MS MARCO, see ``run_format``; its line order does not matter), or
                ``{qid: [(docid, score), ...]}`` in run order, best first.
            skip_unknown_docids: drop candidates the index does not hold instead of raising.
        """
        candidates = self.run_first_stage(run, topics, k, run_format=run_format,
                                          skip_unknown_docids=skip_unknown_docids)
        return {qid: self.rerank_hits(topics[qid], hits)[0][:k] for qid, hits in candidates.items()}

    def run_first_stage(self, run: Run | str | os.PathLike, topics: Iterable[str], k: int = 10, *,
                        run_format: RunFormat | None = None,
                        skip_unknown_docids: bool = False) -> dict[str, list[RerankedHit]]:
        """:meth:`first_stage` for candidates from a run: ``{qid: hits}`` for every qid of ``topics`` (``[]`` for
        those the run lacks; the run's queries without a topic, and these, are named in a warning), each query's
        top ``max(k, rerank_depth)`` candidates joined to the index by docid (:meth:`rows_for_docids`).

        Raises:
            UnknownDocidsError: docids of those candidates the index does not hold, unless ``skip_unknown_docids``.
        """
        return candidates_from_run(read_candidates(run, run_format), topics, self.rows_for_docids,
                                   self.candidate_depth(k), skip_unknown_docids=skip_unknown_docids)

    def rows_for_docids(self, docids: Sequence[str]) -> Sequence[int]:
        """The rows (Lucene internal docids) of external docids, -1 for those the index does not
        hold: from the sidecar's sorted docids when the reranker has one (built for this index: checked), else from
        Lucene."""
        sidecar = getattr(self.reranker, "sidecar", None)
        if hasattr(sidecar, "rows_for_docids"):
            return sidecar.rows_for_docids(docids)
        return lucene_rows_for_docids(self.searcher, docids)

    def candidate_depth(self, k: int) -> int:
        """BM25 hits retrieved for a top-``k`` search: enough for the rerank depth and for ``k``."""
        return max(k, self.rerank_depth)

    def rerank_hits(self, query: str, hits: Iterable, *,
                    time_budget_ms: float | None | _SearcherBudget = SEARCHER_BUDGET
                    ) -> tuple[list[RerankedHit], RerankStats]:
        """Rerank first-stage ``hits`` (Pyserini hits or :class:`RerankedHit` objects, best first) for ``query``.

        The top :meth:`depth_for` hits are reranked; the others keep their order, scored below every reranked hit.
        Under a finite time budget the rerank stage also has a deadline, the budget after it starts: candidates are
        scored in batches in first-stage order, and no batch is started that is predicted to end after it (see
        :meth:`rerank_candidates`); those not scored in time keep their first-stage order below the scored ones
        (unless :attr:`enforce_deadline` is off).
        Returns every hit as a new :class:`RerankedHit` (``hits`` are not modified), and what the rerank stage
        did. Nothing of the query is kept on the searcher, so threads may call this at once.

        Raises:
            CandidateError: two hits with the same docid.

        Args:
            time_budget_ms: the budget for this query (as the constructor's); default: :attr:`time_budget_ms`.
        """
        hits = list(hits)
        check_unique_docids(hit.docid for hit in hits)
        depth = self.depth_for(len(hits), time_budget_ms)
        budget = self.time_budget_ms if time_budget_ms is SEARCHER_BUDGET else time_budget_ms
        probe = depth == 0 and bool(hits) and self._probe_due(budget)
        if probe:
            depth = 1
        head = hits[:depth]
        started = time.perf_counter()
        deadline, pace = None, None
        if head and self.enforce_deadline and budget is not None and math.isfinite(budget):
            # A probe scores its candidate whatever the pace predicts: timing it is its purpose.
            deadline = math.inf if probe else time.monotonic() + budget / 1000
            pace = self._pace.query()
        reranked = self.rerank_candidates(query, head, deadline=deadline, pace=pace)
        # With nothing to rerank the rerank stage does not run: 0 ms, not the cost of a function call.
        rerank_ms = (time.perf_counter() - started) * 1000 if head else 0.0
        scored = len(reranked)
        if deadline is not None:
            # A reranker that does not pace its batches (no rerank_until) leaves its time unsplit.
            self._observe_cost(scored, rerank_ms, pace.seconds * 1000 if pace.batches or not scored else None,
                               conclusive=probe and scored > 0 and rerank_ms <= budget)
        ranked = reranked + _below(reranked, first_stage_hits(hits[scored:]), start_rank=scored + 1)
        for hit in ranked:  # read from the index if asked for, as LuceneSearcher's hits carry it
            hit.attach_document(reader=self._lucene_document)
        return ranked, RerankStats(candidates=len(hits), depth=depth, rerank_ms=rerank_ms, scored=scored,
                                   deadline_cut=scored < depth)

    def rerank_candidates(self, query: str, hits: Sequence, *, deadline: float | None = None,
                          pace: QueryPace | None = None) -> list[RerankedHit]:
        """Every one of ``hits`` reranked, best first: the rerank stage a time budget pays for (text fetch when the
        reranker needs text, query encoding, sidecar reads, scoring, sorting), and what the calibration times.

        With a ``deadline`` (a :func:`time.monotonic` time), a reranker that can stop between batches
        (``rerank_until``) scores ``hits`` in their order until no further batch is predicted to fit, from the
        time recent batches took (``pace``'s; before the first: the calibration's cost per candidate), and records
        its batches in ``pace``; only the first ``len(result)`` of ``hits``, those scored in time, are returned.
        Other rerankers score every hit.
        """
        if not hits:
            return []
        texts = fetch_texts(self.searcher, [hit.docid for hit in hits]) if self.reranker.needs_text else \
            [None] * len(hits)
        candidates = hits_to_texts(hits, texts=texts)
        rerank_until = getattr(self.reranker, "rerank_until", None)
        if deadline is None or rerank_until is None:
            ranked = self.reranker.rerank(Query(query), candidates)
        else:
            per_candidate_ms = self.calibration.per_candidate_ms if self.calibration is not None else None
            ranked = rerank_until(Query(query), candidates, deadline, per_candidate_ms=per_candidate_ms,
                                  pace=pace if pace is not None else self._pace.query())
        if self.interpolate is not None:
            ranked = interpolate(ranked, self.interpolate)
        return texts_to_hits(ranked)

    def calibrate(self, recalibrate: bool = False, **options) -> Calibration:
        """The reranker's cost model on this machine (from the cache, else measured); ``options`` go to
        :func:`.calibration.calibrate`. Kept in :attr:`calibration`, and from now on refitted (and saved in the
        cache) when budgeted queries observe times that drift from it (see ``enforce_deadline``)."""
        self.calibration = calibrate(self, recalibrate=recalibrate, **options)
        self._drift, self._calibration_cache = CostRefit(), options.get("cache_dir")
        return self.calibration

    def _probe_due(self, budget: float | None) -> bool:
        """Whether this query, whose depth under ``budget`` is 0, is the one in
        :data:`~.calibration.PROBE_INTERVAL` that reranks one candidate to time it: a query that reranks nothing
        observes nothing, so without probes a cost model that says nothing fits could never learn that one candidate
        does. Only under a finite positive budget, with the deadline on and a cost model that refits (measured by
        :meth:`calibrate`)."""
        if budget is None or not 0 < budget < math.inf or not self.enforce_deadline or self._drift is None:
            return False
        with self._calibrating:
            self._unreranked += 1
            return self._unreranked % PROBE_INTERVAL == 0

    def _observe_cost(self, scored: int, rerank_ms: float, batch_ms: float | None, *,
                      conclusive: bool = False) -> None:
        """Count a budgeted query's rerank time (``batch_ms`` of it in scoring batches, ``None`` when not timed
        apart) against the cost model; refit and save the model when the times have drifted from it
        (:class:`~.calibration.CostRefit`), or at once when ``conclusive`` (a probe that fitted a budget the model
        said it could not)."""
        if self._drift is None or self.calibration is None:
            return
        with self._calibrating:
            refit = self._drift.observe(self.calibration, scored, rerank_ms, batch_ms, conclusive=conclusive)
            if refit is None:
                return
            before = self.calibration.describe()
            self.calibration, ratio = refit
            path = save_calibration(self.calibration, self._calibration_cache)
            self._refits += 1
        # The first refit tells the user the machine is not as fast as when it was measured; under a load that
        # keeps changing, the later ones would repeat that every few queries, so they are logged at INFO (-v).
        log = logger.warning if self._refits == 1 else logger.info
        log("rerank times of %s are %.2fx what its cost model predicts (%s) over the last queries: the model is now "
            "%s, saved to %s (--recalibrate measures it again)", self.reranker.name, ratio, before,
            self.calibration.describe(), path)

    def depth_for(self, num_hits: int, time_budget_ms: float | None | _SearcherBudget = SEARCHER_BUDGET) -> int:
        """How many of ``num_hits`` BM25 hits are reranked under ``time_budget_ms`` (default: the searcher's
        :attr:`time_budget_ms`). A finite positive budget calibrates the searcher on first use."""
        budget = self.time_budget_ms if time_budget_ms is SEARCHER_BUDGET else time_budget_ms
        if budget is None or math.isinf(budget) or self.rerank_depth == 0:
            return min(self.rerank_depth, num_hits)
        if not budget >= 0:
            raise ValueError(f"time_budget_ms must be >= 0 (or None for no budget), not {budget}")
        depth = 0 if budget == 0 else self._cost_model().depth_for_budget(budget, self.rerank_depth)
        if depth == 0 and budget > 0 and num_hits > 0:
            self._warn_depth_zero(budget)
        return min(depth, num_hits)

    def _warn_depth_zero(self, budget: float) -> None:
        """Say, once per budget, that the cost model leaves nothing to rerank: no query then observes a time that
        could correct it, so a model measured on a busy machine would otherwise rerank nothing unnoticed."""
        with self._calibrating:
            if budget in self._warned_depth_zero:
                return
            self._warned_depth_zero.add(budget)
        calibration = self.calibration
        kept = "every query keeps its first-stage order"
        if self._drift is not None and self.enforce_deadline:
            kept += f" but one in {PROBE_INTERVAL}, which reranks one candidate to time it"
        logger.warning("the %g ms time budget buys no reranking with %s: its cost model (%s, measured %s) predicts "
                       "%.3g ms for a single candidate, so %s; if the machine was busy when it was measured, measure "
                       "it again with --recalibrate (or RerankingSearcher.calibrate(recalibrate=True))", budget,
                       self.reranker.name, calibration.describe(), calibration.measured_at or "elsewhere",
                       calibration.predict_ms(1), kept)

    def _cost_model(self) -> Calibration:
        with self._calibrating:
            if self.calibration is None:
                self.calibrate()
            return self.calibration

    def close(self) -> None:
        """Close the reranker (its sidecar) and the Lucene searcher."""
        self.reranker.close()
        self.searcher.close()

    # LuceneSearcher's API, beyond search: the first stage's Lucene searcher's business.

    @classmethod
    def from_prebuilt_index(cls, prebuilt_index_name: str, reranker: Reranker | str = "bm25", verbose: bool = False,
                            **kwargs) -> RerankingSearcher:
        """A searcher over a Pyserini prebuilt index (downloaded if not cached), as
        ``LuceneSearcher.from_prebuilt_index``; ``kwargs`` are the constructor's. Unlike Pyserini's, an index that
        cannot be had raises :class:`~pyserini_mores.index.IndexNotFoundError` instead of returning ``None``."""
        if verbose:
            logger.info("initializing prebuilt index %s", prebuilt_index_name)
        return cls(prebuilt_index_name, reranker, **kwargs)

    @staticmethod
    def list_prebuilt_indexes() -> None:
        """Print Pyserini's prebuilt sparse indexes (``LuceneSearcher.list_prebuilt_indexes``)."""
        import_pyserini("pyserini.search.lucene").LuceneSearcher.list_prebuilt_indexes()

    @property
    def index_dir(self) -> str:
        return self.searcher.index_dir

    @property
    def prebuilt_index_name(self) -> str | None:
        return self.index.prebuilt_name

    @property
    def object(self):
        """Anserini's ``SimpleSearcher`` (Java) under the first stage."""
        return self.searcher.object

    @property
    def index_reader(self):
        """Pyserini's ``LuceneIndexReader`` of the index."""
        return self.searcher.index_reader

    def doc(self, docid: str | int):
        """The Pyserini ``Document`` of a collection docid (``str``) or Lucene docid (``int``), ``None`` if absent."""
        return self.searcher.doc(docid)

    def batch_doc(self, docids: list[str], threads: int) -> dict:
        """``{docid: Document}`` for the docids the index holds, fetched on ``threads`` threads."""
        return self.searcher.batch_doc(docids, threads)

    def doc_by_field(self, field: str, q: str):
        """The Pyserini ``Document`` whose ``field`` is ``q``, ``None`` if none."""
        return self.searcher.doc_by_field(field, q)

    def set_bm25(self, k1: float = 0.9, b: float = 0.4) -> None:
        """Score the first stage with BM25 (``k1``, ``b``)."""
        self.searcher.set_bm25(float(k1), float(b))
        self.k1, self.b = float(k1), float(b)

    def set_qld(self, mu: float = 1000.0) -> None:
        """Score the first stage with query likelihood, Dirichlet smoothing ``mu``."""
        self.searcher.set_qld(float(mu))

    def set_rm3(self, fb_terms: int = 10, fb_docs: int = 10, original_query_weight: float = 0.5,
                debug: bool = False, filter_terms: bool = True) -> None:
        """Expand the first stage's queries with RM3 (Pyserini's ``set_rm3``; the index must store document
        vectors): the candidates reranked become BM25 + RM3's."""
        self._require_lucene_first_stage("set_rm3")
        rm3 = Rm3(fb_terms, fb_docs, original_query_weight)
        self.searcher.set_rm3(fb_terms, fb_docs, float(original_query_weight), debug=debug, filter_terms=filter_terms)
        self.rm3 = rm3
        if self.first_stage_name == "bm25":
            self.first_stage_name = "bm25+rm3"

    def unset_rm3(self) -> None:
        """Stop expanding the first stage's queries with RM3."""
        self.searcher.unset_rm3()
        self.rm3 = None
        if self.first_stage_name == "bm25+rm3":
            self.first_stage_name = "bm25"

    def is_using_rm3(self) -> bool:
        return bool(self.searcher.is_using_rm3())

    def set_rocchio(self, top_fb_terms: int = 10, top_fb_docs: int = 10, bottom_fb_terms: int = 10,
                    bottom_fb_docs: int = 10, alpha: float = 1, beta: float = 0.75, gamma: float = 0,
                    debug: bool = False, use_negative: bool = False) -> None:
        """Expand the first stage's queries with Rocchio feedback (Pyserini's ``set_rocchio``)."""
        self._require_lucene_first_stage("set_rocchio")
        self.searcher.set_rocchio(top_fb_terms, top_fb_docs, bottom_fb_terms, bottom_fb_docs, alpha, beta, gamma,
                                  debug, use_negative)

    def unset_rocchio(self) -> None:
        self.searcher.unset_rocchio()

    def is_using_rocchio(self) -> bool:
        return bool(self.searcher.is_using_rocchio())

    def get_feedback_terms(self, q: str) -> dict[str, float] | None:
        """The first stage's feedback terms for ``q`` and their weights (with RM3 on), else ``None``."""
        return self.searcher.get_feedback_terms(q)

    def get_similarity(self):
        """The Lucene ``Similarity`` the first stage scores with."""
        return self.searcher.get_similarity()

    def set_analyzer(self, analyzer) -> None:
        self.searcher.set_analyzer(analyzer)

    def set_language(self, language: str) -> None:
        self.searcher.set_language(language)

    def _lucene_document(self, lucene_docid: int):
        """The stored Lucene ``Document`` (Java) at a row, as ``JScoredDoc.lucene_document``."""
        return self.searcher.object.doc(int(lucene_docid))

    def _require_lucene_first_stage(self, method: str) -> None:
        if self.dense_searcher is not None and self.hybrid_searcher is None:
            raise ValueError(f"{method} changes the BM25 first stage, but this searcher's first stage is "
                             f"{self.first_stage_name!r}")

    def _refuse_lucene_options(self, query_generator=None, fields=None, strip_segment_id=False,
                               remove_dups=False) -> None:
        if query_generator is not None or fields or strip_segment_id or remove_dups:
            raise ValueError("query_generator, fields, strip_segment_id and remove_dups are LuceneSearcher.search's "
                             f"options: the {self.first_stage_name} first stage does not take them")


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


def _check_query_text(q) -> None:
    if not isinstance(q, str):
        raise TypeError(f"the reranker needs the query's text: search with a string, not a {type(q).__name__}")


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


class QueryRefusedError(ValueError):
    """Lucene cannot run a query (e.g. one with more distinct terms than its clause limit)."""


def lucene_refusal(lucene_searcher, queries: Sequence[str], qids: Sequence[str],
                   error: Exception) -> Exception:
    """The error to raise for ``error``, a Java exception from searching ``queries``: a :class:`QueryRefusedError`
    naming the first query Lucene refuses on its own, or ``error`` itself when each runs alone."""
    for query, qid in zip(queries, qids):
        try:
            lucene_searcher.search(query, k=1)
        except Exception as own:  # noqa: BLE001 - Java exceptions arrive as jnius.JavaException
            if type(own).__name__ != "JavaException":
                raise
            reason = str(own).splitlines()[0].removeprefix("JVM exception occurred: ")
            if "TooManyClauses" in reason:
                limit = reason.rsplit(" ", 1)[-1]
                reason = f"it has more distinct terms than Lucene's clause limit ({limit})"
            return QueryRefusedError(f"query {qid} ({len(query):,} characters) cannot be searched: {reason}; "
                                     "shorten it")
    return error


def missing_sidecar_message(path: Path, build_command: str) -> str:
    """One line, the same from the Python API and the command line: where the sidecar was looked for, the command that
    builds it, and how to encode the documents from their text instead."""
    return (f"no sidecar at {path}: build it with `{build_command}`, or encode the documents from their text instead "
            "(slow; --encode-from-text, or encode_from_text=True in Python)")


def sidecar_build_command(searcher: RerankingSearcher, output: Path) -> str:
    """The ``sidecar build`` command for ``searcher``'s reranker, ``--output`` only when not the default place."""
    model = searcher.reranker.model
    default = default_sidecar_path(searcher.index.path, searcher.reranker.name, model)
    return build_command_for(searcher.index.prebuilt_name or searcher.index.path, searcher.reranker.name, model,
                             None if Path(output) == default else output)


def build_command_for(index, reranker: str, model, output: Path | None = None) -> str:
    """The ``sidecar build`` command that writes ``model``'s sidecar: the model as it was loaded (its source and
    overrides, printed so that ``--model-arg`` reads them back), and ``--output`` when not the default place."""
    source = getattr(model, "source", None) or model.config.backbone
    if source and shipped_model_path(Path(source).name) == Path(source):  # a shipped model: by its name
        source = Path(source).name
    parts = ["python -m pyserini_mores.sidecar build", f"--index {index}", f"--reranker {reranker}",
             f"--model {source}"]
    parts += [f"--model-arg {format_model_arg(key, value)}"
              for key, value in getattr(model, "source_overrides", {}).items()]
    if output is not None:
        parts.append(f"--output {output}")
    return " ".join(parts)
