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

from ._options import MAX_TIMEOUT_S, check_count, check_rate, check_seconds
from .faults import NodeTarget, get_fault
from .load import DrillFigures, Driver
from .rss import RssSampler, rss_kib  # noqa: F401  (rss_kib: re-exported, it used to live here)
from .soak import fault_cycle, p99_ms_in_windows, sample_rss, strip_times, window_figures


@dataclass
class DrillOptions:
    """Knobs common to the node drills."""

    duration_s: float = 10.0
    rate_qps: float = 200.0
    timeout_s: float = 1.0
    """Per-request budget (the SDK retries within it)."""
    workers: int = 2
    ingress: int = 2
    """Ingress replicas (queue group): with one, kill-ingress is an outage until its restart by construction."""
    model: str = "digits"
    models_dir: str | None = None
    health_timeout_s: float = 1.0
    """How long a silent worker stays in routing (the drills use 1 s; the default deployment 5 s)."""
    fault_every_s: float = 30.0
    """soak only: a fault every this many seconds."""
    hang_s: float = 2.0
    """How long hang-worker, slow-worker and (soak) kill-valkey last before the heal, seconds."""
    faults: tuple[str, ...] | None = None
    """soak only: the fault names to cycle through (default: every kind the target offers)."""
    topology: bool = False
    """soak only: run on a local two-region topology (inferbus.cluster) so the cluster faults
    (kill-nats-node, gateway latency/loss/cut, isolate-region, kill-region) are in the cycle."""
    run_dir: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Raises ``ValueError`` naming the option: a time that is not a finite number of seconds > 0 (``hang_s``
        may be 0) or over a day (``timeout_s``: over 600 s, what an ingress accepts), a rate not in (0, 1e6]
        requests/s, process counts outside [1, 256]."""
        check_seconds("duration_s", self.duration_s)
        check_rate("rate_qps", self.rate_qps)
        check_seconds("timeout_s", self.timeout_s, max_s=MAX_TIMEOUT_S)
        check_seconds("health_timeout_s", self.health_timeout_s)
        check_seconds("fault_every_s", self.fault_every_s)
        check_seconds("hang_s", self.hang_s, zero_ok=True)
        check_count("workers", self.workers)
        check_count("ingress", self.ingress)


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
        self.node = Node(NodeConfig(models_dir=mdir, workers=o.workers, ingress=o.ingress, nats_port=0, run_dir=run_dir,
                                    health_timeout_s=o.health_timeout_s, audit=True))
        await self.node.start()
        await self.node.wait_ready(60)
        self.client = await Client.connect(self.node.nats_url, self.node.config.prefix)
        repo = ModelRepository(mdir, [o.model])
        work = Workload(repo, o.model, distinct=True, pool=2048)
        # every answer is checked against the version its reply names (model-swap changes the default)
        by_version = {v: Workload(repo, o.model, v, distinct=True, pool=2048).reference
                      for v in repo.get(o.model).versions}
        self.driver = Driver(self.client, o.model, work.inputs, work.reference, rate_qps=o.rate_qps,
                             timeout_s=o.timeout_s,
                             audit_subject=Subjects(self.node.config.prefix).audit, references_by_version=by_version)
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
    """SIGKILL Valkey under load: answers must keep flowing (the cache is an optimization); recovery = Valkey back:
    the first PING it answers after the kill, polled every 20 ms from the kill on (it was the drill's own hold
    before the heal, a third of the duration, whatever the restart took: a fresh-user trial)."""
    back: asyncio.Task | None = None

    async def first_pong(url: str) -> float | None:
        import redis.asyncio as aioredis

        r = aioredis.from_url(url, socket_connect_timeout=0.2, socket_timeout=0.2)
        try:
            await asyncio.sleep(0.02)  # (the kill's SIGKILL takes effect)
            while True:
                try:
                    if await r.ping():
                        return time.monotonic()
                except Exception:  # noqa: BLE001 - down: not yet back
                    pass
                await asyncio.sleep(0.02)
        finally:
            await (r.aclose() if hasattr(r, "aclose") else r.close())  # (aclose: redis-py 5.0.1 on)

    async def detect(s, f):
        nonlocal back
        url = s.node.redis_url
        if url:
            back = asyncio.create_task(first_pong(url))
        return None  # nothing needs to notice: no request depends on L2

    async def recover(s, f):
        if back is None:
            return None
        try:
            return await asyncio.wait_for(back, 30)
        except asyncio.TimeoutError:
            return None

    return await _with_fault(opts, "cache-loss", "kill-valkey", detect, recover, heal_after_s=opts.duration_s / 3)


NODE_SOAK_CYCLE = ["model-swap", "kill-worker", "hang-worker", "kill-valkey", "kill-ingress", "slow-worker",
                   "kill-aggregator", "kill-nats"]
"""Every node fault kind, in soak order. ``kill-nats`` kills the node's only nats-server (a single node
has no other to fail over to: the SDK and actors reconnect once it is back); ``model-swap`` makes the
model's other version the default for ``hang_s`` and then the previous one again."""


def _soak_hold_s(opts: DrillOptions):
    return lambda name: opts.hang_s if name in ("hang-worker", "slow-worker", "kill-valkey", "model-swap") else 0.0


async def soak(opts: DrillOptions) -> DrillFigures:
    """Steady load for ``duration_s`` with a fault every ``fault_every_s``, cycling through the node faults.

    With ``opts.topology`` the soak runs on a local two-region topology instead and its cycle adds the
    cluster faults (:func:`chaos.topology_drills.soak_topology`).

    Cycle: :data:`NODE_SOAK_CYCLE`. RSS of every process (the actors, the embedded nats-server and
    Valkey, and this process, which runs the node's supervisor and the load) is sampled each second;
    ``extra.rss_kib`` has per process the first, last and max sample, the incarnations, and the growth
    over the last incarnation (``plateau``: see :mod:`chaos.rss`); ``extra.rss_verdict`` sums it up.
    ``extra.faults`` lists each fault with its heal time and the figures of its window.
    ``opts.faults`` replaces the cycle (an unknown name raises :class:`chaos.faults.UnknownFault`).
    """
    for name in opts.faults or ():
        get_fault(name)  # an unknown name fails before anything starts
    if opts.topology:
        from .topology_drills import soak_topology

        return await soak_topology(opts)
    cycle = list(opts.faults) if opts.faults else NODE_SOAK_CYCLE
    sampler = RssSampler()
    async with _Setup(opts) as s:
        def pids() -> dict[str, int]:
            out = {c.id: c.pid for c in s.node.supervisor.which_children() if c.pid}
            for name in ("nats", "valkey"):
                srv = getattr(s.node, name, None)
                if srv is not None and srv.running:
                    out[name] = srv.pid
            out["drill+node"] = os.getpid()
            return out

        load = asyncio.create_task(s.driver.run(opts.duration_s))
        t_start = time.monotonic()
        stop = asyncio.Event()
        rss_task = asyncio.create_task(sample_rss(sampler, pids, stop))

        async def inject(name: str, k: int):
            return await get_fault(name)(s.target, index=k)

        try:
            faults, unavailable = await fault_cycle(load, cycle, inject, _soak_hold_s(opts),
                                                    fault_every_s=opts.fault_every_s, duration_s=opts.duration_s,
                                                    t_start=t_start, stop_load=s.driver.stop)
            await load
        finally:
            stop.set()
            await rss_task
        window_figures(s.driver.records, faults, executions=s.driver.executions)
        fig = s.driver.figures("soak", None, extra={
            "mode": "node", "faults": strip_times(faults), "faults_unavailable": unavailable,
            "cycle": cycle, "rss_kib": sampler.summary(), "rss_verdict": sampler.verdict(),
            "fault_every_s": opts.fault_every_s, "rate_qps": opts.rate_qps, "workers": opts.workers,
            "ingress": opts.ingress, "duration_s": opts.duration_s})
        fig.p99_ms_during_fault = p99_ms_in_windows(s.driver.records, faults)
        return fig


async def model_swap(opts: DrillOptions) -> DrillFigures:
    """Swap the model's default version under load (1 → 2 for ``digits``), hold a third of the run, swap back.

    Requests name no version, so each is served by whichever version is the default when its ingress
    resolves it; the driver checks every answer against the reference outputs of the version stamped in
    the reply (``model_version``): a wrong answer, a failure or a duplicate execution is a defect.
    ``detection_ms`` = the swap request sent → the first answer from the new version; ``recovery_ms`` =
    the swap request sent → the first answer from the previous version after the swap back.
    ``extra``: ``swap_ms`` / ``heal_ms`` (each write's own answer time), ``from_version``, ``to_version``,
    ``answers_by_version``, ``swap_back_visible_ms`` (swap back sent → the first answer from the previous
    version again), ``mixed_ms`` (swap back sent → the last answer from the new version: how long
    answers from both versions overlap, requests resolved before the write still finishing).
    """
    async with _Setup(opts) as s:
        load = asyncio.create_task(s.driver.run(opts.duration_s))
        await asyncio.sleep(opts.duration_s / 4)
        fault = await get_fault("model-swap")(s.target, model=opts.model)
        t0 = fault.t_inject
        new, old = fault.info["to_version"], fault.info["from_version"]
        recs = s.driver.records

        def first(version: str, after: float) -> float | None:
            ts = [r.t_done for r in recs if r.model_version == version and r.outcome == "ok" and r.t_done >= after]
            return min(ts) if ts else None

        t_detect = None
        deadline = time.monotonic() + opts.duration_s
        while t_detect is None and time.monotonic() < deadline and not load.done():
            await asyncio.sleep(0.01)
            t_detect = first(new, t0)
        await asyncio.sleep(max(opts.duration_s / 3 - (time.monotonic() - t0), 0))
        t_heal_sent = time.monotonic()
        await fault.heal()
        await load
        t_recover = first(old, t_heal_sent)
        last_new = max((r.t_done for r in recs if r.model_version == new), default=None)
        return s.driver.figures(
            "model-swap", (t0, t_recover or time.monotonic()),
            detection_ms=round((t_detect - t0) * 1000, 1) if t_detect else None,
            recovery_ms=round((t_recover - t0) * 1000, 1) if t_recover else None,
            extra={"fault": "model-swap", "model": opts.model, "from_version": old, "to_version": new,
                   "swap_ms": fault.info.get("swap_ms"), "heal_ms": fault.info.get("heal_ms"),
                   "swap_back_visible_ms": round((t_recover - t_heal_sent) * 1000, 1) if t_recover else None,
                   "mixed_ms": round((last_new - t_heal_sent) * 1000, 1) if last_new and last_new > t_heal_sent
                   else 0.0, "workers": opts.workers, "ingress": opts.ingress, "rate_qps": opts.rate_qps})


NODE_DRILLS = {"worker-crash": worker_crash, "worker-hang": worker_hang, "cache-loss": cache_loss, "soak": soak,
               "model-swap": model_swap}
