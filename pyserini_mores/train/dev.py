"""Periodic dev evaluation during training: rerank a fixed first-stage top-k of dev queries with the current model
(from text, in-graph: no sidecar, since the weights change every step) and compute MRR@10 with
:func:`pyserini_mores.eval.metrics.evaluate`.

Candidates and their texts are gathered once (BM25 on the dev index, or a given run), so an evaluation costs only
the model's scoring: ``queries × depth`` forward pairs.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

import torch

from ..eval.metrics import evaluate
from ..formats import read_qrels, read_ranked_run, read_topics

logger = logging.getLogger(__name__)

DEV_METRICS = ("MRR@10", "nDCG@10")


@dataclass
class DevCandidates:
    """Per dev query: its text and the first-stage candidates ``[(docid, text), ...]``, best first."""

    queries: dict[str, str]
    candidates: dict[str, list[tuple[str, str]]]
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def num_pairs(self) -> int:
        return sum(len(docs) for docs in self.candidates.values())


def gather_dev_candidates(
    topics: str | os.PathLike,
    qrels: str | os.PathLike,
    *,
    index: str | os.PathLike | None = None,
    run: str | os.PathLike | None = None,
    collection: str | os.PathLike | None = None,
    depth: int = 100,
    max_queries: int | None = None,
    k1: float | None = None,
    b: float | None = None,
    threads: int = 1,
) -> DevCandidates:
    """The dev queries (judged ones, in topic order, at most ``max_queries``) and their top ``depth`` candidates
    from ``run`` (a run file) or BM25 on ``index``, with texts from ``collection`` or the index's stored text."""
    from .data import collection_texts

    topic_texts = read_topics(topics)
    judgments = read_qrels(qrels)
    qids = [qid for qid in topic_texts if any(grade > 0 for grade in judgments.get(qid, {}).values())]
    if max_queries is not None:
        qids = qids[:max_queries]
    if not qids:
        raise ValueError(f"no query of {topics} has a relevant judgment in {qrels}")
    searcher = None
    if run is not None:
        ranked = read_ranked_run(run)
        rankings = {qid: [docid for docid, _ in ranked.get(qid, [])][:depth] for qid in qids}
    else:
        if index is None:
            raise ValueError("dev evaluation needs --dev-index (BM25 candidates) or --dev-run")
        rankings, searcher = bm25_rankings(index, {qid: topic_texts[qid] for qid in qids}, depth, k1, b, threads)
    docids = list(dict.fromkeys(docid for ranking in rankings.values() for docid in ranking))
    if collection is not None:
        texts = collection_texts(collection, docids)
    else:
        from ..index import fetch_texts, open_searcher

        searcher = searcher or open_searcher(index)
        texts = dict(zip(docids, fetch_texts(searcher, docids)))
    return DevCandidates(
        queries={qid: topic_texts[qid] for qid in qids},
        candidates={qid: [(docid, texts[docid]) for docid in rankings[qid]] for qid in qids},
        qrels={qid: judgments[qid] for qid in qids},
    )


def bm25_rankings(index, queries: dict[str, str], depth: int, k1: float | None = None, b: float | None = None,
                  threads: int = 1):
    """``({qid: [docid, ...]}, searcher)``: BM25 top ``depth`` of every query (the index's default k1/b unless
    given, as the search command chooses them)."""
    from ..index import open_searcher, resolve_index

    resolved = resolve_index(index)
    searcher = open_searcher(resolved)
    default_k1, default_b = resolved.default_bm25
    searcher.set_bm25(default_k1 if k1 is None else k1, default_b if b is None else b)
    qids = list(queries)
    hits = searcher.batch_search([queries[qid] for qid in qids], qids, k=depth, threads=threads)
    return {qid: [hit.docid for hit in hits.get(qid, [])] for qid in qids}, searcher


class DevEvaluator:
    """Scores the fixed dev candidates with a model and evaluates the reranked run.

    Scoring goes through the training ``forward`` on tokenized batches moved to the model's device (equal to the
    stored-representation path, which the model tests prove), so it works on CPU and GPU alike.

    Example::

        evaluator = DevEvaluator(gather_dev_candidates("queries.dev.tsv", "qrels.dev.txt", index="index/", depth=30))
        evaluator(model)  # {"MRR@10": 0.74, "nDCG@10": 0.78}
    """

    def __init__(self, candidates: DevCandidates, metrics=DEV_METRICS, bf16: bool = False, batch_size: int = 64):
        self.candidates = candidates
        self.metrics = tuple(metrics)
        self.bf16 = bf16
        self.batch_size = batch_size

    def rerank(self, model) -> dict[str, dict[str, float]]:
        """``{qid: {docid: score}}`` of every dev candidate under ``model`` (eval mode; mode restored)."""
        from .objectives import batch_to_device

        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()
        run: dict[str, dict[str, float]] = {}
        try:
            with torch.no_grad(), autocast:
                for qid, query in self.candidates.queries.items():
                    docs = self.candidates.candidates[qid]
                    scores: list[float] = []
                    for start in range(0, len(docs), self.batch_size):
                        texts = [text for _, text in docs[start:start + self.batch_size]]
                        batch = batch_to_device({"query_batch": model.tokenize_queries([query] * len(texts)),
                                                 "doc_batch": model.tokenize_documents(texts)}, device)
                        scores.extend(model(batch["query_batch"], batch["doc_batch"]).float().tolist())
                    if docs:
                        run[qid] = {docid: score for (docid, _), score in zip(docs, scores)}
        finally:
            model.train(was_training)
        return run

    def __call__(self, model) -> dict[str, float]:
        started = time.perf_counter()
        result = evaluate(self.rerank(model), self.candidates.qrels, self.metrics)
        logger.debug("dev evaluation of %d pairs took %.1f s", self.candidates.num_pairs,
                     time.perf_counter() - started)
        return dict(result.aggregate)


__all__ = ["DevCandidates", "gather_dev_candidates", "bm25_rankings", "DevEvaluator", "DEV_METRICS"]
