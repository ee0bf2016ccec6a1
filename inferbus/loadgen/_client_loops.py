"""Load through the Python SDK (:class:`inferbus.client.Client`), in the caller's event loop.

Used by ``inferbus up --demo`` and by tests that want the SDK's own behaviour
(retries, typed errors) on the path. For measurements use the lean,
multi-process generator (:class:`inferbus.loadgen.GeneratorPool`): these loops
share the event loop with whatever else the caller runs, and the open loop
creates one task per request, which itself saturates a Python process near a
few thousand requests per second.

* closed loop: ``concurrency`` callers, each sending its next request when the
  previous answer arrives;
* open loop: requests sent on a fixed schedule at ``rate_qps`` whatever the
  answers do; latency is measured from the *scheduled* send time, so a stall
  shows up in the tail instead of silently lowering the offered load
  (coordinated omission, Gil Tene, "How NOT to measure latency", 2013).
"""

from __future__ import annotations

import asyncio
import time

from ..schemas import InferbusError
from ._result import BenchResult, Recorder, merge_wire
from ._workload import Workload


def _code(err: InferbusError) -> str:
    return str(getattr(getattr(err, "code", None), "value", type(err).__name__))


def _result(rec: Recorder, model: str, mode: str, conc, rate, elapsed: float, cpu0: float) -> BenchResult:
    return merge_wire([rec.to_wire(elapsed, time.process_time() - cpu0)], model=model, mode=mode,
                      concurrency=conc, rate_qps=rate, target="inferbus")


async def closed_loop(client, work: Workload, *, concurrency: int = 1, duration_s: float = 5.0,
                      timeout_s: float = 1.0, max_requests: int | None = None) -> BenchResult:
    """Run ``concurrency`` callers for ``duration_s`` seconds (or ``max_requests`` in all)."""
    rec = Recorder()
    counter = iter(range(10**12))
    t_end = time.monotonic() + duration_s
    model, version = work.mv.name, work.mv.version

    async def caller() -> None:
        while time.monotonic() < t_end:
            i = next(counter)
            if max_requests is not None and i >= max_requests:
                return
            feed = work.inputs[i % len(work.inputs)]
            t0 = time.perf_counter()
            try:
                res = await client.infer_result(model, feed, version=version, timeout_s=timeout_s)
            except InferbusError as err:
                rec.record((time.perf_counter() - t0) * 1e6, err=_code(err))
                continue
            rec.record((time.perf_counter() - t0) * 1e6, correct=work.check(i, res.outputs), params=res.parameters)

    cpu0 = time.process_time()
    t0 = time.monotonic()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return _result(rec, model, "closed", concurrency, None, time.monotonic() - t0, cpu0)


async def open_loop(client, work: Workload, *, rate_qps: float, duration_s: float = 5.0,
                    timeout_s: float = 1.0) -> BenchResult:
    """Send at a fixed ``rate_qps`` for ``duration_s``; latency counted from each scheduled send time."""
    rec = Recorder()
    model, version = work.mv.name, work.mv.version
    total = int(rate_qps * duration_s)
    interval = 1.0 / rate_qps
    tasks = set()

    async def one(i: int, t_sched: float, lag_us: float) -> None:
        feed = work.inputs[i % len(work.inputs)]
        try:
            res = await client.infer_result(model, feed, version=version, timeout_s=timeout_s)
        except InferbusError as err:
            rec.record((time.perf_counter() - t_sched) * 1e6, err=_code(err))
            return
        rec.record((time.perf_counter() - t_sched) * 1e6, correct=work.check(i, res.outputs), params=res.parameters,
                   send_lag_us=lag_us)

    cpu0 = time.process_time()
    start = time.perf_counter()
    for i in range(total):
        t_sched = start + i * interval
        delay = t_sched - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        lag_us = max(0.0, time.perf_counter() - t_sched) * 1e6  # every send's, the ones that slept too
        rec.record_lag(lag_us)  # (late against the schedule: part of the latency, and a stage of it)
        t = asyncio.create_task(one(i, t_sched, lag_us))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    r = _result(rec, model, "open", None, rate_qps, time.perf_counter() - start, cpu0)
    r.pacing = "sleep"  # a sleep per request (the SDK's loop; no tick timer)
    return r
