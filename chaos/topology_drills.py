"""Cluster drills on the local two-region topology: a nats-server lost, a degraded WAN, the topology soak.

* ``nats-node-loss``: SIGKILL the nats-server the load client is connected to (by default the
  primary region's first server, which the region's actors prefer too: every connection of the
  region is on it) under load; it stays down ``node_down_s`` (default 2 s), then its supervisor
  starts it again and it rejoins its routes and gateways. Clients and actors reconnect to the
  region's other servers.
* ``gateway-degrade``: ``gateway_latency_ms`` (50) latency and ``gateway_drop_pct`` (5 %) packet
  loss on the gateways of ``gateway_links`` (``regions``: A<->B; ``all``: the witness links too)
  for ``fault_s`` under load; nothing may fail, no primary may change.
* the topology soak (``inferbus chaos run soak --topology``, :func:`soak_topology`): every fault
  kind the topology offers, one every ``fault_every_s``.

Figures (:class:`chaos.load.DrillFigures`):

* nats-node-loss: ``detection_ms`` = kill → the first connection (load client or actor) that was on
  the killed server is re-established on another server; ``recovery_ms`` = kill → the restarted
  server has its routes to every peer and gateways to every site again. ``extra``:
  ``client_reconnect_ms``, ``actors_reconnected_ms`` (every connection that was on the killed
  server is back elsewhere), ``restarted_ms``, ``last_failure_ms`` (kill → the last failed request
  ended; None when none failed), ``term_changed`` (a spurious failover: the term or the primary moved
  after the kill, against ``term_at_fault`` / ``primary_at_fault`` read just before it),
  ``failover_before_fault`` (the lease moved between set-up and the kill: not this fault's doing, reported
  so that a starved start-up shows), ``overlapping_reigns``; its times (:meth:`chaos.load.Driver.fault_phases`):
  ``fault_at_s`` as asked, ``fault_injected_at_s`` (the kill), ``fault_healed_at_s`` (the restart; absent when
  the server did not start again), ``fault_lasted_s`` (at least ``node_down_s``), ``last_request_sent_at_s``,
  ``requests_before_fault``, ``requests_during_fault``.
* gateway-degrade: no detection or recovery (nothing should notice); ``extra``, from the region
  managers' transition logs during the fault: ``term_changes`` (a new primary term: a failover),
  ``step_downs`` (the primary's validity lapsed or a renewal failed), ``resumes_same_term`` (it
  won the lease back under its own term: nobody else acquired), ``suspicions``, ``lost_races``;
  ``max_primaries_sampled``, ``max_hb_age_ms`` (largest heartbeat age a standby
  reported: the suspicion threshold is ``suspect_ms``), ``gateway_chunks_retransmitted``. Its times:
  asked, ``fault_at_s``, ``fault_s``, ``duration_asked_s`` and ``duration_s`` (the load's planned length,
  at least ``fault_at_s + fault_s + 1``); recorded, in seconds from the load's first request,
  ``fault_injected_at_s``, ``fault_healed_at_s`` (each stamped once done), ``fault_lasted_s`` (their
  difference: at least ``fault_s``), ``last_request_sent_at_s`` (the last request's planned time, within
  ``1 / rate_qps`` of ``duration_s``), ``requests_before_fault`` (requests due before the injection) and
  ``requests_during_fault`` (requests due in that window).

Every drill here and in :mod:`chaos.region_drills` injects its fault ``fault_at_s`` after the load's first
request (:meth:`chaos.load.Driver.wait_into_load`), not after its own start: the load's set-up (the audit
subscription's round trip) came first, and a short ``fault_at_s`` hit a load that had hardly begun.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from dataclasses import dataclass

from .faults import FaultUnavailable, get_fault
from .load import DrillFigures, sleep_until
from .region_drills import RegionDrillOptions, RoleWatch, _r, _Setup, overlaps, reigns, terms_by_region
from .rss import RssSampler
from .soak import fault_cycle, p99_ms_in_windows, sample_rss, strip_times, window_figures
from .topology_faults import TopologyTarget, _http_json


@dataclass
class GatewayDrillOptions(RegionDrillOptions):
    """:class:`RegionDrillOptions` with a degraded WAN by default (gateway-degrade)."""

    gateway_latency_ms: float = 50.0
    gateway_drop_pct: float = 5.0


def _client_server(s) -> str | None:
    """Name of the nats-server the load client is connected to."""
    url = s.client.nc.connected_url
    if url is None:
        return None
    for name, sp in s.topo.plan.servers.items():
        if sp.port == url.port:
            return name
    return None


async def _conn_names(topo, servers: list[str]) -> Counter:
    """Connection names (``/connz``) over ``servers`` (unreachable ones count nothing)."""
    out: Counter = Counter()
    for name in servers:
        try:
            cz = await _http_json(topo.plan.servers[name].monitor_port, "/connz?limit=1024", timeout_s=0.5)
        except (OSError, ValueError, asyncio.TimeoutError):
            continue
        for c in cz.get("connections") or []:
            out[c.get("name") or "?"] += 1
    return out


class _ReconnectWatch:
    """Times the load client's reconnect (polled every 2 ms) and the return of the killed server's
    connections on the other servers of its site (``/connz``, every 25 ms)."""

    def __init__(self, s, killed: str) -> None:
        self.s = s
        self.killed = killed
        site = s.topo.plan.servers[killed].site
        self.others = [x.name for x in s.topo.plan.site_servers(site) if x.name != killed]
        self.client_at: float | None = None
        self.conns_at: dict[str, float] = {}
        self.all_back_at: float | None = None

    async def prepare(self) -> None:
        self.on_killed = await _conn_names(self.s.topo, [self.killed])
        self.baseline = await _conn_names(self.s.topo, self.others)
        self.reconnects0 = self.s.client.nc.stats["reconnects"]
        self.client_on_killed = _client_server(self.s) == self.killed

    async def run(self, t_kill: float, timeout_s: float = 10.0) -> None:
        nc = self.s.client.nc

        async def client():
            while self.client_on_killed and time.monotonic() < t_kill + timeout_s:
                if nc.stats["reconnects"] > self.reconnects0 and nc.is_connected:
                    self.client_at = time.monotonic()
                    return
                await asyncio.sleep(0.002)

        async def actors():
            want = {n: c for n, c in self.on_killed.items()}
            while want and time.monotonic() < t_kill + timeout_s:
                now = await _conn_names(self.s.topo, self.others)
                t = time.monotonic()
                for n in list(want):
                    if now[n] >= self.baseline[n] + self.on_killed[n]:
                        self.conns_at[n] = t
                        del want[n]
                await asyncio.sleep(0.025)
            if not want:
                self.all_back_at = max(self.conns_at.values(), default=None)

        await asyncio.gather(client(), actors())


async def nats_node_loss(opts: RegionDrillOptions, topology=None) -> DrillFigures:
    """SIGKILL the load client's nats-server under load; reconnects, restart, rejoin (see module doc)."""
    async with _Setup(opts, topology) as s:
        topo = s.topo
        t_setup = time.monotonic()
        load = asyncio.create_task(s.driver.run(opts.duration_s))
        await s.driver.wait_into_load(load, opts.fault_at_s)
        server = opts.nats_server or _client_server(s) or topo.plan.site_servers(s.primary)[0].name
        watch = _ReconnectWatch(s, server)
        await watch.prepare()
        target = TopologyTarget(topo, topo.plan.servers[server].site)
        # the lease as it stands at the kill: a failover before it (e.g. a renewal starved while the processes
        # of a freshly started topology compete for a small machine's cores) is not this fault's doing
        pre = await topo.statuses()
        primary_at_fault = next((r for r, st in pre.items() if st and st.role == "primary"), None)
        term_at_fault = pre[primary_at_fault].term if primary_at_fault else None
        fault = await get_fault("kill-nats-node")(target, server=server, down_s=opts.node_down_s)
        t0 = fault.t_inject
        watcher = asyncio.create_task(watch.run(t0))
        heal_err = None
        try:
            await fault.heal()
        except Exception as exc:
            heal_err = f"{type(exc).__name__}: {exc}"
        await watcher
        await load
        after = await topo.statuses()
        rs = reigns(after)
        recs = s.driver.records
        fails = [r.t_done for r in recs if r.outcome not in ("ok", "wrong") and r.t_done >= t0]
        firsts = [t for t in (watch.client_at, min(watch.conns_at.values(), default=None)) if t is not None]
        rejoined = fault.info.get("rejoined_at")
        ms = lambda t: _r((t - t0) * 1000) if t is not None else None  # noqa: E731
        extra = {
            "killed_server": server, "region": target.region, "node_down_s": opts.node_down_s,
            "client_reconnect_ms": ms(watch.client_at), "actors_reconnected_ms": ms(watch.all_back_at),
            "connections_on_killed_server": dict(watch.on_killed),
            "reconnect_ms_by_name": {n: ms(t) for n, t in sorted(watch.conns_at.items())},
            "restarted_ms": ms(fault.info.get("restarted_at")), "last_failure_ms": ms(max(fails, default=None)),
            "term_before": s.term0, "primary_before": s.primary,
            "term_at_fault": term_at_fault, "primary_at_fault": primary_at_fault,
            "primary_after": next((r for r, st in after.items() if st and st.role == "primary"), None),
            "overlapping_reigns": len(overlaps(rs)), "rate_qps": opts.rate_qps, **s.wan_extra(),
            # the kill and the restart (the server down; its rejoin is recovery_ms) from the load's first request
            "fault_at_s": opts.fault_at_s, **s.driver.fault_phases(t0, fault.info.get("restarted_at")),
        }
        pa = extra["primary_after"]
        extra["term_after"] = after[pa].term if pa and after.get(pa) else None
        # a spurious failover caused by the kill: the term or the primary moved after it
        extra["term_changed"] = extra["term_after"] != term_at_fault or pa != primary_at_fault
        extra["failover_before_fault"] = term_at_fault != s.term0 or primary_at_fault != s.primary
        extra["region_events"] = region_events(after, t_setup, time.monotonic(), t0)
        extra["lost_races"] = {r: st.lost_races for r, st in after.items() if st is not None}
        if heal_err:
            extra["heal_error"] = heal_err
        end = rejoined or time.monotonic()
        return s.driver.figures("nats-node-loss", (t0, end), detection_ms=ms(min(firsts, default=None)),
                                recovery_ms=ms(rejoined), extra=extra)


def region_events(statuses: dict, lo: float, hi: float, t0: float, limit: int = 40) -> list[str]:
    """The region managers' transitions between ``lo`` and ``hi`` as ``"+123.4 ms A standby term 1: why"``
    (times relative to ``t0``), oldest first, at most ``limit``."""
    evs = []
    for region, st in statuses.items():
        if st is None:
            continue
        for tr in st.transitions:
            if lo <= tr.t_mono <= hi and tr.event not in ("valkey_replica",):
                evs.append((tr.t_mono, f"{(tr.t_mono - t0) * 1000:+.1f} ms {region} {tr.event} term {tr.term}: "
                                       f"{tr.detail}"))
    return [e for _, e in sorted(evs)][:limit]


def _transitions_between(watch: RoleWatch, lo: float, hi: float) -> list:
    """Every transition (deduplicated across status samples) of every manager between ``lo`` and ``hi``."""
    out, seen = [], set()
    for _, st, _ in watch.latest.values():
        for tr in st.transitions:
            key = (st.manager_id, tr.t_mono, tr.event)
            if lo <= tr.t_mono <= hi and key not in seen:
                seen.add(key)
                out.append(tr)
    return sorted(out, key=lambda tr: tr.t_mono)


async def gateway_degrade(opts: RegionDrillOptions, topology=None) -> DrillFigures:
    """Latency + packet loss on the gateways under load for ``fault_s``; nothing may fail (module doc)."""
    lat = opts.gateway_latency_ms or 50.0
    drop = opts.gateway_drop_pct or 5.0
    # the degrade is this drill's fault: inject it at fault_at_s rather than for the whole drill
    from dataclasses import replace

    clean = replace(opts, gateway_latency_ms=0.0, gateway_drop_pct=0.0, gateway_jitter_ms=0.0)
    async with _Setup(clean, topology) as s:
        topo = s.topo
        async with RoleWatch(topo) as watch:
            total = max(opts.duration_s, opts.fault_at_s + opts.fault_s + 1.0)
            load = asyncio.create_task(s.driver.run(total))
            await s.driver.wait_into_load(load, opts.fault_at_s)
            stats0 = sum(p.stats.retransmitted for p in topo.proxies.values())
            fault = await get_fault("gateway-degrade")(
                TopologyTarget(topo, s.primary), latency_ms=lat, jitter_ms=opts.gateway_jitter_ms, drop_pct=drop,
                rto_ms=opts.gateway_rto_ms, links=opts.gateway_links)
            t0 = fault.t_inject
            await sleep_until(t0 + opts.fault_s)
            t1 = await fault.heal()
            retrans = sum(p.stats.retransmitted for p in topo.proxies.values()) - stats0
            await load
            await asyncio.sleep(0.2)  # one more status sample after the load
        after = await topo.statuses()
        rs = reigns(after)
        trs = _transitions_between(watch, t0, t1 + 1.0)
        ev = Counter(tr.event for tr in trs)
        terms = {r.term for r in s.driver.records if r.term is not None}
        new_terms = {tr.term for tr in trs if tr.event == "primary" and tr.term != s.term0}
        return s.driver.figures("gateway-degrade", (t0, t1), extra={
            "gateway_latency_ms": lat, "gateway_jitter_ms": opts.gateway_jitter_ms, "gateway_drop_pct": drop,
            "gateway_rto_ms": opts.gateway_rto_ms, "gateway_links": opts.gateway_links, "fault_s": opts.fault_s,
            # the load is planned to run until a second after the fault's planned end: longer than --duration when
            # that is shorter than fault_at_s + fault_s + 1 (it was lengthened without a word: a fresh-user trial)
            "duration_s": total, "duration_asked_s": opts.duration_s, "fault_at_s": opts.fault_at_s,
            # what happened, in seconds from the load's first request: the degrade's own phases (the injection
            # and the heal stamped when they were done) and when the last request was due (its planned time)
            **s.driver.fault_phases(t0, t1),
            "gateway_chunks_retransmitted": retrans, "term_changes": len(new_terms),
            "step_downs": ev.get("standby", 0),
            "resumes_same_term": sum(1 for tr in trs if tr.event == "primary" and tr.term == s.term0),
            "suspicions": ev.get("suspect", 0), "lost_races": ev.get("lost_race", 0),
            "terms_in_answers": sorted(terms),
            "max_primaries_sampled": watch.max_primaries, "max_hb_age_ms": watch.max_hb_age_ms,
            "suspect_ms": topo.spec.suspect_ms, "overlapping_reigns": len(overlaps(rs)),
            "terms_by_region": {t: sorted(v) for t, v in terms_by_region(rs).items()}, "rate_qps": opts.rate_qps,
        })


# ---- the topology soak ----------------------------------------------------------------------------------
TOPOLOGY_SOAK_CYCLE = ["model-swap", "kill-worker", "hang-worker", "kill-valkey", "kill-ingress", "slow-worker",
                       "kill-aggregator", "kill-nats-node", "gateway-degrade", "gateway-cut", "isolate-region",
                       "kill-region"]
"""Every fault kind a topology offers, in soak order (``kill-nats``, a single node's only server, is
replaced by ``kill-nats-node``). Actor faults, ``kill-valkey`` and ``kill-nats-node`` act on the region
serving the load (the one the load client is connected to); ``isolate-region`` and ``kill-region`` on
the primary."""

_REGION_FAULTS = ("isolate-region", "kill-region")


def _topology_holds(opts) -> dict[str, float]:
    """How long each fault lasts before its heal (``kill-nats-node`` keeps its server down ``hang_s`` itself)."""
    h = opts.hang_s
    return {"hang-worker": h, "slow-worker": h, "kill-valkey": h, "gateway-degrade": 2 * h, "gateway-cut": 1.5 * h,
            "isolate-region": 1.5 * h, "kill-region": 1.5 * h}


def _topology_pids(topo) -> dict[str, int]:
    out = {"drill": os.getpid()}
    for key, sup in topo.site_supervisors.items():
        site = key.split(":", 1)[1]
        for c in sup.which_children():
            if c.pid:
                out[f"{site}/{c.id}"] = c.pid
    for region in topo.spec.regions:
        if region in topo.down:
            continue
        try:
            for cid, pid in TopologyTarget(topo, region).actor_processes().items():
                out[f"{region}/{cid}"] = pid
        except FaultUnavailable:
            pass
    return out


def _incarnation_reigns(watch: RoleWatch, kills: dict[str, float]) -> list[tuple[str, int, float, float]]:
    """Primary reigns of every region-manager incarnation seen during the soak.

    An incarnation that is gone (its region was killed: ``kills[manager_id]``) and still primary in its
    last status reigned at most until the kill, and never past its lease validity.
    """
    out = []
    current = {r: mid for mid, (r, _, t) in sorted(watch.latest.items(), key=lambda kv: kv[1][2])}
    for mid, (region, st, _) in watch.latest.items():
        start = term = None
        for tr in st.transitions:
            if tr.event == "primary" and start is None:
                start, term = tr.t_mono, tr.term
            elif tr.event == "standby" and start is not None:
                out.append((region, term, start, tr.t_mono))
                start = None
        if start is not None:
            end = float("inf")
            if current.get(region) != mid:
                end = min(kills.get(mid, float("inf")), st.valid_until or float("inf"))
            out.append((region, term, start, end))
    return out


async def soak_topology(opts, topology=None) -> DrillFigures:
    """The soak on a local two-region topology (``inferbus chaos run soak --topology``).

    ``opts`` is a :class:`chaos.node_drills.DrillOptions` (``workers`` per region, ``hang_s``,
    ``fault_every_s``, ``health_timeout_s``). Cycle: :data:`TOPOLOGY_SOAK_CYCLE`. Besides the soak
    figures (:func:`chaos.node_drills.soak`), ``extra`` has ``max_primaries_sampled`` (every 50 ms),
    ``overlapping_reigns`` and ``terms_shared_by_regions`` (split-brain checks over every region-manager
    incarnation), and the RSS of every process of the topology (servers, Valkeys, nodes, actors, and
    this process, which runs the gateway proxies and the load). ``opts.faults`` replaces the cycle.
    With ``topology`` given (tests share one), it is used and left running.
    """
    from inferbus.cluster import ClusterSpec, Topology

    ro = RegionDrillOptions(duration_s=opts.duration_s, rate_qps=opts.rate_qps, timeout_s=opts.timeout_s,
                            model=opts.model, models_dir=opts.models_dir, workers=opts.workers, run_dir=opts.run_dir)
    cycle = list(opts.faults) if opts.faults else TOPOLOGY_SOAK_CYCLE
    if topology is None:
        spec = ClusterSpec(workers=opts.workers, audit=True, models_dir=opts.models_dir, models=(opts.model,),
                           health_timeout_s=opts.health_timeout_s)
        topo = await Topology(spec, run_dir=opts.run_dir).start()
    else:
        topo = topology
    sampler = RssSampler()
    holds = _topology_holds(opts)
    kills: dict[str, float] = {}
    try:
        async with _Setup(ro, topo) as s, RoleWatch(topo) as watch:
            load = asyncio.create_task(s.driver.run(opts.duration_s))
            t_start = time.monotonic()
            stop = asyncio.Event()
            rss_task = asyncio.create_task(sample_rss(sampler, lambda: _topology_pids(topo), stop))

            async def inject(name: str, k: int):
                if name in _REGION_FAULTS:
                    region = await topo.wait_settled(30)  # the primary (after any takeover in progress)
                    st = await topo.statuses(watch.nc, timeout_s=0.5)
                    if name == "kill-region":
                        mid = st[region].manager_id
                        f = await get_fault(name)(TopologyTarget(topo, region))
                        kills[mid] = f.t_inject
                        return f
                    return await get_fault(name)(TopologyTarget(topo, region))
                server = _client_server(s)
                region = topo.plan.servers[server].site if server else s.primary
                if name == "kill-nats-node":
                    return await get_fault(name)(TopologyTarget(topo, region), server=server, down_s=opts.hang_s)
                return await get_fault(name)(TopologyTarget(topo, region), index=k)

            try:
                faults, unavailable = await fault_cycle(
                    load, cycle, inject, lambda n: holds.get(n, 0.0),
                    fault_every_s=opts.fault_every_s, duration_s=opts.duration_s, t_start=t_start,
                    stop_load=s.driver.stop)
                await load
            finally:
                stop.set()
                await rss_task
        rs = _incarnation_reigns(watch, kills)
        tb = terms_by_region(rs)
        window_figures(s.driver.records, faults, executions=s.driver.executions)
        fig = s.driver.figures("soak", None, extra={
            "mode": "topology", "faults": strip_times(faults), "faults_unavailable": unavailable,
            "cycle": cycle, "rss_kib": sampler.summary(), "rss_verdict": sampler.verdict(),
            "max_primaries_sampled": watch.max_primaries, "overlapping_reigns": len(overlaps(rs)),
            "terms_shared_by_regions": sum(1 for v in tb.values() if len(v) > 1),
            "terms_by_region": {t: sorted(v) for t, v in tb.items()},
            "manager_incarnations": len(watch.latest), "fault_every_s": opts.fault_every_s,
            "rate_qps": opts.rate_qps, "workers_per_region": topo.spec.workers, "duration_s": opts.duration_s})
        fig.p99_ms_during_fault = p99_ms_in_windows(s.driver.records, faults)
        return fig
    finally:
        if topology is None:
            await topo.stop()
