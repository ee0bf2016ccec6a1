"""Load generator for ``inferbus bench`` and ``inferbus up --demo``.

Two modes, both checked answer by answer against an in-process ONNX Runtime
reference of the same model version:

* closed loop: ``concurrency`` callers, each sending its next request when the
  previous answer arrives (measures latency at a given parallelism);
* open loop: requests sent on a fixed schedule at ``rate_qps`` whatever the
  answers do; latency is measured from the *scheduled* send time, so a stall
  shows up in the tail instead of silently lowering the offered load
  (coordinated omission, Gil Tene, "How NOT to measure latency", 2013).

Latencies go into an HDR histogram (``hdrhistogram``; 1 µs .. 60 s, 3
significant digits). Inputs replay the model's shipped dataset rows
(``models/<name>/data/test.npz``); ``distinct=True`` perturbs each request so
that no two are equal (cache misses), ``distinct=False`` repeats one row
(cache hits).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from hdrh.histogram import HdrHistogram

from .accelerators import OnnxRuntimeBackend
from .accelerators._dtypes import numpy_dtype_for
from .actors._repository import ModelRepository
from .schemas import InferbusError

PERCENTILES = (50.0, 95.0, 99.0, 99.9)


@dataclass
class BenchResult:
    """Figures of one load run. Latencies in µs."""

    model: str
    mode: str
    concurrency: int | None
    rate_qps: float | None
    duration_s: float
    requests: int = 0
    ok: int = 0
    errors: dict = field(default_factory=dict)
    wrong: int = 0
    qps: float = 0.0
    p50_us: float = 0.0
    p95_us: float = 0.0
    p99_us: float = 0.0
    p99_9_us: float = 0.0
    max_us: float = 0.0
    mean_us: float = 0.0
    cache_hits: int = 0
    stages_us: dict = field(default_factory=dict)
    """Mean of each stage in ``parameters.timings_us`` over the successful answers."""

    def to_dict(self) -> dict:
        return asdict(self)


class Workload:
    """Inputs and their reference outputs for one model version.

    Args:
        repo: the model repository. model: name. version: None = default.
        pool: how many distinct inputs to prepare (reused cyclically).
        distinct: perturb rows so inputs never repeat within the pool.
    """

    def __init__(self, repo: ModelRepository, model: str, version: str | None = None, pool: int = 4096,
                 distinct: bool = True, seed: int = 0) -> None:
        m = repo.get(model)
        if m is None:
            raise KeyError(f"unknown model {model!r}")
        self.mv = m.version(version)
        rng = np.random.default_rng(seed)
        data = m.data_path(repo.root)
        self.inputs: list[dict[str, np.ndarray]] = []
        rows = None
        if data.is_file() and len(self.mv.inputs) == 1:
            rows = np.load(data)["X"]
        for i in range(pool if distinct else 1):
            feed = {}
            for t in self.mv.inputs:
                shape = [1 if d < 0 else d for d in t.shape]
                if rows is not None:
                    x = rows[i % len(rows)].reshape(shape).astype(numpy_dtype_for(t.datatype))
                    if distinct:
                        x = x.copy()
                        x.flat[i % x.size] += np.float32((i // len(rows) + 1) * 1e-3)
                else:
                    dt = numpy_dtype_for(t.datatype)
                    if dt.kind == "f":
                        x = rng.standard_normal(shape).astype(dt)
                    elif dt.kind in "iu":
                        x = rng.integers(0, 100, shape).astype(dt)
                    else:
                        x = np.zeros(shape, dtype=dt)
                feed[t.name] = x
            self.inputs.append(feed)
        sess = OnnxRuntimeBackend().load(self.mv.path)
        self.reference = [sess.infer(feed) for feed in self.inputs]

    def check(self, i: int, outputs: dict[str, np.ndarray]) -> bool:
        ref = self.reference[i % len(self.reference)]
        if set(outputs) != set(ref):
            return False
        for name, want in ref.items():
            got = outputs[name]
            if got.shape != want.shape:
                return False
            if want.dtype.kind == "f":
                if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
                    return False
            elif not np.array_equal(got, want):
                return False
        return True


class _Recorder:
    def __init__(self) -> None:
        self.hist = HdrHistogram(1, 60_000_000, 3)
        self.errors: Counter = Counter()
        self.ok = 0
        self.wrong = 0
        self.hits = 0
        self.stages: Counter = Counter()
        self.stage_n = 0

    def record(self, latency_us: float, res=None, err: Exception | None = None, correct: bool = True) -> None:
        self.hist.record_value(max(int(latency_us), 1))
        if err is not None:
            code = getattr(getattr(err, "code", None), "value", type(err).__name__)
            self.errors[str(code)] += 1
            return
        self.ok += 1
        if not correct:
            self.wrong += 1
        params = res.parameters or {}
        if params.get("cache_hit"):
            self.hits += 1
        t = params.get("timings_us")
        if isinstance(t, dict) and not params.get("cache_hit"):
            self.stage_n += 1
            for k, v in t.items():
                if isinstance(v, (int, float)):
                    self.stages[k] += v

    def result(self, model, mode, conc, rate, elapsed) -> BenchResult:
        h = self.hist
        n = h.get_total_count()
        r = BenchResult(model, mode, conc, rate, round(elapsed, 3), requests=n, ok=self.ok,
                        errors=dict(self.errors), wrong=self.wrong, qps=round(n / elapsed, 1) if elapsed else 0,
                        cache_hits=self.hits)
        if n:
            r.p50_us, r.p95_us, r.p99_us, r.p99_9_us = (float(h.get_value_at_percentile(p)) for p in PERCENTILES)
            r.max_us, r.mean_us = float(h.get_max_value()), round(h.get_mean_value(), 1)
        if self.stage_n:
            r.stages_us = {k: round(v / self.stage_n, 1) for k, v in sorted(self.stages.items())}
        return r


async def closed_loop(client, work: Workload, *, concurrency: int = 1, duration_s: float = 5.0,
                      timeout_s: float = 1.0, max_requests: int | None = None) -> BenchResult:
    """Run ``concurrency`` callers for ``duration_s`` seconds (or ``max_requests`` in all)."""
    rec = _Recorder()
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
                rec.record((time.perf_counter() - t0) * 1e6, err=err)
                continue
            rec.record((time.perf_counter() - t0) * 1e6, res, correct=work.check(i, res.outputs))

    t0 = time.monotonic()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return rec.result(model, "closed", concurrency, None, time.monotonic() - t0)


async def open_loop(client, work: Workload, *, rate_qps: float, duration_s: float = 5.0,
                    timeout_s: float = 1.0) -> BenchResult:
    """Send at a fixed ``rate_qps`` for ``duration_s``; latency counted from each scheduled send time."""
    rec = _Recorder()
    model, version = work.mv.name, work.mv.version
    total = int(rate_qps * duration_s)
    interval = 1.0 / rate_qps
    tasks = set()

    async def one(i: int, t_sched: float) -> None:
        feed = work.inputs[i % len(work.inputs)]
        try:
            res = await client.infer_result(model, feed, version=version, timeout_s=timeout_s)
        except InferbusError as err:
            rec.record((time.perf_counter() - t_sched) * 1e6, err=err)
            return
        rec.record((time.perf_counter() - t_sched) * 1e6, res, correct=work.check(i, res.outputs))

    start = time.perf_counter()
    for i in range(total):
        t_sched = start + i * interval
        delay = t_sched - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = asyncio.create_task(one(i, t_sched))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return rec.result(model, "open", None, rate_qps, time.perf_counter() - start)


def render_table(results: list[BenchResult], title: str = "inferbus load run"):
    """A rich Table of results (latencies in ms)."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("model", "mode", "load", "requests", "qps", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms", "errors",
                "wrong", "cache hits"):
        t.add_column(col, justify="right" if col not in ("model", "mode") else "left")
    for r in results:
        load = f"c={r.concurrency}" if r.concurrency is not None else f"{r.rate_qps:g}/s"
        t.add_row(r.model, r.mode, load, str(r.requests), f"{r.qps:.0f}", f"{r.p50_us / 1000:.3f}",
                  f"{r.p95_us / 1000:.3f}", f"{r.p99_us / 1000:.3f}", f"{r.p99_9_us / 1000:.3f}",
                  str(sum(r.errors.values())), str(r.wrong), str(r.cache_hits))
    return t
