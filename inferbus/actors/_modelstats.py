"""Per-model-version counts for Prometheus (``inferbus up --metrics-port``; docs/observability.md): the ingress's
forward-latency histogram, the worker's batch-size and compute-duration histograms.

The request path only records raw values in plain Python lists (one ``list.append`` per forward settled at the
ingress, one per model run at the worker: the cheapest thing Python can do per request, a handful of bytecodes
and no Python call); they are **folded** into fixed cumulative buckets off the request path: at every
``$SRV.STATS`` answer (so a scrape sees every value recorded before it, exactly) and on a timer (the ingress's
sweep, every 50 ms; the worker's load report, every ``report_interval_ms``), which bounds what waits in the lists.
A fold sorts the values and counts each bound with ``bisect`` (C calls: its bytecodes grow with the models and the
bounds, not with the values folded). No prometheus-client object is touched on the request path.

Buckets are fixed, so that the series of every process and every version can be summed in PromQL
(``histogram_quantile(0.99, sum by (le) (rate(inferbus_forward_latency_seconds_bucket[5m])))``).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from operator import itemgetter

from ._hedge import LatencyWindow

LATENCY_BOUNDS_US = (50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000,
                     1_000_000, 2_000_000, 5_000_000)
"""Upper bounds (``le``) of the latency and compute-duration buckets in µs, the unit the actors measure in; ``+Inf``
follows. A 1-2-5 series from 50 µs to 5 s, 16 buckets. 50 µs: a forward takes at least the model's run, the
answer's encoding and the hand-over back, so only a small model's compute runs fall under it (into the first
bucket). 5 s: five times the default request budget (``--default-timeout-ms``, 1 s; a client may ask for a longer
one: such forwards land in ``+Inf``). Three buckets per decade keep a quantile estimated from them
(``histogram_quantile``) within one bucket's width, a factor of 2 to 2.5, as Prometheus's own default buckets (a
1-2.5-5 series) do, at 17 series per model version, histogram and process."""
LATENCY_BOUNDS_S = tuple(b / 1e6 for b in LATENCY_BOUNDS_US)
"""The same bounds in seconds, as exported (``le="5e-05"`` ... ``le="5.0"``)."""
BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Upper bounds (``le``, requests per model run) of the batch-size buckets; ``+Inf`` follows. Powers of two to 1024
(a model's ``max_batch_size`` caps the rows of a run; larger runs land in ``+Inf``)."""


def _cumulative(bounds: tuple, ordered: list) -> list[int]:
    """How many of the sorted values ``ordered`` are ``<=`` each bound (Prometheus's ``le``)."""
    return [bisect_right(ordered, b) for b in bounds]


def _add(into: list[int], more: list[int]) -> None:
    for i, v in enumerate(more):
        into[i] += v


class ForwardStats(LatencyWindow):
    """One model version at one ingress: the hedging policy's latency window (:class:`LatencyWindow`, the last 512
    forwards) and, for Prometheus, a cumulative histogram of every successful forward's latency (forward to
    completion, µs), with the version's cache hits and error answers.

    ``Ingress._observe`` appends each latency to ``samples`` (the window) and to ``pending`` (not yet folded into
    the histogram); :meth:`fold` moves ``pending`` into ``le_counts``/``count``/``sum_us`` and stamps ``last_ms``.
    The ingress runs on one event loop: nothing here is shared with another thread. When the version is unloaded the
    ingress keeps the object for the life of the process with its window emptied (``Ingress._retire_forward_stats``):
    the counts are monotonic across unload and re-load, as Prometheus counters must be.
    """

    __slots__ = ("pending", "le_counts", "count", "sum_us", "last_ms")

    def __init__(self, size: int = 512) -> None:
        super().__init__(size)
        self.pending: list[float] = []
        self.le_counts = [0] * len(LATENCY_BOUNDS_US)
        """Forwards with a latency ``<=`` each of :data:`LATENCY_BOUNDS_US` (cumulative, as Prometheus's buckets)."""
        self.count = 0
        """Forwards folded (the ``+Inf`` bucket and ``_count``)."""
        self.sum_us = 0.0
        self.last_ms = 0
        """When the last fold that took a latency ran, ms since the Unix epoch (0: none yet): within one fold interval
        (the ingress's 50 ms sweep, or a ``$SRV.STATS`` answer) after the latest successful forward completed, read
        off the request path (the HTTP statistics extension's ``last_inference``, docs/http.md)."""

    def add(self, latency_us: float) -> None:
        self.samples.append(latency_us)
        self.pending.append(latency_us)

    def fold(self) -> None:
        """Count the pending latencies into the histogram."""
        buf = self.pending
        if not buf:
            return
        self.pending = []
        buf.sort()
        _add(self.le_counts, _cumulative(LATENCY_BOUNDS_US, buf))
        self.count += len(buf)
        self.sum_us += sum(buf)
        self.last_ms = int(time.time() * 1000)

    def histogram(self) -> dict:
        """``{"le": [cumulative count per bound], "count": n, "sum_us": µs, "last_ms": ms since the epoch}`` (call
        :meth:`fold` first)."""
        return {"le": list(self.le_counts), "count": self.count, "sum_us": self.sum_us, "last_ms": self.last_ms}


class RunStats:
    """The model runs of one model version at one worker: a histogram of requests per run (batch size) and one of
    the run's compute time (wall clock, µs, as ``parameters.timings_us.compute``), folded from the worker's list of
    runs (:func:`fold_runs`)."""

    __slots__ = ("batch_le", "runs", "requests", "compute_le", "compute_sum_us")

    def __init__(self) -> None:
        self.batch_le = [0] * len(BATCH_BOUNDS)
        self.runs = 0
        """Model runs (the histograms' ``_count``)."""
        self.requests = 0
        """Requests computed in them (the batch-size histogram's ``_sum``)."""
        self.compute_le = [0] * len(LATENCY_BOUNDS_US)
        self.compute_sum_us = 0

    def as_dict(self) -> dict:
        return {"runs": self.runs, "requests": self.requests, "batch_le": list(self.batch_le),
                "compute_le": list(self.compute_le), "compute_sum_us": self.compute_sum_us}


_KEY, _N, _US = itemgetter(0), itemgetter(1), itemgetter(2)


def fold_runs(runs: list, into: dict[str, RunStats]) -> None:
    """Fold the worker's recorded runs, ``(model key, requests, compute µs)`` tuples appended by ``Worker._account``
    (on the event loop or the inference thread), into ``into`` (model key → :class:`RunStats`).

    Takes the runs recorded so far off the front of ``runs`` with two C calls (a slice and its deletion, each
    atomic under the GIL): a run the inference thread appends meanwhile lands after them and waits for the next
    fold, never lost or counted twice. Call on one thread only (the worker's event loop)."""
    n = len(runs)
    if not n:
        return
    taken = runs[:n]
    del runs[:n]
    taken.sort(key=_KEY)
    keys = list(map(_KEY, taken))
    lo = 0
    while lo < n:
        key = keys[lo]
        hi = bisect_right(keys, key, lo)
        group = taken[lo:hi]
        st = into.get(key)
        if st is None:
            st = into[key] = RunStats()
        sizes = sorted(map(_N, group))
        us = sorted(map(_US, group))
        _add(st.batch_le, _cumulative(BATCH_BOUNDS, sizes))
        _add(st.compute_le, _cumulative(LATENCY_BOUNDS_US, us))
        st.runs += hi - lo
        st.requests += sum(sizes)
        st.compute_sum_us += sum(us)
        lo = hi


__all__ = ["BATCH_BOUNDS", "LATENCY_BOUNDS_S", "LATENCY_BOUNDS_US", "ForwardStats", "RunStats", "fold_runs"]
