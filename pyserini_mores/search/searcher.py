"""``RerankingSearcher``: a drop-in for Pyserini's ``LuceneSearcher`` that reranks BM25's top ``rerank_depth``."""
from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

from .._cli import format_model_arg
from ..index import ResolvedIndex, fetch_texts, index_identity, open_searcher, resolve_index
from ..rerankers import Reranker, get_reranker
from ..types import Query, RerankedHit, hits_to_texts, texts_to_hits

logger = logging.getLogger(__name__)


class SidecarMissingError(FileNotFoundError):
    """A reranker that reads a sidecar was asked to run where none has been built."""


def default_sidecar_path(index_path: str | os.PathLike, reranker_name: str, model) -> Path:
    """``<index_dir>.sidecars/<reranker>-<variant>-<fingerprint[:12]>``: beside the index (for a prebuilt index,
    beside it in Pyserini's cache), one directory per reranker, stored variant and model."""
    index_path = Path(index_path)
    name = f"{reranker_name}-{model.store_variant}-{model.store_fingerprint()[:12]}"
    return index_path.parent / f"{index_path.name}.sidecars" / name


class RerankingSearcher:
    """BM25 retrieval with Pyserini, then a learned reranker over the top ``rerank_depth`` hits.

    ``search`` and ``batch_search`` have ``LuceneSearcher``'s signatures and return hits (``.docid``, ``.score``,
    ``.lucene_docid``) that Pyserini's run writers accept. Hits below ``rerank_depth`` keep their BM25 order,
    scored below every reranked hit.

    Args:
        index: a Lucene index directory or a Pyserini prebuilt index name.
        reranker: a :class:`Reranker`, or a registered name (``bm25``, ``maxsim``, ``mores``, ...); with a name,
            ``reranker_kwargs`` go to its factory (e.g. ``model=``).
        k1, b: BM25 parameters (default: Pyserini's for the index).
        rerank_depth: how many BM25 hits are reranked.
        sidecar: for rerankers that read stored document representations: a path, ``"auto"`` (the default
            location beside the index, if built; else documents are encoded from their text, slowly) or ``None``.
        require_sidecar: fail instead of encoding text when the sidecar is missing.
        time_budget_ms: rerank-stage budget per query, in ms (BM25 excluded): each query is reranked to the
            largest depth ``n <= rerank_depth`` whose predicted cost fits (see :mod:`.budget`); 0 keeps the BM25
            order; ``None`` or ``inf`` reranks ``rerank_depth`` hits as without a budget. The depth chosen is
            in :attr:`last_depth` (and :attr:`chosen_depths` after :meth:`batch_search`).
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
        self.calibration = calibration
        self.last_depth: int | None = None  # candidates reranked for the last query
        self.last_rerank_ms: float | None = None  # its rerank-stage time, as the calibration times it
        self.chosen_depths: dict[str, int] = {}  # qid → depth, for the last batch_search
        self.reranker = get_reranker(reranker, **reranker_kwargs) if isinstance(reranker, str) else reranker
        self.sidecar_path: Path | None = None
        if getattr(self.reranker, "model", None) is not None and self.reranker.model.store_width is not None \
                and getattr(self.reranker, "sidecar", None) is None and sidecar is not None:
            self.attach_sidecar(sidecar, require_sidecar)

    def attach_sidecar(self, sidecar: str | os.PathLike = "auto", required: bool = False) -> None:
        """Open the reranker's sidecar (``"auto"``: the default location beside the index) and check that it was
        built for this model and this index. A missing sidecar raises :class:`SidecarMissingError` (with the build
        command) when ``required`` or explicitly given, else documents are encoded from text."""
        from ..sidecar import open_sidecar

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

    @property
    def num_docs(self) -> int:
        return self.searcher.num_docs

    def search(self, q: str, k: int = 10) -> list[RerankedHit]:
        """The top ``k`` hits for query text ``q``. A query without BM25 terms (blank, or stopwords only) gets no
        hits, as from ``LuceneSearcher``, and the reranker is not called."""
        hits = self.searcher.search(q, k=max(k, self.rerank_depth))
        return self._rerank(q, hits)[:k]

    def batch_search(self, queries: list[str], qids: list[str], k: int = 10,
                     threads: int = 1) -> dict[str, list[RerankedHit]]:
        """``{qid: top-k hits}``; BM25 runs on ``threads`` threads, reranking query by query in large batches."""
        if len(queries) != len(qids):
            raise ValueError(f"{len(queries)} queries but {len(qids)} qids")
        depth = max(k, self.rerank_depth)
        bm25 = self.searcher.batch_search(queries, qids, k=depth, threads=threads)
        results, self.chosen_depths = {}, {}
        for query, qid in zip(queries, qids):
            results[qid] = self._rerank(query, bm25.get(qid, []))[:k]
            self.chosen_depths[qid] = self.last_depth
        return results

    def bm25_batch_search(self, queries: list[str], qids: list[str], k: int = 10,
                          threads: int = 1) -> dict[str, list[RerankedHit]]:
        """The first stage alone, as :class:`RerankedHit` lists."""
        bm25 = self.searcher.batch_search(queries, qids, k=k, threads=threads)
        return {qid: texts_to_hits(hits_to_texts(bm25.get(qid, []))) for qid in qids}

    def calibrate(self, recalibrate: bool = False, **options):
        """The reranker's cost model on this machine (from the cache, else measured); ``options`` go to
        :func:`.budget.calibrate`. Kept in :attr:`calibration`."""
        from .budget import calibrate

        self.calibration = calibrate(self, recalibrate=recalibrate, **options)
        return self.calibration

    def depth_for(self, num_hits: int) -> int:
        """How many of ``num_hits`` BM25 hits are reranked under the current :attr:`time_budget_ms`."""
        budget = self.time_budget_ms
        if budget is None or math.isinf(budget) or self.rerank_depth == 0:
            return min(self.rerank_depth, num_hits)
        if self.calibration is None and budget > 0:
            self.calibrate()
        depth = 0 if budget <= 0 else self.calibration.depth_for_budget(budget, self.rerank_depth)
        return min(depth, num_hits)

    def _rerank(self, query: str, hits) -> list[RerankedHit]:
        hits = list(hits)
        depth = self.depth_for(len(hits))
        head, tail = hits[:depth], hits[depth:]
        started = time.perf_counter()
        reranked = self._rerank_head(query, head)
        # With nothing to rerank the rerank stage does not run: 0 ms, not the cost of a function call.
        self.last_depth, self.last_rerank_ms = len(head), (time.perf_counter() - started) * 1000 if head else 0.0
        return reranked + _below(reranked, texts_to_hits(hits_to_texts(tail)), start_rank=len(head) + 1)

    def _rerank_head(self, query: str, head: list) -> list[RerankedHit]:
        """The reranked ``head`` hits, best first: the rerank stage a time budget pays for (text fetch when the
        reranker needs text, query encoding, sidecar reads, scoring, sorting)."""
        if not head:
            return []
        texts = fetch_texts(self.searcher, [hit.docid for hit in head]) if self.reranker.needs_text else None
        return texts_to_hits(self.reranker.rerank(Query(query), hits_to_texts(head, texts)))

    def close(self) -> None:
        self.reranker.close()
        self.searcher.close()


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
