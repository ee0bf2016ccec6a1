"""Failover drills on one node: start a deployment, drive checked load, inject a fault, measure.

Each drill is ``async def drill(opts: DrillOptions) -> DrillFigures``. It starts
its own deployment (embedded NATS + Valkey + actors) on free ports, so drills
run anywhere, CI included, and stops it afterwards.

Figures (see :class:`chaos.load.DrillFigures`): ``detection_ms`` is the time from
injecting the fault until the system noticed (a ``down`` event for a crash, the
ingress taking the worker out of routing for a hang); ``recovery_ms`` the time
from injection until full service is back (the restarted worker reporting, the
hung worker back in routing, the cache server back).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from inferbus.actors import ModelRepository, Node, NodeConfig, default_models_dir
from inferbus.bus import Subjects
from inferbus.client import Client
from inferbus.loadgen import Workload
from inferbus.schemas._internal import LoadReport, ProcessEvent, InternalDecodeError, decode_internal

from .faults import NodeTarget, get_fault
from .load import DrillFigures, Driver


@dataclass
class DrillOptions:
    """Knobs common to the node drills."""

    duration_s: float = 10.0
    rate_qps: float = 200.0
    timeout_s: float = 1.0
    """Per-request budget (the SDK retries within it)."""
    workers: int = 2
    model: str = "digits"
    models_dir: str | None = None
    health_timeout_s: float = 1.0
    """How long a silent worker stays in routing (the drills use 1 s; the default deployment 5 s)."""
    fault_every_s: float = 30.0
    """soak only: a fault every this many seconds."""
    hang_s: float = 2.0
    run_dir: str | None = None
    extra: dict = field(default_factory=dict)


def rss_kib(pid: int) -> int | None:
    """Resident set size of ``pid`` in KiB (Linux /proc), None if gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class _Watch:
    """Follows load reports and process events to time detection and recovery."""

    def __init__(self) -> None:
        self.reports: dict[str, LoadReport] = {}
        self.events: list[tuple[float, ProcessEvent]] = []
        self.changed = asyncio.Event()

    async def on_load(self, msg) -> None:
        try:
            r = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if isinstance(r, LoadReport):
            self.reports[r.worker_id] = r
            self.changed.set()

    async def on_event(self, msg) -> None:
        try:
            e = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if isinstance(e, ProcessEvent):
            self.events.append((time.monotonic(), e))
            self.changed.set()

    async def until(self, pred, timeout_s: float) -> float | None:
        """Monotonic time at which ``pred()`` first held, or None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if pred():
                return time.monotonic()
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), 0.02)
            except asyncio.TimeoutError:
                pass
        return None


class _Setup:
    def __init__(self, opts: DrillOptions) -> None:
        self.opts = opts

    async def __aenter__(self):
        o = self.opts
        mdir = o.models_dir or str(default_models_dir())
        self._tmp = None
        run_dir = o.run_dir
        if run_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="inferbus-drill-")
            run_dir = self._tmp.name
        self.node = Node(NodeConfig(models_dir=mdir, workers=o.workers, nats_port=0, run_dir=run_dir,
                                    health_timeout_s=o.health_timeout_s, audit=True))
        await self.node.start()
        await self.node.wait_ready(60)
        self.client = await Client.connect(self.node.nats_url, self.node.config.prefix)
        work = Workload(ModelRepository(mdir), o.model, distinct=True, pool=2048)
        self.driver = Driver(self.client, o.model, work.inputs, work.reference, rate_qps=o.rate_qps,
                             timeout_s=o.timeout_s,
                             audit_subject=Subjects(self.node.config.prefix).audit)
        self.watch = _Watch()
        s = Subjects(self.node.config.prefix)
        self._subs = [await self.client.nc.subscribe(s.load, cb=self.watch.on_load),
                      await self.client.nc.subscribe(s.events, cb=self.watch.on_event)]
        self.target = NodeTarget(self.node)
        while len(self.watch.reports) < self.node.n_workers:
            await self.watch.until(lambda: len(self.watch.reports) >= self.node.n_workers, 5)
        return self

    async def __aexit__(self, *exc) -> None:
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        await self.client.close()
        await self.node.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    async def live_workers(self) -> int:
        h = await Client(self.client.nc, self.node.config.prefix, retry_unavailable=False).health(timeout_s=0.5)
        return int(h.parameters.get("workers_live", 0))


async def _with_fault(opts: DrillOptions, drill: str, fault_name: str, detect, recover, heal_after_s=None
                      ) -> DrillFigures:
    async with _Setup(opts) as s:
        load = asyncio.create_task(s.driver.run(opts.duration_s))
        await asyncio.sleep(opts.duration_s / 3)
        fault = await get_fault(fault_name)(s.target)
        t0 = fault.t_inject
        t_detect = await detect(s, fault)
        if heal_after_s is not None:
            await asyncio.sleep(max(heal_after_s - (time.monotonic() - t0), 0))
        t_healed = await fault.heal()
        t_recover = await recover(s, fault)
        await load
        window = (t0, max(t_recover or t_healed, t_healed))
        return s.driver.figures(
            drill, window,
            detection_ms=round((t_detect - t0) * 1000, 1) if t_detect else None,
            recovery_ms=round((t_recover - t0) * 1000, 1) if t_recover else None,
            extra={"fault": fault_name, "target": fault.target_id, "workers": opts.workers,
                   "rate_qps": opts.rate_qps, "health_timeout_s": opts.health_timeout_s})


async def worker_crash(opts: DrillOptions) -> DrillFigures:
    """SIGKILL a worker under load; detection = the node's ``down`` event; recovery = the restarted worker's first report."""
    async def detect(s, f):
        wid = f.target_id.split(":", 1)[1]
        return await s.watch.until(lambda: any(e.worker_id == wid and e.kind == "down" for _, e in s.watch.events), 10)

    async def recover(s, f):
        wid = f.target_id.split(":", 1)[1]
        return await s.watch.until(lambda: wid in s.watch.reports and s.watch.reports[wid].pid != f.pid, 30)

    return await _with_fault(opts, "worker-crash", "kill-worker", detect, recover)


async def _live_until(s, pred, timeout_s: float) -> float | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred(await s.live_workers()):
                return time.monotonic()
        except Exception:
            pass
        await asyncio.sleep(0.02)
    return None


async def worker_hang(opts: DrillOptions) -> DrillFigures:
    """SIGSTOP a worker for ``hang_s``; detection = the ingress takes it out of routing; recovery = back in routing."""
    n = opts.workers

    async def detect(s, f):
        return await _live_until(s, lambda live: live < n, opts.health_timeout_s + 5)

    async def recover(s, f):
        return await _live_until(s, lambda live: live >= n, 10)

    return await _with_fault(opts, "worker-hang", "hang-worker", detect, recover,
                             heal_after_s=max(opts.hang_s, opts.health_timeout_s + 0.5))


async def cache_loss(opts: DrillOptions) -> DrillFigures:
    """SIGKILL Valkey under load: answers must keep flowing (the cache is an optimization); recovery = Valkey back."""
    async def detect(s, f):
        return None  # nothing needs to notice: no request depends on L2

    async def recover(s, f):
        return time.monotonic()

    return await _with_fault(opts, "cache-loss", "kill-valkey", detect, recover, heal_after_s=opts.duration_s / 3)


async def soak(opts: DrillOptions) -> DrillFigures:
    """Steady load for ``duration_s`` with a fault every ``fault_every_s``, cycling through the node faults.

    RSS of every actor process is sampled each second; ``extra.rss_kib`` reports the first and last
    sample and the growth over the second half of the run per process (growth must plateau).
    """
    cycle = ["kill-worker", "hang-worker", "kill-valkey", "kill-ingress", "slow-worker", "kill-aggregator"]
    rss: dict[str, list[int]] = {}
    faults_done = []
    async with _Setup(opts) as s:
        load = asyncio.create_task(s.driver.run(opts.duration_s))
        t_start = time.monotonic()
        k = 0
        next_fault = t_start + opts.fault_every_s / 2
        while not load.done():
            now = time.monotonic()
            for c in s.node.supervisor.which_children():
                if c.pid:
                    v = rss_kib(c.pid)
                    if v:
                        rss.setdefault(c.id, []).append(v)
            if now >= next_fault and now - t_start < opts.duration_s - 5:
                name = cycle[k % len(cycle)]
                k += 1
                fault = await get_fault(name)(s.target, index=k)
                hold = opts.hang_s if name in ("hang-worker", "slow-worker", "kill-valkey") else 0
                await asyncio.sleep(hold)
                await fault.heal()
                faults_done.append({"fault": name, "t_s": round(fault.t_inject - t_start, 1), "target": fault.target_id})
                next_fault += opts.fault_every_s
            await asyncio.sleep(1.0)
        await load
        growth = {}
        for cid, xs in rss.items():
            half = xs[len(xs) // 2:]
            growth[cid] = {"first_kib": xs[0], "last_kib": xs[-1],
                           "second_half_growth_kib": (half[-1] - half[0]) if len(half) > 1 else 0}
        return s.driver.figures("soak", None, extra={"faults": faults_done, "rss_kib": growth,
                                                      "fault_every_s": opts.fault_every_s})


NODE_DRILLS = {"worker-crash": worker_crash, "worker-hang": worker_hang, "cache-loss": cache_loss, "soak": soak}
