"""Deadline pacing of a query's scoring batches: how many candidates the next batch may hold so that it ends before
the deadline, predicted from the times of recent batches, this query's and earlier queries'."""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterator

#: Under a deadline, a query's candidates are scored in at least this many batches (fewer only when they would be
#: smaller than :data:`DEADLINE_PROBE`), so that stopping between batches can keep close to the deadline.
DEADLINE_SLICES = 4
#: Before any batch has been timed, the first batch is a probe of at most this many candidates: on a cold sidecar the
#: first reads cost many times what a warm calibration measured.
DEADLINE_PROBE = 16
#: A batch of several candidates is started only when it is predicted to take at most this share of the time left: one
#: that runs up to ``1 / DEADLINE_SHARE`` times slower than predicted (another process taking a core mid-batch) still
#: ends in time, and batches shrink toward the deadline; the last, of one candidate, may take all the time left.
DEADLINE_SHARE = 0.5
#: A batch of ``n`` candidates is predicted to take the line ``overhead + per_candidate * n`` fitted to the recent
#: batches, times this quantile of their observed / fitted ratios (their spread; and at least this query's last
#: batch's ratio, so that a slowing counts at once) ...
PACE_QUANTILE = 0.95
#: ... over the last this many batches scored under a deadline, by any query.
PACE_WINDOW = 32


class BatchPace:
    """The recent batches scored under a deadline (the last :data:`PACE_WINDOW`: candidates and seconds), shared by
    the queries of a searcher and its threads, and the batch time they predict (:meth:`predictor`); :meth:`query`
    starts a query's own account."""

    def __init__(self, window: int = PACE_WINDOW, quantile: float = PACE_QUANTILE):
        if window < 1 or not 0 < quantile <= 1:
            raise ValueError(f"a pace needs a window >= 1 and a quantile in (0, 1], not {window} and {quantile}")
        self.quantile = quantile
        self._batches: deque[tuple[int, float]] = deque(maxlen=window)
        self._lock = threading.Lock()

    def record(self, candidates: int, seconds: float) -> None:
        """Count a batch of ``candidates`` that took ``seconds``."""
        if candidates > 0 and seconds >= 0:
            with self._lock:
                self._batches.append((candidates, seconds))

    def timed(self) -> bool:
        """Whether any batch is recorded."""
        return bool(self._batches)

    def predictor(self) -> BatchPrediction | None:
        """The batch time the recent batches predict; ``None`` before any."""
        with self._lock:
            batches = list(self._batches)
        if not batches:
            return None
        overhead, per_candidate = fit_batch_line(batches)
        ratios = sorted(seconds / (overhead + per_candidate * n) for n, seconds in batches
                        if overhead + per_candidate * n > 0)
        margin = ratios[max(0, math.ceil(self.quantile * len(ratios)) - 1)] if ratios else 1.0
        return BatchPrediction(overhead, per_candidate, margin)

    def query(self) -> QueryPace:
        """A new query's account, recording into this pace."""
        return QueryPace(self)


class BatchPrediction:
    """``margin * (overhead + per_candidate * n)`` seconds for a batch of ``n`` candidates."""

    def __init__(self, overhead: float, per_candidate: float, margin: float = 1.0):
        self.overhead, self.per_candidate, self.margin = overhead, per_candidate, margin

    def seconds(self, candidates: int) -> float:
        return self.margin * (self.overhead + self.per_candidate * candidates)

    def ratio(self, candidates: int, seconds: float) -> float:
        """How much longer than the line (without the margin) a batch took."""
        line = self.overhead + self.per_candidate * candidates
        return seconds / line if line > 0 else 1.0

    def candidates_within(self, seconds: float) -> float:
        """The (fractional) number of candidates predicted to take ``seconds``; ``inf`` when they cost nothing."""
        if self.per_candidate <= 0:
            return math.inf if self.seconds(1) <= seconds else 0.0
        return max(0.0, (seconds / self.margin - self.overhead) / self.per_candidate)


def fit_batch_line(batches: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``(overhead, per_candidate)`` seconds through ``(candidates, seconds)`` batches, both >= 0; through
    the origin (all of it per candidate, the cautious reading) when the sizes do not tell them apart or the fit
    would give a negative coefficient."""
    sizes = [n for n, _ in batches]
    through_origin = 0.0, sum(n * t for n, t in batches) / sum(n * n for n in sizes)
    if len(set(sizes)) < 2:
        return through_origin
    mean_n, mean_t = sum(sizes) / len(sizes), sum(t for _, t in batches) / len(batches)
    slope = sum((n - mean_n) * (t - mean_t) for n, t in batches) / sum((n - mean_n) ** 2 for n in sizes)
    intercept = mean_t - slope * mean_n
    return through_origin if slope <= 0 or intercept < 0 else (intercept, slope)


class QueryPace:
    """One query's batches under a deadline: recorded into the shared :class:`BatchPace`, and totalled here so that
    the caller can split the query's time into its scoring batches and the rest (query encoding, text fetch,
    sorting)."""

    def __init__(self, shared: BatchPace | None = None):
        self.shared = shared if shared is not None else BatchPace()
        self.batches, self.candidates, self.seconds = 0, 0, 0.0
        self._last: tuple[int, float] | None = None

    def record(self, candidates: int, seconds: float) -> None:
        self.shared.record(candidates, seconds)
        self.batches += 1
        self.candidates += candidates
        self.seconds += seconds
        self._last = candidates, seconds

    def predictor(self, prior_per_candidate: float | None) -> BatchPrediction | None:
        """The shared pace's prediction, its margin at least this query's last batch's ratio to the line;
        ``prior_per_candidate`` seconds (no overhead) before any batch was timed; ``None`` without either."""
        prediction = self.shared.predictor()
        if prediction is None:
            return BatchPrediction(0.0, prior_per_candidate) if prior_per_candidate is not None else None
        if self._last is not None:
            prediction.margin = max(prediction.margin, prediction.ratio(*self._last))
        return prediction


def paced_batches(count: int, batch_size: int, deadline: float, per_candidate_ms: float | None = None, *,
                  pace: QueryPace | None = None) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` batches over ``count`` candidates in order, none started unless it is predicted to end before
    ``deadline`` (:func:`time.monotonic`), and one of several candidates only when predicted to take at most
    :data:`DEADLINE_SHARE` of the time left. The consumer scores a batch before asking for the next one, so the time
    between two requests is what the batch cost; it is recorded in ``pace`` (default: an account of this call alone).

    The prediction is ``pace``'s (:meth:`QueryPace.predictor`: a line fitted to recent batches, times a high quantile
    of their spread around it); before any batch was timed, ``per_candidate_ms`` (a calibration's; ``None``: start
    the batch if time is left), and the batch is then only a probe of at most :data:`DEADLINE_PROBE`. Each batch
    holds as many candidates as fit, at most ``batch_size`` and, so that stopping between batches keeps close to the
    deadline, a :data:`DEADLINE_SLICES`-th of ``count`` (not below :data:`DEADLINE_PROBE`)."""
    pace = pace if pace is not None else QueryPace()
    size = max(1, min(batch_size, max(DEADLINE_PROBE, math.ceil(count / DEADLINE_SLICES))))
    prior = max(per_candidate_ms, 0.0) / 1000 if per_candidate_ms is not None else None
    start = 0
    while start < count:
        now = time.monotonic()
        left = deadline - now
        if left <= 0:
            return
        wanted = min(size, count - start)
        if pace.batches == 0 and not pace.shared.timed():
            wanted = min(wanted, DEADLINE_PROBE)
        prediction = pace.predictor(prior)
        if prediction is not None:
            # (a hair over: a prediction that fits exactly is not lost to rounding)
            within_share = prediction.candidates_within(DEADLINE_SHARE * left) + 1e-9
            if within_share < wanted:
                wanted = int(within_share) if within_share >= 1 else \
                    min(1, int(prediction.candidates_within(left) + 1e-9))
        if wanted < 1:
            return
        yield start, start + wanted
        pace.record(wanted, time.monotonic() - now)
        start += wanted
