"""``RerankingSearcher``: a drop-in for Pyserini's ``LuceneSearcher`` that reranks BM25's top ``rerank_depth``."""
from __future__ import annotations

import logging
import os
from pathlib import Path

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

    Example:
        >>> searcher = RerankingSearcher("indexes/debian", "maxsim", rerank_depth=100)  # doctest: +SKIP
        >>> hits = searcher.search("visualize ABI changes of a C library", k=10)  # doctest: +SKIP
    """

    def __init__(self, index: str | os.PathLike | ResolvedIndex, reranker: Reranker | str = "bm25", *,
                 k1: float | None = None, b: float | None = None, rerank_depth: int = 1000,
                 sidecar: str | os.PathLike | None = "auto", require_sidecar: bool = False, **reranker_kwargs):
        if rerank_depth < 0:
            raise ValueError("rerank_depth must be >= 0")
        self.index = index if isinstance(index, ResolvedIndex) else resolve_index(index)
        self.searcher = open_searcher(self.index)
        default_k1, default_b = self.index.default_bm25
        self.k1 = default_k1 if k1 is None else k1
        self.b = default_b if b is None else b
        self.searcher.set_bm25(self.k1, self.b)
        self.rerank_depth = rerank_depth
        self.reranker = get_reranker(reranker, **reranker_kwargs) if isinstance(reranker, str) else reranker
        self.sidecar_path: Path | None = None
        if getattr(self.reranker, "model", None) is not None and self.reranker.model.store_width is not None \
                and getattr(self.reranker, "sidecar", None) is None and sidecar is not None:
            self._attach_sidecar(sidecar, require_sidecar)

    def _attach_sidecar(self, sidecar: str | os.PathLike, required: bool) -> None:
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
        """The top ``k`` hits for query text ``q``."""
        hits = self.searcher.search(q, k=max(k, self.rerank_depth))
        return self._rerank(q, hits)[:k]

    def batch_search(self, queries: list[str], qids: list[str], k: int = 10,
                     threads: int = 1) -> dict[str, list[RerankedHit]]:
        """``{qid: top-k hits}``; BM25 runs on ``threads`` threads, reranking query by query in large batches."""
        if len(queries) != len(qids):
            raise ValueError(f"{len(queries)} queries but {len(qids)} qids")
        depth = max(k, self.rerank_depth)
        bm25 = self.searcher.batch_search(queries, qids, k=depth, threads=threads)
        return {qid: self._rerank(query, bm25.get(qid, []))[:k] for query, qid in zip(queries, qids)}

    def bm25_batch_search(self, queries: list[str], qids: list[str], k: int = 10,
                          threads: int = 1) -> dict[str, list[RerankedHit]]:
        """The first stage alone, as :class:`RerankedHit` lists."""
        bm25 = self.searcher.batch_search(queries, qids, k=k, threads=threads)
        return {qid: texts_to_hits(hits_to_texts(bm25.get(qid, []))) for qid in qids}

    def _rerank(self, query: str, hits) -> list[RerankedHit]:
        hits = list(hits)
        head, tail = hits[:self.rerank_depth], hits[self.rerank_depth:]
        texts = None
        if head and self.reranker.needs_text:
            texts = fetch_texts(self.searcher, [hit.docid for hit in head])
        candidates = hits_to_texts(head, texts)
        reranked = texts_to_hits(self.reranker.rerank(Query(query), candidates)) if head else []
        return reranked + _below(reranked, texts_to_hits(hits_to_texts(tail)), start_rank=len(head) + 1)

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
    model = searcher.reranker.model
    parts = ["python -m pyserini_mores.sidecar build", f"--index {searcher.index.prebuilt_name or searcher.index.path}",
             f"--reranker {searcher.reranker.name}", f"--model {getattr(model, 'source', None) or model.config.backbone}"]
    parts += [f"--model-arg {key}={value}" for key, value in getattr(model, "source_overrides", {}).items()]
    parts.append(f"--output {output}")
    return " ".join(parts)
