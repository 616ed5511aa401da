"""Time budgets for reranking: measure what reranking ``n`` candidates costs on this machine, cache it, and choose the
deepest rerank depth whose predicted cost fits a per-query budget (the TK paper's setting: under a fixed latency, a
faster reranker can rerank deeper and win).

What is timed is the rerank stage of :class:`~.searcher.RerankingSearcher` for one query
(:meth:`~.searcher.RerankingSearcher.rerank_candidates`), exactly the code a search runs: fetching document text from
Lucene (only for rerankers that score text), encoding the query, reading the candidates' stored representations from
the sidecar, scoring them in batches, and sorting. BM25 retrieval is *not* timed and not part of the budget: it costs
every reranker the same, and Pyserini runs it for many queries at once on several threads, so it has no well-defined
per-query share.

The cost of ``n`` candidates is predicted from the median times measured at several sizes, after a warm-up: the
cheapest median measured at ``n`` or a larger size (cost does not fall as candidates are added), so a depth is chosen
exactly where a size at least as large was measured to fit; beyond the largest size measured, the larger of its
median scaled in proportion and a line ``fixed_ms + per_candidate_ms * n`` fitted by least squares to all the medians
(with a non-negative slope). The line also summarises the model (its report, the first batch's pace, the refits), but
it does not overrule a measurement: costs are not linear in ``n`` (batching makes the first candidates dearer per
candidate than the thousandth), and a line through 1 to 1,000 candidates can start far above what one candidate was
measured to cost. Calibration runs warm; the searcher's deadline (see :meth:`~.searcher.RerankingSearcher.rerank_hits`)
keeps a query within its budget when a cold page cache or a longer query makes it slower than predicted.

A machine's speed changes after its calibration (other processes start or stop): the searcher splits every budgeted
query's rerank time into its fixed cost and its batches' time per candidate (:class:`CostRefit`), and when their
recent medians drift from the model refits the model's line to them and saves it in the cache
(:meth:`Calibration.refitted`), so that the depths follow and the next search starts from it. A model whose depth
for a budget is 0 is reported, never applied silently; since a query that reranks nothing observes nothing, one such
query in :data:`PROBE_INTERVAL` reranks one candidate anyway to time it, and a probe that fits the budget refits the
model to itself at once (:meth:`CostRefit.observe`), so a model measured on a busy machine does not keep a quiet one
from reranking.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import math
import os
import platform
import re
import socket
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._io import write_json_atomic
from ..cache import cache_root
from ..index import document_text, index_identity
from ..types import RerankedHit

logger = logging.getLogger(__name__)

CALIBRATION_FORMAT_VERSION = 1
#: Candidate counts measured, up to the rerank depth (which is always measured too).
CALIBRATION_SIZES = (1, 10, 25, 50, 100, 250, 500, 1000, 2000, 5000)
#: Words of a document used as a calibration query: MS MARCO-like query lengths.
QUERY_WORDS = 6
#: A line further than this (relative) from a measured median is reported as a noisy calibration ...
NOISY_FIT = 0.5
#: ... among the medians of at least this many ms (shorter timings are all jitter, and harmless).
NOISE_FLOOR_MS = 2.0
#: Observed rerank times refit the cost model: the medians, over the last this many budgeted queries (odd: a full
#: window's median is one query's, not a mean of two), of each query's time outside its scoring batches (the fixed
#: cost) and of its batches' time per candidate ...
REFIT_WINDOW = 15
#: ... once this many queries are counted, and the refit line is off by more than this factor either way from the
#: model's (at one candidate, or at the median number of candidates the queries scored).
DRIFT_FACTOR = 1.15
DRIFT_MIN_QUERIES = 8
#: Of the queries whose depth under their budget is 0, every this-many-th reranks one candidate (a probe) so that the
#: model is observed. A probe may overrun the budget; at most 1 / PROBE_INTERVAL (4%) of the queries are probes,
#: fewer than the 5% above a p95.
PROBE_INTERVAL = 25

@dataclass(frozen=True)
class Calibration:
    """A reranker's measured cost per query: the medians measured at several sizes (``points``), and the line
    ``fixed_ms + per_candidate_ms * n`` ms (``n >= 1`` candidates) fitted to them (:meth:`predict_ms`).

    Attributes:
        fixed_ms: per-query cost independent of the candidates (query encoding, setup), ms.
        per_candidate_ms: cost of each candidate (text fetch or sidecar read, scoring), ms.
        points: the measurements the model was fitted to: ``(candidates, median ms)``.
        max_candidates: the largest size the measurement planned for (a cache entry serves rerank depths up to it).
        key: what the measurement depends on (reranker, model, precision, device, batch size, threads, machine, index).
        measured_at: ISO timestamp of the measurement.
        scale: how much slower (> 1) or faster than measured searches were observed to rerank, at the number of
            candidates they scored: the product of the refits' ratios (:meth:`refitted`); 1 as measured.
        rescaled_at: ISO timestamp of the last refit ("" when none).
    """

    fixed_ms: float
    per_candidate_ms: float
    points: tuple[tuple[int, float], ...] = ()
    max_candidates: int = 0
    key: dict[str, Any] = field(default_factory=dict)
    measured_at: str = ""
    scale: float = 1.0
    rescaled_at: str = ""

    def __post_init__(self):
        for name in ("fixed_ms", "per_candidate_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, not {value}")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be a finite number > 0, not {self.scale}")

    def refitted(self, fixed_ms: float, per_candidate_ms: float, at: int) -> "Calibration":
        """This model with the line ``fixed_ms + per_candidate_ms * n``, what searches observed when the machine's
        speed changed after the measurement (:class:`CostRefit`). Each measured point moves as far as the prediction
        must at its size to meet the new line there (times the ratio of the new line to the old prediction), so
        that a point on the measured envelope lands on the new line and the others stay above it, as measured;
        :attr:`scale` is multiplied by the ratio of the new line to the old at ``at`` candidates (the number the
        observed queries scored)."""
        for name, value in (("fixed_ms", fixed_ms), ("per_candidate_ms", per_candidate_ms)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"a cost model is refitted to a {name} that is a finite number >= 0, not {value}")
        refit = dataclasses.replace(self, fixed_ms=fixed_ms, per_candidate_ms=per_candidate_ms)

        def ratio(before: float, after: float) -> float:
            return after / before if before > 0 and after > 0 else 1.0

        at = max(at, 1)
        return dataclasses.replace(
            refit, points=tuple((n, ms * ratio(self.predict_ms(n), refit.line_ms(n))) for n, ms in self.points),
            scale=self.scale * ratio(self.line_ms(at), refit.line_ms(at)),
            rescaled_at=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))

    def line_ms(self, candidates: int) -> float:
        """The fitted line at ``candidates`` (0 for none)."""
        return 0.0 if candidates <= 0 else self.fixed_ms + self.per_candidate_ms * candidates

    def predict_ms(self, candidates: int) -> float:
        """Predicted rerank-stage time (ms) of one query with ``candidates`` candidates: what the measurements say
        (:meth:`measured_ms`) up to the largest size measured, and beyond it (or without measurements) never less
        than the fitted line either.

        Within the measured sizes the line does not overrule the medians, either way: it is one straight line
        through costs that are not straight (a cross-encoder's was 95.8 ms + 8.55 ms per candidate through 1 to
        1,000 candidates, where one candidate measured 22.7 ms), and it would refuse a 100 ms budget the one
        candidate that was measured to fit it."""
        if candidates <= 0:
            return 0.0
        if self.points and candidates <= max(n for n, _ in self.points):
            return self.measured_ms(candidates)
        return max(self.line_ms(candidates), self.measured_ms(candidates))

    def measured_ms(self, candidates: int) -> float:
        """What the measured medians alone say ``candidates`` candidates cost: reranking fewer candidates never costs
        more, so the cheapest median measured at ``candidates`` or more; beyond the largest measured size, its
        median scaled up in proportion (as if all of it were per candidate). 0 without measurements.

        So a depth is predicted to fit a budget only when a size at least as large was measured to fit it: a line
        fitted to noisy medians (flat, when the fitted slope was negative) cannot buy a depth the measurements
        refuse."""
        if candidates <= 0 or not self.points:
            return 0.0
        at_least = [ms for n, ms in self.points if n >= candidates]
        if at_least:
            return min(at_least)
        largest, largest_ms = max(self.points)
        return largest_ms * candidates / max(largest, 1)

    def depth_for_budget(self, budget_ms: float | None, max_depth: int) -> int:
        """The largest ``n <= max_depth`` whose predicted cost (:meth:`predict_ms`) is at most ``budget_ms``.

        ``None`` or ``inf`` → ``max_depth``; a budget below the cheapest measured cost (or 0) → 0: no reranking. A
        depth is chosen only when a size at least as large was measured within the budget, and then whatever the
        line says.
        """
        if max_depth <= 0:
            return 0
        if budget_ms is None or budget_ms == math.inf:
            return max_depth
        if not budget_ms >= 0:
            raise ValueError(f"the time budget must be >= 0 ms, not {budget_ms}")
        if budget_ms == 0:
            return 0
        # predict_ms is non-decreasing in n: the largest fitting depth by bisection, decided on the prediction
        # itself, so that depth_for_budget and predict_ms never disagree.
        if self.predict_ms(max_depth) <= budget_ms:
            return max_depth
        fits, over = 0, max_depth
        while over - fits > 1:
            middle = (fits + over) // 2
            if self.predict_ms(middle) <= budget_ms:
                fits = middle
            else:
                over = middle
        return fits

    @classmethod
    def fit(cls, points: Sequence[tuple[int, float]], **fields: Any) -> "Calibration":
        """Least-squares line through ``(candidates, ms)`` points, constrained to non-negative coefficients."""
        points = tuple((int(n), float(ms)) for n, ms in points)
        fixed, per_candidate = _fit_line(points)
        return cls(fixed_ms=fixed, per_candidate_ms=per_candidate, points=points, **fields)

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": CALIBRATION_FORMAT_VERSION, "fixed_ms": self.fixed_ms,
                "per_candidate_ms": self.per_candidate_ms,
                "points": [{"candidates": n, "median_ms": ms} for n, ms in self.points],
                "max_candidates": self.max_candidates, "key": self.key, "measured_at": self.measured_at,
                "scale": self.scale, "rescaled_at": self.rescaled_at,
                "max_relative_error": self.max_relative_error,
                "timed": "rerank stage per query (text fetch if needed, query encoding, sidecar reads, scoring, "
                         "sorting); BM25 excluded"}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Calibration":
        if values.get("format_version") != CALIBRATION_FORMAT_VERSION:
            raise ValueError(f"calibration format {values.get('format_version')!r} is not "
                             f"{CALIBRATION_FORMAT_VERSION}")
        return cls(fixed_ms=float(values["fixed_ms"]), per_candidate_ms=float(values["per_candidate_ms"]),
                   points=tuple((int(p["candidates"]), float(p["median_ms"])) for p in values["points"]),
                   max_candidates=int(values["max_candidates"]), key=dict(values["key"]),
                   measured_at=str(values["measured_at"]), scale=float(values.get("scale", 1.0)),
                   rescaled_at=str(values.get("rescaled_at", "")))

    @property
    def max_relative_error(self) -> float:
        """The worst relative gap between the line and a measured point of at least :data:`NOISE_FLOOR_MS`
        (shorter timings are all jitter): large when the machine was busy while measuring."""
        return max((abs(self.line_ms(n) - ms) / ms for n, ms in self.points if ms >= NOISE_FLOOR_MS),
                   default=0.0)

    def describe(self) -> str:
        observed = "" if self.scale == 1.0 else f" ({self.scale:.3g}x as measured, refitted to observed times)"
        return f"{self.fixed_ms:.3g} ms + {self.per_candidate_ms:.3g} ms/candidate{observed}"


class CostRefit:
    """Rerank times observed against a cost model, each budgeted query split into its fixed cost (the rerank stage's
    time outside its scoring batches: text fetch, query encoding, sorting) and its batches' time per candidate. The
    medians of each over the last :data:`REFIT_WINDOW` queries are the line the machine shows now: robust to a few
    queries caught by a burst of load, and each coefficient followed on its own, since load slows them unequally.
    :meth:`observe` returns the refitted model once :data:`DRIFT_MIN_QUERIES` queries are counted and that line is off
    by more than :data:`DRIFT_FACTOR` either way from the model's, at one candidate or at the median number scored.

    A query that scored nothing counts for the fixed cost only; one whose observed and predicted times are both under
    :data:`NOISE_FLOOR_MS` is not counted (jitter). A probe that contradicts the model (one candidate reranked
    within a budget the model said it could not fit) replaces the window and refits on its own: the queries around
    it reranked nothing and observe nothing, so no majority of them could ever outvote the model.
    """

    def __init__(self, window: int = REFIT_WINDOW, factor: float = DRIFT_FACTOR,
                 min_queries: int = DRIFT_MIN_QUERIES):
        if window < 1 or min_queries < 1 or not factor > 1:
            raise ValueError(f"a refit needs window >= 1, min_queries >= 1 and factor > 1, not {window}, "
                             f"{min_queries} and {factor}")
        self.factor, self.min_queries = factor, min_queries
        self.fixed_ms: deque[float] = deque(maxlen=window)
        self.per_candidate_ms: deque[float] = deque(maxlen=window)
        self.scored: deque[int] = deque(maxlen=window)

    @property
    def queries(self) -> int:
        """Queries counted in the window."""
        return len(self.fixed_ms)

    def observe(self, calibration: Calibration, scored: int, rerank_ms: float,
                batch_ms: float | None, *, conclusive: bool = False) -> tuple[Calibration, float] | None:
        """Count one query that scored ``scored`` candidates in batches taking ``batch_ms`` of its ``rerank_ms``
        (``None``: not timed apart, as from a reranker that does not pace its batches; then split as the model
        splits its prediction); the refitted model and its ratio to ``calibration`` at the median number scored (the
        warning's "x times") when the observations have drifted from ``calibration``, else ``None``.
        ``conclusive``: this query alone is the window (a probe that contradicts the model)."""
        if max(calibration.predict_ms(scored), rerank_ms) < NOISE_FLOOR_MS or rerank_ms < 0:
            return None
        if conclusive:
            for window in (self.fixed_ms, self.per_candidate_ms, self.scored):
                window.clear()
        if batch_ms is None:
            line = calibration.line_ms(scored)
            batch_ms = rerank_ms * calibration.per_candidate_ms * scored / line if line > 0 else rerank_ms
        batch_ms = min(max(batch_ms, 0.0), rerank_ms)
        self.fixed_ms.append(rerank_ms - batch_ms)
        if scored > 0:
            self.per_candidate_ms.append(batch_ms / scored)
            self.scored.append(scored)
        if (self.queries < self.min_queries and not conclusive) or not self.per_candidate_ms:
            return None
        # To the nanosecond: finer digits are the clock's rounding, and would tip a depth that fits exactly.
        fixed, per_candidate = (round(statistics.median(values), 6) for values in (self.fixed_ms,
                                                                                  self.per_candidate_ms))
        at = max(1, round(statistics.median(self.scored)))
        ratios = []
        for candidates in (1, at):
            before, after = calibration.line_ms(candidates), fixed + per_candidate * candidates
            if max(before, after) >= NOISE_FLOOR_MS:
                ratios.append(after / before if before > 0 else math.inf)
        if not conclusive and all(1 / self.factor <= ratio <= self.factor for ratio in ratios):
            return None
        refitted = calibration.refitted(fixed, per_candidate, at)
        return refitted, refitted.line_ms(at) / calibration.line_ms(at) if calibration.line_ms(at) > 0 else math.inf


def _fit_line(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    if not points:
        return 0.0, 0.0
    sizes = [n for n, _ in points]
    times = [ms for _, ms in points]
    if len(set(sizes)) == 1:  # no slope to see: charge everything to the candidates (the cautious reading)
        return 0.0, max(0.0, statistics.fmean(times) / max(sizes[0], 1))
    mean_n, mean_t = statistics.fmean(sizes), statistics.fmean(times)
    slope = (sum((n - mean_n) * (t - mean_t) for n, t in points) / sum((n - mean_n) ** 2 for n in sizes))
    intercept = mean_t - slope * mean_n
    if slope < 0:  # timing noise on a reranker whose cost does not grow with n: the best line of slope 0
        return max(0.0, mean_t), 0.0
    if intercept < 0:  # a line through the origin instead
        return 0.0, sum(n * t for n, t in points) / sum(n * n for n in sizes)
    return intercept, slope


# ---------------------------------------------------------------------------------------------------- the cache


def calibration_cache_dir() -> Path:
    """``$PYSERINI_MORES_CACHE/calibration``, else ``~/.cache/pyserini_mores/calibration``."""
    return cache_root() / "calibration"


def machine_identity() -> dict[str, Any]:
    """Hostname, CPU model, CPU count and architecture: timings are only valid on the machine that made them."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read(), re.MULTILINE)
        cpu = match.group(1).strip() if match else cpu
    except OSError:
        pass
    return {"hostname": socket.gethostname(), "cpu": cpu, "cpus": os.cpu_count(), "arch": platform.machine()}


def calibration_key(searcher) -> dict[str, Any]:
    """Everything a searcher's rerank cost depends on: the reranker and its model (whole-model fingerprint),
    where documents come from (sidecar dtype and width, or text), precision, device, batch size, torch threads and
    version, the machine, and the index (its documents' lengths)."""
    reranker = searcher.reranker
    model = getattr(reranker, "model", None)
    sidecar = getattr(reranker, "sidecar", None)
    if sidecar is not None:
        inputs = f"sidecar:{sidecar.dtype}x{sidecar.dim}"
    else:
        inputs = "text" if reranker.needs_text else "ids"
    return {
        "reranker": reranker.name,
        "reranker_class": f"{type(reranker).__module__}.{type(reranker).__qualname__}",
        "model_fingerprint": model.fingerprint() if model is not None else None,
        "inputs": inputs,
        "precision": getattr(reranker, "precision", None),
        "device": str(getattr(reranker, "device", None)),  # a GPU's cost model is no guide to the CPU's
        "batch_size": getattr(reranker, "batch_size", None),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "index": index_identity(searcher.searcher, content=False)["signature"][:16],
        "machine": machine_identity(),
    }


def _cache_path(cache_dir: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", str(key["reranker"]))
    return cache_dir / f"{safe_name}-{digest}.json"


def save_calibration(calibration: Calibration, cache_dir: str | os.PathLike | None = None) -> Path:
    """Write ``calibration`` where :func:`calibrate` finds it for its key (replacing what was there); its path."""
    path = _cache_path(Path(cache_dir) if cache_dir is not None else calibration_cache_dir(), calibration.key)
    write_json_atomic(path, calibration.to_dict(), sort_keys=True)
    return path


def calibrate(searcher, *, recalibrate: bool = False, cache_dir: str | os.PathLike | None = None,
              num_queries: int = 3, repeats: int = 5, time_limit_s: float = 60.0,
              cold_cache: bool = False) -> Calibration:
    """The cost model of ``searcher``'s reranker on this machine: read from the cache, or measured and cached.

    A cache entry is used when its key (:func:`calibration_key`) matches and it was measured up to the searcher's
    rerank depth (or the index size, if smaller).

    Args:
        searcher: a :class:`~.searcher.RerankingSearcher` (its reranker, sidecar and index are what is measured).
        recalibrate: measure even when the cache has an entry (and replace it).
        cache_dir: default :func:`calibration_cache_dir`.
        num_queries: calibration queries (the first words of documents spread over the index).
        repeats: rounds of timings (every size on every query); a size's cost is the median of its
            ``num_queries * repeats`` timings.
        time_limit_s: stop measuring larger sizes once this much time is spent (at least two sizes are measured).
        cold_cache: time every run with the sidecar evicted from the page cache first, as a query whose
            candidates no earlier query read: the cost model then buys only depths that fit when reads come from
            storage (a separate cache entry).
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else calibration_cache_dir()
    key = calibration_key(searcher)
    if cold_cache:
        key["page_cache"] = "cold"
    path = _cache_path(cache_dir, key)
    wanted = min(searcher.rerank_depth, searcher.num_docs)
    if not recalibrate and path.is_file():
        try:
            cached = Calibration.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError) as error:
            logger.warning("ignoring unreadable calibration %s (%s); measuring again", path, error)
        else:
            if cached.key == key and cached.max_candidates >= wanted:
                logger.info("calibration of %s from %s: %s", key["reranker"], path, cached.describe())
                return cached
    queries = calibration_queries(searcher, num_queries)
    points = measure_costs(searcher, queries, calibration_sizes(wanted), repeats=repeats,
                           time_limit_s=time_limit_s, cold_cache=cold_cache)
    calibration = Calibration.fit(points, max_candidates=wanted, key=key,
                                  measured_at=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
    measured = ", ".join(f"{n}: {ms:.1f} ms" for n, ms in points)
    logger.info("calibrated %s: %s (%s)", key["reranker"], calibration.describe(), measured)
    if calibration.max_relative_error > NOISY_FIT:
        logger.warning("calibration of %s is noisy: %s does not fit the medians (%s) within %.0f%%; other load "
                       "on this machine skews timings; recalibrate when it is quiet", key["reranker"],
                       calibration.describe(), measured, NOISY_FIT * 100)
    save_calibration(calibration, cache_dir)
    return calibration


# ------------------------------------------------------------------------------------------------ measurement


def calibration_sizes(max_candidates: int) -> list[int]:
    """Candidate counts to measure: :data:`CALIBRATION_SIZES` below ``max_candidates``, and ``max_candidates``."""
    if max_candidates <= 0:
        return []
    return sorted({n for n in CALIBRATION_SIZES if n < max_candidates} | {max_candidates})


def calibration_queries(searcher, count: int) -> list[str]:
    """``count`` queries made of the first words of documents at evenly spaced rows of the index: deterministic,
    available for any index, and with BM25 candidates that resemble a real query's."""
    num_docs = searcher.num_docs
    queries = []
    for i in range(min(count, num_docs)):
        row = (2 * i + 1) * num_docs // (2 * count)
        words = re.findall(r"\w+", document_text(searcher.searcher.doc(row)))[:QUERY_WORDS]
        queries.append(" ".join(words) or "the")
    return queries


def calibration_candidates(searcher, query: str, count: int) -> list:
    """The BM25 top ``count`` for ``query``, topped up with other documents when BM25 finds fewer."""
    hits = [RerankedHit(hit.docid, float(hit.score), int(hit.lucene_docid))
            for hit in searcher.searcher.search(query, k=count)]
    seen = {hit.lucene_docid for hit in hits}
    row = 0
    while len(hits) < count and row < searcher.num_docs:
        if row not in seen:
            hits.append(RerankedHit(searcher.searcher.doc(row).docid(), 0.0, row))
        row += 1
    return hits


def measure_costs(searcher, queries: list[str], sizes: list[int], *, repeats: int = 5,
                  time_limit_s: float = 60.0, cold_cache: bool = False) -> list[tuple[int, float]]:
    """Median rerank-stage time (ms) of one query for each candidate count in ``sizes`` (ascending); with
    ``cold_cache``, each timed run starts with the sidecar evicted from the page cache.

    One untimed warm-up run first (loads pages of the sidecar, allocates buffers). Then ``repeats`` rounds, each
    timing every size on every query: interleaved, so that a burst of load from other processes falls on all sizes
    alike instead of inflating one of them. Sizes that do not fit ``time_limit_s`` in the first round are dropped
    (the line extrapolates to them), and no further round starts once the limit is spent.
    """
    if not sizes or not queries:
        return []
    candidates = {query: calibration_candidates(searcher, query, max(sizes)) for query in queries}
    sidecar = getattr(searcher.reranker, "sidecar", None)
    searcher.rerank_candidates(queries[0], candidates[queries[0]][:min(max(sizes), 250)])
    timings: dict[int, list[float]] = {}
    started = time.perf_counter()
    for round_index in range(max(repeats, 1)):
        if round_index and time.perf_counter() - started > time_limit_s:
            logger.warning("calibration of %s: %d of %d rounds in the %.0f s limit", searcher.reranker.name,
                           round_index, repeats, time_limit_s)
            break
        for size in sizes if round_index == 0 else list(timings):
            if round_index == 0 and len(timings) >= 2 and time.perf_counter() - started > time_limit_s:
                logger.warning("calibration of %s stopped at %d candidates after %.0f s; larger depths are "
                               "extrapolated", searcher.reranker.name, max(timings), time.perf_counter() - started)
                break
            for query in queries:
                head = candidates[query][:size]
                if cold_cache and sidecar is not None:
                    sidecar.evict_from_page_cache()
                begin = time.perf_counter()
                searcher.rerank_candidates(query, head)
                timings.setdefault(size, []).append((time.perf_counter() - begin) * 1000)
    return [(size, statistics.median(values)) for size, values in timings.items()]
