"""The search command's loop over its topics: a first stage for a batch of queries at a time, then each query
reranked in turn; what it found, query by query."""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from ..types import RerankedHit, RerankStats, first_stage_hits


@dataclass
class TopicSearch:
    """What :func:`search_topics` found, by qid in the topics' order: the reranked hits, what the rerank stage did,
    and (when kept) the first stage's own top hits (BM25's, BM25 + RM3's, the dense index's, the hybrid's or a
    run's)."""

    results: dict[str, list[RerankedHit]] = field(default_factory=dict)
    stats: dict[str, RerankStats] = field(default_factory=dict)
    first_stage: dict[str, list[RerankedHit]] = field(default_factory=dict)


def search_topics(searcher, topics: dict[str, str], *, hits: int = 1000, batch_size: int = 16, threads: int = 1,
                  keep_first_stage: bool = False, progress: bool = True, candidates: dict[str, list] | None = None,
                  found: TopicSearch | None = None,
                  after_query: Callable[[str, TopicSearch], None] | None = None) -> TopicSearch:
    """The top ``hits`` of every topic (qid → text) with ``searcher``: its first stage for ``batch_size`` queries at
    a time on ``threads`` threads (or the given ``candidates``, qid → hits, e.g. from a run), then each query
    reranked in turn (so that its rerank time is its own). ``keep_first_stage`` also keeps the first stage's top
    ``hits``, e.g. to evaluate both.

    ``found``: what an interrupted search of the same topics found (the queries it holds, a prefix of ``topics``,
    are not searched again; the others are added to it). ``after_query(qid, found)``: called as each query is done.
    """
    found = TopicSearch() if found is None else found
    qids = [qid for qid in topics if qid not in found.results]
    # Closed however the loop ends, so that an error's line starts on a line of its own.
    with tqdm(total=len(topics), initial=len(topics) - len(qids), unit="query", desc="search",
              disable=not progress) as bar:
        for start in range(0, len(qids), batch_size):
            batch = qids[start:start + batch_size]
            batch_candidates = candidates if candidates is not None else \
                searcher.first_stage([topics[qid] for qid in batch], batch, k=hits, threads=threads)
            for qid in batch:
                first_stage = list(batch_candidates.get(qid, []))
                if keep_first_stage:
                    found.first_stage[qid] = first_stage_hits(first_stage[:hits])
                ranked, found.stats[qid] = searcher.rerank_hits(topics[qid], first_stage)
                found.results[qid] = ranked[:hits]
                if after_query is not None:
                    after_query(qid, found)
                bar.update(1)
    return found


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest value with at least ``fraction`` of ``values`` at or below it (0
    for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


def budget_report(stats: Sequence[RerankStats], budget_ms: float) -> list[str]:
    """What the rerank stage did against a time budget, as lines for a search's summary: the depths the cost model
    gave, the measured times against the budget (median, p95, queries over it), the queries the deadline stopped,
    and those given nothing to rerank."""
    if not stats:
        return []
    depths = [entry.depth for entry in stats]
    times = [entry.rerank_ms for entry in stats]
    lines = [f"Rerank depth under the {budget_ms:g} ms budget: median {statistics.median(depths):g}, "
             f"mean {statistics.fmean(depths):.1f}, range {min(depths)}-{max(depths)}",
             f"Rerank time against the {budget_ms:g} ms budget: median {statistics.median(times):.1f} ms, p95 "
             f"{percentile(times, 0.95):.1f} ms; {sum(ms > budget_ms for ms in times)} of {len(times)} queries "
             "over it"]
    cut = [entry for entry in stats if entry.deadline_cut]
    if cut:
        lines.append(f"Stopped at the deadline: {len(cut)} of {len(stats)} queries, which scored "
                     f"{sum(entry.scored for entry in cut)} of the {sum(entry.depth for entry in cut)} candidates "
                     "their depth allowed")
    unreranked = sum(entry.depth == 0 and entry.candidates > 0 for entry in stats)
    if unreranked and budget_ms > 0:
        lines.append(f"Nothing reranked: {unreranked} of {len(stats)} queries, whose depth under the budget was 0 "
                     "(if the machine was busy when the cost model was measured: --recalibrate)")
    return lines
