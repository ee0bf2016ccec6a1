"""Hedged requests: policy parsing, observed latency quantiles, the hedge budget.

A hedged request (Dean & Barroso, "The Tail at Scale", CACM 2013) is sent to a
second worker when the first has not answered after a delay; the first answer
wins. The delay is either fixed (``hedge_after_ms`` in the model's config, or
the ``Inferbus-Hedge`` request header) or a quantile of the latency this ingress
observed for the model version (forward → completion notice), by default p95 —
so about 5 % of requests are hedged while latencies are stable.

Policies, as written in ``config.json`` (``"hedge_after_ms"``) or in the
``Inferbus-Hedge`` header (the header wins over the model's setting):

=================  ==========================================================
``null`` / absent   model default (for the header); no hedging (for a model)
``"off"``           no hedging for this request
``12.5`` / ``"12.5"``  hedge after 12.5 ms (> 0)
``"p95"``, ``"p99"``, ``"auto"`` (= p95)   hedge after the observed quantile; no hedge
                    until ``MIN_SAMPLES`` latencies were seen
=================  ==========================================================

The hedge budget caps hedges at a fraction of requests (default 10 %): each
forwarded request earns ``ratio`` of a hedge token (at most ``burst`` tokens
kept), a hedge spends one. Without it, a slow period would double the load
exactly when the workers can least afford it.
"""

from __future__ import annotations

import time
from collections import deque

from ..schemas._hedge_policy import HedgePolicyError, parse_policy  # noqa: F401 (re-exported)

MIN_SAMPLES = 20
"""Latencies needed before a quantile policy hedges."""
MIN_DELAY_MS = 0.5
"""Floor of any hedge delay, ms (event-loop timers are not finer than this)."""
_RECOMPUTE_S = 0.1


class LatencyWindow:
    """The last ``size`` latencies of one model version (µs), with cached quantiles.

    Quantiles are recomputed at most every 100 ms (sorting ``size`` floats), so
    reading one on every request costs a dict lookup.
    """

    __slots__ = ("samples", "_cache", "_stamp")

    def __init__(self, size: int = 512) -> None:
        self.samples: deque[float] = deque(maxlen=size)
        self._cache: dict[float, float] = {}
        self._stamp = 0.0

    def add(self, latency_us: float) -> None:
        self.samples.append(latency_us)

    def clear(self) -> None:
        """Forget every latency (the version was unloaded: a quantile policy waits for ``MIN_SAMPLES`` again)."""
        self.samples.clear()
        self._cache.clear()

    def quantile(self, q: float, now: float | None = None) -> float | None:
        """The ``q`` quantile in µs (nearest rank), or None with fewer than ``MIN_SAMPLES``."""
        n = len(self.samples)
        if n < MIN_SAMPLES:
            return None
        now = time.monotonic() if now is None else now
        if now - self._stamp > _RECOMPUTE_S:
            self._cache.clear()
            self._stamp = now
        v = self._cache.get(q)
        if v is None:
            ordered = sorted(self.samples)
            v = self._cache[q] = ordered[min(n - 1, int(q * n))]
        return v


class HedgeBudget:
    """Hedges allowed as a fraction of requests (a token bucket refilled per request, not per second).

    Args:
        ratio: hedge tokens earned per forwarded request (0..1; 0 forbids hedging, 1 allows one per request).
        burst: tokens kept at most (>= 1).
    """

    __slots__ = ("ratio", "burst", "tokens", "refused")

    def __init__(self, ratio: float = 0.1, burst: float = 10.0) -> None:
        self.ratio = ratio
        self.burst = burst
        self.tokens = burst
        self.refused = 0

    def on_request(self) -> None:
        t = self.tokens + self.ratio
        self.tokens = t if t < self.burst else self.burst

    def try_spend(self) -> bool:
        if self.tokens >= 1.0 - 1e-9:  # 10 x 0.1 must make a whole token despite float rounding
            self.tokens = max(self.tokens - 1.0, 0.0)
            return True
        self.refused += 1
        return False
