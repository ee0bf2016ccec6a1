"""The aggregator actor: fills the L2 result cache (Valkey / any Redis) from completed results.

Fills arrive on ``<p>._cache.fill`` (queue group, so several aggregators share
them) and are written with ``SET key value PX ttl``, coalesced into one
pipeline per batch of queued fills so a burst costs one round trip. A Redis
outage loses cache fills only (counted in ``fill_errors``), never answers.

A fill is written with an absolute expiry, ``SET key value PXAT expires_unix_ms``: the time its ingress sends with
it (:class:`~inferbus.schemas._internal.CacheFill`, the answer's arrival plus the model's ``cache_ttl_ms``), so that
the time a fill spent anywhere on its way counts against it. A fill whose time has passed when its pipeline is
built is not written (``expired``), and a ``SET`` that Valkey runs late (it was stopped with the pipeline sent)
expires when it should. Before 2026-12-05 the TTL was counted from the fill's arrival in this process: fills that
waited in the bus while the aggregator was stopped (SIGSTOP) were written with their whole TTL when it woke, and
answers with a 100 ms TTL were L2 hits 6 s after they were computed (a fresh-user trial; before that, from when
the pipeline was built, which a 0.9 s Valkey stall stretched likewise). PXAT reads Valkey's clock: across hosts,
their clocks' skew moves an entry's expiry by as much. A fill from an older ingress (no expiry) keeps the former
rule. A ``ttl_ms`` over :data:`~inferbus.actors._repository.MAX_CACHE_TTL_MS` (a day, the most a model's config
can give) is written as that.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..bus import Subjects, close_connection
from ..schemas._internal import CacheFill, InternalDecodeError, decode_internal
from .._version import __version__
from ._common import announce_ready, connect_logged, log, run_actor, serving_gc, set_affinity, supervise_loops
from ._config import AggregatorConfig
from ._repository import MAX_CACHE_TTL_MS

_MAX_PIPELINE = 512
FAIL_LOG_PERIOD_S = 10.0
"""While cache fills keep failing (Redis down), the aggregator logs one line per this many seconds."""
STOP_WRITE_S = 1.0
"""At a stop, how long the aggregator keeps writing the cache fills already queued (s); what is left is dropped (a
cache fill is an optimisation: the next miss of that request fills it again)."""


class Aggregator:
    def __init__(self, config: AggregatorConfig) -> None:
        self.config = config
        self.subjects = Subjects(config.bus.prefix)
        self.queue: asyncio.Queue[tuple[float, CacheFill]] = asyncio.Queue(maxsize=100_000)
        """(monotonic time the fill arrived, the fill)."""
        self.stats = {"fills": 0, "fill_errors": 0, "dropped": 0, "expired": 0}
        self.redis = None
        self._failing = 0
        """Fills lost since the first failure of the current outage (0: none failing)."""
        self._fail_logged_at = float("-inf")
        self._outage_base = (0, 0)
        """``stats["expired"]`` and ``stats["dropped"]`` at an outage's first failed write: the resumed line counts
        the fills that expired or were dropped behind the failing writes as lost to it too (a fresh-user trial: 300
        fills lost, 284 of them expired in the queue, the line said 16)."""

    async def _on_fill(self, msg) -> None:
        try:
            fill = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if isinstance(fill, CacheFill):
            try:
                self.queue.put_nowait((time.monotonic(), fill))
            except asyncio.QueueFull:
                self.stats["dropped"] += 1

    def _stats_data(self, endpoint_stats) -> dict:
        """``data`` of the ``cache-fill`` endpoint in ``$SRV.STATS``: ``fills`` written, ``fill_errors`` (lost to
        a Redis failure), ``dropped`` (queue full), ``expired`` (their TTL ran out while they waited in the queue)
        since start, and ``queued`` fills waiting now."""
        return {**self.stats, "queued": self.queue.qsize()}

    async def _writer(self) -> None:
        while True:
            first = await self.queue.get()
            batch = [first]
            while len(batch) < _MAX_PIPELINE and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            if self.redis is None:
                continue
            now = time.monotonic()
            now_unix_ms = time.time() * 1000.0
            writes = []
            for t_in, f in batch:
                if f.expires_unix_ms:  # an absolute expiry: what is left of it now, at most a day
                    at_ms = int(min(f.expires_unix_ms, now_unix_ms + MAX_CACHE_TTL_MS))
                    if at_ms - now_unix_ms >= 1:
                        writes.append((f, None, at_ms))
                    continue
                px = int(min(f.ttl_ms, MAX_CACHE_TTL_MS) - (now - t_in) * 1000.0)
                if px >= 1:
                    writes.append((f, px, None))
            self.stats["expired"] += len(batch) - len(writes)
            if not writes:
                continue
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for f, px, at_ms in writes:
                        pipe.set(f"{self.subjects.prefix}:{f.key}", f.response, px=px, pxat=at_ms)
                    await pipe.execute()
                self.stats["fills"] += len(writes)
                if self._failing:
                    expired = self.stats["expired"] - self._outage_base[0]
                    dropped = self.stats["dropped"] - self._outage_base[1]
                    log(f"aggregator: cache fills resumed ({self._failing + expired + dropped} lost to the failure: "
                        f"{self._failing} refused or timed out, {expired} expired and {dropped} dropped while they "
                        f"waited)", logging.INFO)
                    self._failing = 0
            except Exception as exc:
                self.stats["fill_errors"] += len(writes)
                self._fill_failed(exc, len(writes))

    def _fill_failed(self, exc: Exception, lost: int) -> None:
        """Log a failed fill: the first of an outage, then one line per :data:`FAIL_LOG_PERIOD_S` with the count
        (one line per failed batch wrote 1,172 lines in a 30 s Valkey outage at 40 requests/s; a fresh-user trial)."""
        now = time.monotonic()
        first = not self._failing
        if first:  # what expired or was dropped from here on waited behind the failing writes
            self._outage_base = (self.stats["expired"], self.stats["dropped"])
        self._failing += lost
        if first or now - self._fail_logged_at >= FAIL_LOG_PERIOD_S:
            self._fail_logged_at = now
            log(f"aggregator: cache fill failed: {exc!r} ({self._failing} fill(s) lost since the first failure"
                f"{'' if first else '; logged once per ' + format(FAIL_LOG_PERIOD_S, 'g') + ' s'})")

    async def run(self) -> None:
        set_affinity(self.config.cpu_affinity)
        self.nc = await connect_logged(self.config.bus, f"aggregator-{self.config.aggregator_id}")
        if self.config.redis_url:
            import redis.asyncio as aioredis

            self.redis = aioredis.from_url(self.config.redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        from nats.micro import add_service

        svc = await add_service(self.nc, name="inferbus-aggregator", version=__version__,
                                description="inferbus aggregator (L2 cache fill)",
                                metadata={"aggregator_id": self.config.aggregator_id},
                                stats_handler=self._stats_data)
        await svc.add_endpoint(name="cache-fill", subject=self.subjects.cache_fill,
                               queue_group=f"{self.config.bus.prefix}.aggregator",
                               handler=lambda r: self._on_fill(r._msg))
        loops = await supervise_loops(f"aggregator-{self.config.aggregator_id}", {"writer": self._writer})
        await self.nc.flush()
        serving_gc()
        announce_ready()
        serving = asyncio.ensure_future(loops.run())
        try:
            # returns only by escalation (IntensityExceeded): the process then exits abnormally. Waited for, not
            # awaited: a SIGTERM cancels this task alone, and the writer keeps writing what is queued below (a
            # cancelled run() stops the loops at once)
            await asyncio.wait({serving})
            serving.result()
        finally:
            t0 = time.monotonic()
            log(f"aggregator {self.config.aggregator_id}: draining: {self.queue.qsize()} cache fills to write (at "
                f"most {STOP_WRITE_S:g} s)", logging.INFO)
            # the node stops the aggregator last, after the ingresses and workers that send it fills: what is
            # queued is written before the writer stops, within the bound
            try:
                while not self.queue.empty() and time.monotonic() - t0 < STOP_WRITE_S:
                    await asyncio.sleep(0.005)
            except asyncio.CancelledError:  # a second SIGTERM: the rest is dropped, the close follows
                pass
            left = self.queue.qsize()
            await loops.stop()
            serving.cancel()  # (done already unless a bound cut the loops' stop short)
            await asyncio.gather(serving, return_exceptions=True)
            try:
                await svc.stop()
            except Exception:
                pass
            # 1 s to drain, then closed; a second SIGTERM cuts the drain short, the close still follows
            await close_connection(self.nc, drain=True, drain_timeout_s=1.0)
            log(f"aggregator {self.config.aggregator_id}: stopped {time.monotonic() - t0:.2f} s after its drain "
                f"began; {left} cache fills dropped unwritten", logging.INFO)


def main(config_json: str) -> None:
    """Process entry: ``python -m inferbus.actors aggregator '<AggregatorConfig JSON>'``."""
    cfg = AggregatorConfig.from_json(config_json)
    run_actor(Aggregator(cfg).run)
