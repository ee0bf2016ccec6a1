"""Region drills: a two-region topology under checked load, a region-level fault, the figures.

* ``region-failover``: SIGKILL every process of the primary region (its three
  nats-servers, Valkey, node, region manager, workers, ingress, aggregator) at
  once, as a power loss would. The client's server list spans both regions.
* ``region-partition``: cut the gateways between the two regions (both still
  reach the witness: the primary must stay primary), then isolate the primary
  from every site (the standby must take over only after the old primary's
  lease validity ended), then heal (the old primary rejoins as standby).

Both take a degraded WAN as an option: ``gateway_latency_ms`` / ``gateway_drop_pct``
(``inferbus chaos run region-partition --latency-ms 50 --drop-pct 5``) put latency
and packet loss on the gateway proxies of ``gateway_links`` for the whole drill
(:func:`chaos.topology_faults.gateway_degrade`).

Each drill starts its own topology (:class:`inferbus.cluster.Topology`, free
ports) unless one is passed in (tests share one), drives open-loop load through
the SDK (:class:`chaos.load.Driver`: unique request ids, known answers, worker
execution audit for duplicates) and returns :class:`chaos.load.DrillFigures`.

Figures: ``detection_ms`` = fault → the standby's manager suspects the primary
(no heartbeat for ``suspect_ms``); ``failover_ms`` = fault → the first correct
answer carrying the new primary's term; ``recovery_ms`` = fault → the first
correct answer to a request sent after the fault (stateless serving continuity:
queue groups fail over across the gateways before any promotion).
``extra.promotion_ms`` = fault → the standby's lease CAS was sent.

The fault goes to the region that is primary just before it, read again then (on a
starved host a late renewal can hand the lease over in the load's first seconds);
``extra.primary_changed_before_fault`` says whether the roles had changed since the setup.

The fault comes ``fault_at_s`` after the load's first request (:meth:`chaos.load.Driver.wait_into_load`;
at the earliest: the primary is read again then). ``extra`` records it on the load's clock
(:meth:`chaos.load.Driver.fault_phases`, seconds from the first request): ``fault_at_s`` as asked,
``fault_injected_at_s`` (region-failover: the kill; region-partition: the regions' cut),
``fault_healed_at_s`` and ``fault_lasted_s`` (region-partition: the isolation's heal; region-failover
heals nothing during the load, so neither), ``last_request_sent_at_s``, ``requests_before_fault``
and ``requests_during_fault`` (to the heal, or to the load's end).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from inferbus.actors import ModelRepository, default_models_dir
from inferbus.bus import Subjects
from inferbus.client import Client
from inferbus.cluster import ClusterSpec, Topology
from inferbus.loadgen import Workload

from ._options import MAX_LATENCY_MS, MAX_TIMEOUT_S, check_count, check_number, check_rate, check_seconds
from .load import DrillFigures, Driver, sleep_until


@dataclass
class RegionDrillOptions:
    """Knobs of the region drills."""

    duration_s: float = 8.0
    """Seconds of load in all."""
    rate_qps: float = 100.0
    timeout_s: float = 1.0
    """Per-request budget (the SDK retries within it)."""
    fault_at_s: float = 2.5
    """When the fault is injected, seconds after the load's first request (at the earliest: region-failover and
    region-partition then wait for one settled primary, nats-node-loss reads the connections of its server)."""
    partition_s: float = 2.0
    """region-partition: how long each partition phase lasts."""
    model: str = "digits"
    models_dir: str | None = None
    workers: int = 1
    """Worker processes per region."""
    run_dir: str | None = None
    heartbeat_ms: int = 100
    lease_ms: int = 400
    suspect_ms: int = 400
    fault_s: float = 4.0
    """Drills with a fault that is healed after a while (nats-node-loss, gateway-degrade): how long it lasts."""
    gateway_latency_ms: float = 0.0
    """Latency added on the gateway proxies of ``gateway_links`` for the whole drill (0 = none), ms each way."""
    gateway_jitter_ms: float = 0.0
    gateway_drop_pct: float = 0.0
    """Packet loss on those gateways for the whole drill, percent (0 = none; lost chunks come
    ``gateway_rto_ms`` late, as a TCP retransmission; 100 = blackhole)."""
    gateway_rto_ms: float = 200.0
    gateway_links: str = "regions"
    """``regions`` (between the regions; the witness stays clean) or ``all`` (every pair of sites)."""
    node_down_s: float = 2.0
    """nats-node-loss: how long the killed server stays down before its supervisor starts it (0 = at once)."""
    nats_server: str | None = None
    """nats-node-loss: which server (e.g. ``A2``); default the one the load client is connected to."""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Raises ``ValueError`` naming the option: a time that is not a finite number of seconds (> 0; ``fault_at_s``
        and ``node_down_s`` may be 0) up to a day (``timeout_s`` up to 600 s, what an ingress accepts), a rate not in
        (0, 1e6] requests/s, ``workers`` outside [1, 256], gateway latency or jitter not in [0, 60000] ms, loss
        outside [0, 100] percent."""
        check_seconds("duration_s", self.duration_s)
        check_rate("rate_qps", self.rate_qps)
        check_seconds("timeout_s", self.timeout_s, max_s=MAX_TIMEOUT_S)
        check_seconds("fault_at_s", self.fault_at_s, zero_ok=True)
        check_seconds("partition_s", self.partition_s)
        check_seconds("fault_s", self.fault_s)
        check_seconds("node_down_s", self.node_down_s, zero_ok=True)
        check_count("workers", self.workers)
        check_number("gateway_latency_ms", self.gateway_latency_ms, 0.0, MAX_LATENCY_MS, True, "ms")
        check_number("gateway_jitter_ms", self.gateway_jitter_ms, 0.0, MAX_LATENCY_MS, True, "ms")
        check_number("gateway_drop_pct", self.gateway_drop_pct, 0.0, 100.0, True, "percent")
        if self.gateway_links not in ("regions", "all"):
            raise ValueError(f"gateway_links must be 'regions' or 'all', got {self.gateway_links!r}")
        if self.nats_server is not None:  # the drills' topology is ClusterSpec's default: its servers are known now,
            spec = ClusterSpec()  # before anything starts (a wrong name was a KeyError after a 17 s cluster start)
            names = [f"{site}{i}" for site in spec.sites
                     for i in range(1, (spec.witness_servers if site == spec.witness else spec.servers_per_region) + 1)]
            if self.nats_server not in names:
                raise ValueError(f"nats_server must be one of the topology's servers ({', '.join(names)}), "
                                 f"got {self.nats_server!r}")

    @property
    def degraded(self) -> bool:
        """True when the options ask for gateway latency or loss for the whole drill."""
        return self.gateway_latency_ms > 0 or self.gateway_drop_pct > 0


class RoleWatch:
    """Polls every live region manager's status (through the witness) and records who is primary.

    Also keeps, per manager incarnation (``manager_id``), its region and latest status
    (:attr:`latest`, for reigns across restarts) and the largest heartbeat age any
    manager reported for a peer (:attr:`max_hb_age_ms`, how close a standby came to suspecting).
    """

    def __init__(self, topo: Topology, period_s: float = 0.05) -> None:
        self.topo = topo
        self.period_s = period_s
        self.samples: list[tuple[float, dict]] = []
        self.max_primaries = 0
        self.latest: dict[str, tuple[str, object, float]] = {}
        """manager_id → (region, latest status, monotonic time it was read)."""
        self.max_hb_age_ms: dict[str, float] = {}
        """"observer->peer" → largest heartbeat age reported (ms)."""
        self._task: asyncio.Task | None = None
        self.nc = None

    async def __aenter__(self) -> "RoleWatch":
        import nats

        self.nc = await nats.connect(self.topo.urls(self.topo.spec.witness), connect_timeout=2)
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            st = await self.topo.statuses(self.nc, timeout_s=0.3)
            now = time.monotonic()
            for r, s in st.items():
                if s is None:
                    continue
                self.latest[s.manager_id] = (r, s, now)
                for peer, age in s.heartbeat_age_ms.items():
                    key = f"{r}->{peer}"
                    if peer not in self.topo.down and age < 60_000:
                        self.max_hb_age_ms[key] = max(self.max_hb_age_ms.get(key, 0.0), round(age, 1))
            roles = {r: (s.role, s.term) for r, s in st.items() if s is not None}
            n = sum(1 for role, _ in roles.values() if role == "primary")
            self.max_primaries = max(self.max_primaries, n)
            self.samples.append((time.monotonic(), roles))
            await asyncio.sleep(self.period_s)

    async def __aexit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:
                pass
        if self.nc is not None:
            await self.nc.close()


def reigns(statuses: dict) -> list[tuple[str, int, float, float]]:
    """Primary intervals ``(region, term, start, end)`` from the managers' transition logs.

    A reign starts when its lease CAS was sent and ends at the step-down (at the latest when its
    validity ran out); an unfinished reign ends at +inf. Same host: monotonic times compare.
    """
    out = []
    for region, st in statuses.items():
        if st is None:
            continue
        start = term = None
        for tr in st.transitions:
            if tr.event == "primary":
                if start is None:
                    start, term = tr.t_mono, tr.term
            elif tr.event == "standby" and start is not None:
                out.append((region, term, start, tr.t_mono))
                start = None
        if start is not None:
            out.append((region, term, start, float("inf")))
    return out


def overlaps(rs: list[tuple[str, int, float, float]]) -> list[tuple]:
    """Pairs of reigns of different regions that overlap in time (must be empty)."""
    bad = []
    for i, a in enumerate(rs):
        for b in rs[i + 1:]:
            if a[0] != b[0] and a[2] < b[3] and b[2] < a[3]:
                bad.append((a, b))
    return bad


def terms_by_region(rs: list[tuple[str, int, float, float]]) -> dict[int, set[str]]:
    """term → regions that were primary under it (each set must have one element)."""
    out: dict[int, set[str]] = {}
    for region, term, _, _ in rs:
        out.setdefault(term, set()).add(region)
    return out


class _Setup:
    """Topology (own or given) + client connected to the primary region first + checked load driver."""

    def __init__(self, opts: RegionDrillOptions, topology: Topology | None) -> None:
        self.opts = opts
        self.topo = topology
        self._own = topology is None

    async def __aenter__(self) -> "_Setup":
        o = self.opts
        if self.topo is None:
            spec = ClusterSpec(workers=o.workers, audit=True, heartbeat_ms=o.heartbeat_ms, lease_ms=o.lease_ms,
                               suspect_ms=o.suspect_ms, models_dir=o.models_dir)
            self.topo = await Topology(spec, run_dir=o.run_dir).start()
        try:
            self._aim(await self.topo.wait_settled(60))
            before = await self.topo.statuses()
            self.term0 = before[self.primary].term
            mdir = o.models_dir or str(default_models_dir())
            self.client = await Client.connect(self.topo.client_urls(first=self.primary), self.topo.spec.prefix,
                                               no_randomize=True)
            # in a thread: building the pool and its reference answers (ONNX Runtime, ~0.3 s, more on a loaded
            # host) on this loop stalled the gateway proxies that run on it past the 400 ms lease, so the primary's
            # renewal failed before the fault (a CI run: the lease changed hands and the drill killed the standby)
            work = await asyncio.to_thread(lambda: Workload(ModelRepository(mdir), o.model, distinct=True, pool=2048))
            self.driver = Driver(self.client, o.model, work.inputs, work.reference, rate_qps=o.rate_qps,
                                 timeout_s=o.timeout_s, audit_subject=Subjects(self.topo.spec.prefix).audit)
            # warm: one answer before the clock starts (with the pool's last input: the load starts with the
            # first, and a warm-up answer still in the L1 cache would answer it without an execution)
            await self.client.infer(o.model, work.inputs[-1], timeout_s=5.0)
            self.wan = None
            if o.degraded:
                from .topology_faults import TopologyTarget, gateway_degrade

                self.wan = await gateway_degrade(
                    TopologyTarget(self.topo, self.primary), latency_ms=o.gateway_latency_ms,
                    jitter_ms=o.gateway_jitter_ms, drop_pct=o.gateway_drop_pct, rto_ms=o.gateway_rto_ms,
                    links=o.gateway_links)
        except BaseException:
            if self._own:
                await self.topo.stop()
            raise
        return self

    def _aim(self, primary: str) -> None:
        """Aim the drill at ``primary``: the fault's region; the standby is the first other region that is up."""
        self.primary = primary
        self.standby = next(r for r in self.topo.spec.regions if r != primary and r not in self.topo.down)

    async def settle_before_fault(self) -> bool:
        """Re-read which region is primary just before the fault (waiting up to 30 s for one settled primary) and
        aim the fault there. Returns True when the roles changed since the setup: on a starved host (the 2-core CI
        box) a late renewal can hand the lease over during the load's first seconds, the election's job, and a
        drill that then killed the region read at setup killed the standby (``detection_ms`` None, a negative
        ``failover_ms``)."""
        primary = await self.topo.wait_settled(30)
        changed = primary != self.primary
        if changed:
            self._aim(primary)
        st = (await self.topo.statuses()).get(primary)
        if st is not None:
            self.term0 = st.term
        return changed

    def wan_extra(self) -> dict:
        """The degraded-WAN settings (for a drill's ``extra``), or {} when the gateways are clean."""
        o = self.opts
        if not o.degraded:
            return {}
        stats = [p.stats for p in self.topo.proxies.values()]
        return {"gateway_latency_ms": o.gateway_latency_ms, "gateway_jitter_ms": o.gateway_jitter_ms,
                "gateway_drop_pct": o.gateway_drop_pct, "gateway_rto_ms": o.gateway_rto_ms,
                "gateway_links": o.gateway_links, "gateway_chunks_retransmitted": sum(s.retransmitted for s in stats)}

    async def __aexit__(self, *exc) -> None:
        if getattr(self, "wan", None) is not None:
            try:
                await self.wan.heal()
            except Exception:
                pass
        try:
            await self.client.close()
        except Exception:
            pass
        if self._own:
            await self.topo.stop()



async def _wait_primary(topo: Topology, region: str, min_term: int, timeout_s: float):
    import nats

    nc = await nats.connect(topo.urls(topo.spec.witness), connect_timeout=2)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = (await topo.statuses(nc, timeout_s=0.5)).get(region)
            if st is not None and st.role == "primary" and st.term > min_term:
                return st
            await asyncio.sleep(0.05)
        return None
    finally:
        await nc.close()


async def region_failover(opts: RegionDrillOptions, topology: Topology | None = None) -> DrillFigures:
    """Kill every process of the primary region under load; the standby takes over (see module doc).

    With ``topology`` given, the killed region is restored afterwards (it rejoins as standby) and
    ``extra.rejoined_as_standby`` says whether it did.
    """
    async with _Setup(opts, topology) as s:
        topo = s.topo
        load = asyncio.create_task(s.driver.run(opts.duration_s))
        await s.driver.wait_into_load(load, opts.fault_at_s)
        changed = await s.settle_before_fault()
        t_kill = await topo.kill_region(s.primary)
        st = await _wait_primary(topo, s.standby, s.term0, 10.0)
        await load
        after = await topo.statuses()
        new = after.get(s.standby)
        new_term = new.term if new is not None and new.role == "primary" else None
        detection = promotion = None
        if new is not None and new.suspected_at is not None and new.suspected_at >= t_kill:
            detection = (new.suspected_at - t_kill) * 1000
        rs = reigns(after)
        starts = [start for region, term, start, _ in rs if region == s.standby and start >= t_kill]
        if starts:
            promotion = (min(starts) - t_kill) * 1000
        recs = s.driver.records
        ok_new = [r.t_done for r in recs if r.outcome == "ok" and new_term and (r.term or 0) >= new_term]
        ok_after = [r.t_done for r in recs if r.outcome == "ok" and r.t_sched >= t_kill]
        fig = s.driver.figures("region-failover", (t_kill, t_kill + 1.0), detection_ms=_r(detection),
                               recovery_ms=_r((min(ok_after) - t_kill) * 1000 if ok_after else None), extra={
                                   "killed_region": s.primary, "new_primary": s.standby if new_term else None,
                                   "old_term": s.term0, "new_term": new_term, "promotion_ms": _r(promotion),
                                   "pids_killed": getattr(topo, "last_kill", {}).get("pids"), "lease_ms": topo.spec.lease_ms,
                                   "suspect_ms": topo.spec.suspect_ms, "heartbeat_ms": topo.spec.heartbeat_ms,
                                   "terms_by_region": {t: sorted(v) for t, v in terms_by_region(rs).items()},
                                   "overlapping_reigns": len(overlaps(rs)), "primary_changed_before_fault": changed,
                                   **s.wan_extra(),
                                   # the kill from the load's first request (not healed during the load)
                                   "fault_at_s": opts.fault_at_s, **s.driver.fault_phases(t_kill),
                               })
        fig.failover_ms = _r((min(ok_new) - t_kill) * 1000 if ok_new else None)
        if topology is not None:
            await topo.restore_region(s.primary)
            try:
                back = await topo.wait_settled(60)
                fig.extra["rejoined_as_standby"] = back == s.standby
            except Exception as exc:
                fig.extra["rejoined_as_standby"] = False
                fig.extra["rejoin_error"] = str(exc)
        return fig


async def region_partition(opts: RegionDrillOptions, topology: Topology | None = None) -> DrillFigures:
    """Partition the regions, then isolate the primary, under load; never two primaries (see module doc)."""
    async with _Setup(opts, topology) as s:
        topo = s.topo
        sites = set(topo.spec.sites)
        async with RoleWatch(topo) as watch:
            load = asyncio.create_task(s.driver.run(opts.duration_s + 2 * opts.partition_s))
            await s.driver.wait_into_load(load, opts.fault_at_s)
            changed = await s.settle_before_fault()
            # 1. regions cut from each other; both still reach the witness
            t_cut = time.monotonic()
            faults = topo.partition({s.primary}, sites - {s.primary, topo.spec.witness})
            await sleep_until(t_cut + opts.partition_s)
            mid = await topo.statuses()
            kept = mid.get(s.primary) is not None and mid[s.primary].role == "primary" \
                and mid[s.primary].term == s.term0
            topo.heal(faults)
            t_cut_healed = time.monotonic()
            # 2. the primary cut from every other site: it must step down, the standby take over
            t_iso = time.monotonic()
            faults = topo.isolate(s.primary)
            st = await _wait_primary(topo, s.standby, s.term0, 10.0)
            await sleep_until(t_iso + opts.partition_s)
            topo.heal(faults)
            t_iso_healed = time.monotonic()
            settled = await topo.wait_settled(30)
            await load
        after = await topo.statuses()
        rs = reigns(after)
        tb = terms_by_region(rs)
        new = after.get(s.standby)
        detection = None
        if new is not None and new.suspected_at is not None and new.suspected_at >= t_iso:
            detection = (new.suspected_at - t_iso) * 1000
        starts = [start for region, term, start, _ in rs if region == s.standby and start >= t_iso]
        fig = s.driver.figures("region-partition", (t_cut, time.monotonic()), detection_ms=_r(detection), extra={
            "primary_kept_through_region_cut": kept, "takeover_after_isolation": st is not None,
            "takeover_ms": _r((min(starts) - t_iso) * 1000 if starts else None),
            "settled_primary_after_heal": settled, "max_primaries_sampled": watch.max_primaries,
            "samples": len(watch.samples), "overlapping_reigns": len(overlaps(rs)),
            "terms_shared_by_regions": sum(1 for v in tb.values() if len(v) > 1),
            "terms_by_region": {t: sorted(v) for t, v in tb.items()}, "primary_changed_before_fault": changed,
            "fault_events_at_s": [round(t - (s.driver.t_start or t_cut), 2)
                                  for t in (t_cut, t_cut_healed, t_iso, t_iso_healed)],
            **s.wan_extra(),
            # the whole fault, the cut's start to the isolation's heal, from the load's first request
            "fault_at_s": opts.fault_at_s, **s.driver.fault_phases(t_cut, t_iso_healed),
        })
        return fig


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)
