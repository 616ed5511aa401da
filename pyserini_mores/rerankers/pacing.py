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
#: A batch is started only when it is predicted to take at most this share of the time left: a batch that runs up to
#: ``1 / DEADLINE_SHARE`` times slower than predicted (another process taking a core mid-batch) still ends in time,
#: and batches shrink toward the deadline, down to one candidate.
DEADLINE_SHARE = 0.5
#: The predicted time of a candidate is this quantile of the recent batches' times per candidate (and at least the
#: last batch's of this query, so that a slowing counts at once) ...
PACE_QUANTILE = 0.9
#: ... over the last this many batches scored under a deadline, by any query.
PACE_WINDOW = 32


class BatchPace:
    """Times per candidate of the recent batches scored under a deadline (the last :data:`PACE_WINDOW`), shared by
    the queries of a searcher and its threads; :meth:`query` starts a query's own account."""

    def __init__(self, window: int = PACE_WINDOW, quantile: float = PACE_QUANTILE):
        if window < 1 or not 0 < quantile <= 1:
            raise ValueError(f"a pace needs a window >= 1 and a quantile in (0, 1], not {window} and {quantile}")
        self.quantile = quantile
        self._seconds_per_candidate: deque[float] = deque(maxlen=window)
        self._lock = threading.Lock()

    def record(self, candidates: int, seconds: float) -> None:
        """Count a batch of ``candidates`` that took ``seconds``."""
        if candidates > 0 and seconds >= 0:
            with self._lock:
                self._seconds_per_candidate.append(seconds / candidates)

    def seconds_per_candidate(self) -> float | None:
        """The :attr:`quantile` (nearest rank) of the recent batches' seconds per candidate; ``None`` before any."""
        with self._lock:
            rates = sorted(self._seconds_per_candidate)
        if not rates:
            return None
        return rates[max(0, math.ceil(self.quantile * len(rates)) - 1)]

    def query(self) -> QueryPace:
        """A new query's account, recording into this pace."""
        return QueryPace(self)


class QueryPace:
    """One query's batches under a deadline: recorded into the shared :class:`BatchPace`, and totalled here so that
    the caller can split the query's time into its scoring batches and the rest (query encoding, text fetch,
    sorting)."""

    def __init__(self, shared: BatchPace | None = None):
        self.shared = shared if shared is not None else BatchPace()
        self.batches, self.candidates, self.seconds = 0, 0, 0.0
        self.last_seconds_per_candidate: float | None = None

    def record(self, candidates: int, seconds: float) -> None:
        self.shared.record(candidates, seconds)
        self.batches += 1
        self.candidates += candidates
        self.seconds += seconds
        self.last_seconds_per_candidate = seconds / candidates

    def seconds_per_candidate(self, prior: float | None) -> float | None:
        """The predicted seconds per candidate of the next batch: the shared quantile, at least this query's last
        batch's; ``prior`` (seconds) before any batch was timed; ``None`` without either."""
        observed = [rate for rate in (self.shared.seconds_per_candidate(), self.last_seconds_per_candidate)
                    if rate is not None]
        return max(observed) if observed else prior


def paced_batches(count: int, batch_size: int, deadline: float, per_candidate_ms: float | None = None, *,
                  pace: QueryPace | None = None) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` batches over ``count`` candidates in order, none started unless it is predicted to take at most
    :data:`DEADLINE_SHARE` of the time left before ``deadline`` (:func:`time.monotonic`). The consumer scores a batch
    before asking for the next one, so the time between two requests is what the batch cost; it is recorded in
    ``pace`` (default: an account of this call alone).

    The prediction is ``pace``'s seconds per candidate (:meth:`QueryPace.seconds_per_candidate`: a high quantile of
    recent batches, at least this query's last); before any batch was timed, ``per_candidate_ms`` (a calibration's;
    ``None``: start the batch if time is left), and the batch is then only a probe of at most
    :data:`DEADLINE_PROBE`. Each batch holds as many candidates as fit (at least one, else scoring stops), at most
    ``batch_size`` and, so that stopping between batches keeps close to the deadline, a :data:`DEADLINE_SLICES`-th
    of ``count`` (not below :data:`DEADLINE_PROBE`)."""
    pace = pace if pace is not None else QueryPace()
    size = max(1, min(batch_size, max(DEADLINE_PROBE, math.ceil(count / DEADLINE_SLICES))))
    prior = max(per_candidate_ms, 0.0) / 1000 if per_candidate_ms is not None else None
    start = 0
    while start < count:
        now = time.monotonic()
        left = deadline - now
        if left <= 0:
            return
        seconds_per_candidate = pace.seconds_per_candidate(prior)
        wanted = min(size, count - start)
        if pace.shared.seconds_per_candidate() is None and pace.batches == 0:
            wanted = min(wanted, DEADLINE_PROBE)
        if seconds_per_candidate:
            fitting = DEADLINE_SHARE * left / seconds_per_candidate
            if fitting < wanted:  # (a hair over: a prediction that fits exactly is not lost to rounding)
                wanted = int(fitting + 1e-9)
        if wanted < 1:
            return
        yield start, start + wanted
        pace.record(wanted, time.monotonic() - now)
        start += wanted
