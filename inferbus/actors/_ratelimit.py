"""Token-bucket rate limits: one global bucket and one per client id (``Inferbus-Client-Id``).

The token bucket (Turner, 1986; the shaping algorithm of RFC 2697/2698 and of
most API gateways): a bucket holds at most ``burst`` tokens and refills at
``rate_per_s`` tokens per second; a request takes one token or is refused.
``burst`` above the sustained rate is what lets a client go faster for a while:
a client sending at ``R > rate_per_s`` from a full bucket is served at ``R`` for

    burst / (R - rate_per_s)  seconds,

then at ``rate_per_s``. So "120k requests/s for 10 s, then throttle to 20k/s" is
``rate_per_s=20_000, burst=(120_000 - 20_000) * 10 = 1_000_000``.

A refused request gets RESOURCE_EXHAUSTED at once, with ``retry_after_ms`` = the
time until the bucket holds one token again (rounded up to a whole ms).

Per-client buckets are kept in an LRU of ``max_clients`` entries; a client that
falls out returns with a full bucket (the price of bounded memory). Requests
without a client id share one bucket under the empty id. Each ingress replica
keeps its own buckets: the node divides its limits (global and per client) by
its number of ingress replicas (the queue group spreads requests evenly), a
divided burst kept at >= 1. Limits are per node, not per cluster: N nodes on
one NATS admit N times the limits.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict


class TokenBucket:
    """A token bucket on the monotonic clock. Not thread-safe (one event loop).

    Args:
        rate_per_s: refill rate, tokens per second (> 0).
        burst: capacity in tokens (>= 1); the bucket starts full.

    Raises:
        ValueError: ``rate_per_s <= 0`` or ``burst < 1``.
    """

    __slots__ = ("rate_per_s", "burst", "tokens", "stamp")

    def __init__(self, rate_per_s: float, burst: float, now: float | None = None) -> None:
        if not rate_per_s > 0:
            raise ValueError("TokenBucket.rate_per_s must be > 0 tokens per second")
        if not burst >= 1:
            raise ValueError("TokenBucket.burst must be >= 1 token")
        self.rate_per_s = float(rate_per_s)
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic() if now is None else now

    def take(self, now: float, n: float = 1.0) -> float:
        """Take ``n`` tokens if the bucket holds them.

        Returns:
            0.0 when taken; otherwise the seconds until ``n`` tokens will be there
            (nothing is taken).
        """
        elapsed = now - self.stamp
        tokens = self.tokens + (elapsed if elapsed > 0 else 0.0) * self.rate_per_s
        if tokens > self.burst:
            tokens = self.burst
        self.stamp = now
        if tokens >= n:
            self.tokens = tokens - n
            return 0.0
        self.tokens = tokens
        return (n - tokens) / self.rate_per_s

    def full(self, now: float) -> bool:
        """True when the bucket would be full at ``now`` (forgetting it changes nothing)."""
        return self.tokens + (now - self.stamp) * self.rate_per_s >= self.burst


class RateLimiter:
    """The ingress's limits: a global bucket and a bucket per client id; either may be off.

    Args:
        rate_per_s / burst: global limit (``rate_per_s <= 0`` = no global limit;
            ``burst`` 0 = one second's worth of ``rate_per_s``).
        client_rate_per_s / client_burst: per-client limit, same conventions.
        max_clients: per-client buckets kept (LRU).
    """

    def __init__(self, rate_per_s: float = 0.0, burst: float = 0.0, client_rate_per_s: float = 0.0,
                 client_burst: float = 0.0, max_clients: int = 100_000) -> None:
        self.global_bucket = TokenBucket(rate_per_s, burst or max(rate_per_s, 1.0)) if rate_per_s > 0 else None
        self.client_rate_per_s = client_rate_per_s
        self.client_burst = client_burst or max(client_rate_per_s, 1.0)
        self.max_clients = max_clients
        self.clients: OrderedDict[str, TokenBucket] = OrderedDict()
        self.refused_global = 0
        self.refused_client = 0

    @property
    def enabled(self) -> bool:
        return self.global_bucket is not None or self.client_rate_per_s > 0

    def check(self, client_id: str | None, now: float | None = None) -> tuple[str, int] | None:
        """Admit one request, or say why not.

        The client's bucket is checked first, so a client over its own limit does not
        spend global tokens; a request refused globally gives its client token back.

        Returns:
            None when admitted; else ``(scope, retry_after_ms)`` with scope ``"client"``
            or ``"global"`` and the wait in whole milliseconds (>= 1).
        """
        now = time.monotonic() if now is None else now
        bucket = None
        if self.client_rate_per_s > 0:
            key = client_id or ""
            bucket = self.clients.get(key)
            if bucket is None:
                bucket = self.clients[key] = TokenBucket(self.client_rate_per_s, self.client_burst, now)
                if len(self.clients) > self.max_clients:
                    self._evict(now)
            else:
                self.clients.move_to_end(key)
            wait = bucket.take(now)
            if wait:
                self.refused_client += 1
                return "client", max(1, math.ceil(wait * 1000))
        if self.global_bucket is not None:
            wait = self.global_bucket.take(now)
            if wait:
                if bucket is not None:
                    bucket.tokens = min(bucket.tokens + 1.0, bucket.burst)
                self.refused_global += 1
                return "global", max(1, math.ceil(wait * 1000))
        return None

    def _evict(self, now: float) -> None:
        # drop the least recently used; prefer buckets that are full anyway (no state is lost)
        for key in list(self.clients)[:16]:
            if self.clients[key].full(now):
                del self.clients[key]
                return
        self.clients.popitem(last=False)

    def stats(self) -> dict:
        """Refusals, clients tracked, global tokens left, and this limiter's rates (req/s) and bursts (requests)."""
        g = self.global_bucket
        return {"refused_global": self.refused_global, "refused_client": self.refused_client,
                "clients": len(self.clients),
                "rate_per_s": g.rate_per_s if g is not None else 0.0, "burst": g.burst if g is not None else 0.0,
                "client_rate_per_s": self.client_rate_per_s,
                "client_burst": self.client_burst if self.client_rate_per_s > 0 else 0.0,
                "global_tokens": None if self.global_bucket is None else int(self.global_bucket.tokens)}
