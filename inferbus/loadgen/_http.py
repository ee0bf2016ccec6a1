"""The same closed and open loops over HTTP/1.1 (aiohttp), for peers such as Ray Serve.

A peer gets exactly the bodies an inferbus client sends (MessagePack
``InferRequest``, raw tensors) as the body of ``POST <url>`` and must answer a
MessagePack ``InferResponse``, so one judge checks both. Keep-alive
connections, at most ``concurrency`` (closed loop) or 1024 (open loop) of them.
aiohttp is imported only here: it is an optional dependency (the ``peers``
extra brings it with Ray Serve).
"""

from __future__ import annotations

import asyncio
import math
import time

from ._lean import Target
from ._result import Recorder


class HttpDriver:
    """Closed- and open-loop steps against one HTTP URL; one step at a time."""

    def __init__(self, limit: int = 1024) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit, force_close=False),
                                              headers={"Content-Type": "application/msgpack"})

    async def close(self) -> None:
        await self._session.close()

    async def _one(self, rec: Recorder, target: Target, i: int, t_ref: float, timeout_s: float) -> None:
        body = target.bodies[i % len(target.bodies)]
        try:
            async with self._session.post(target.subject, data=body,
                                          timeout=self._aiohttp.ClientTimeout(total=timeout_s)) as resp:
                data = await resp.read()
                status = resp.status
        except asyncio.TimeoutError:
            rec.record(timeout_s * 1e6, "TIMEOUT")
            return
        except Exception as exc:  # connection refused/reset
            rec.record((time.monotonic() - t_ref) * 1e6, f"HTTP_{type(exc).__name__}")
            return
        now = time.monotonic()
        if status != 200:
            rec.record((now - t_ref) * 1e6, f"HTTP_{status}")
            return
        err, correct, params = target.judge(i, None, data)
        rec.record((now - t_ref) * 1e6, err, correct, params)

    async def closed(self, target: Target, *, concurrency: int, duration_s: float, timeout_s: float = 5.0,
                     start_at: float | None = None, index_base: int = 0) -> tuple[Recorder, float, float]:
        rec = Recorder()
        counter = iter(range(index_base, 10**15))
        if start_at is not None and start_at > time.monotonic():
            await asyncio.sleep(start_at - time.monotonic())
        start = time.monotonic()
        t_end = start + duration_s
        cpu0 = time.process_time()

        async def caller() -> None:
            while time.monotonic() < t_end:
                await self._one(rec, target, next(counter), time.monotonic(), timeout_s)

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return rec, time.monotonic() - start, time.process_time() - cpu0

    async def open(self, target: Target, *, rate_qps: float, duration_s: float, timeout_s: float = 5.0,
                   start_at: float | None = None, tick_s: float = 0.001, index_base: int = 0,
                   phase: float = 0.0, precise: bool = False, timer: bool = False) -> tuple[Recorder, float, float]:
        """Open loop with one task per request (fine at a peer's rates); ``precise`` and ``timer`` are ignored
        (sleep pacing)."""
        self.pacing = "sleep"
        rec = Recorder()
        if start_at is not None and start_at > time.monotonic():
            await asyncio.sleep(start_at - time.monotonic())
        start = time.monotonic() + phase * tick_s
        cpu0 = time.process_time()
        total, per_tick = int(rate_qps * duration_s), rate_qps * tick_s
        tasks: set[asyncio.Task] = set()
        sent = k = 0
        while sent < total:
            t_k = start + k * tick_s
            if t_k > time.monotonic():
                await asyncio.sleep(t_k - time.monotonic())
            due = min(total, math.floor((k + 1) * per_tick))
            while sent < due:
                rec.record_lag((time.monotonic() - t_k) * 1e6)
                t = asyncio.create_task(self._one(rec, target, index_base + sent, t_k, timeout_s))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                sent += 1
            k += 1
        if tasks:
            await asyncio.gather(*tasks)
        return rec, time.monotonic() - start, time.process_time() - cpu0
