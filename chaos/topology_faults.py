"""Fault injectors that act on a local multi-region topology (:class:`inferbus.cluster.Topology`).

The target is a :class:`TopologyTarget`: a running topology (started on this event
loop, whose gateway proxies run on it) and the region the faults act on. The
injectors are registered by name in :data:`chaos.faults.FAULTS` next to the node
faults; the node faults that make sense on a topology (kill / hang / slow an actor
process, kill Valkey) accept a :class:`TopologyTarget` too.

* ``kill-nats-node``: SIGKILL one nats-server of the region (default its first: the one its actors
  and the drills' clients are connected to). Heal: the region's supervisor restarts it (at once, or
  after ``down_s``); wait until it has its routes and gateways back.
* ``gateway-latency``: ``latency_ms`` (+ up to ``jitter_ms``) on the gateway proxies. Heal: removed.
* ``gateway-drop``: ``drop_pct`` % packet loss (a lost chunk arrives ``rto_ms`` late, as a TCP
  retransmission; 100 % = blackhole). Heal: removed.
* ``gateway-degrade``: latency and loss together (default 50 ms, 5 %). Heal: both removed.
* ``gateway-cut``: close and refuse the gateway connections (a partition). Heal: the cut is removed;
  the servers reconnect.
* ``isolate-region``: cut the region from every other site, witness included. Heal: the cut is
  removed; wait until exactly one primary is settled.
* ``kill-region``: SIGKILL every process of the region at once. Heal: start it again; wait until it
  rejoined as standby.

Gateway faults act on ``links``: ``"regions"`` (default: between the regions only,
the witness stays reachable from both sides), ``"all"`` (every pair of sites), or
an explicit list of site pairs such as ``[("A", "B")]``.

A fault that cannot act on the target raises :class:`chaos.faults.FaultUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass
from itertools import combinations

from .faults import Fault, FaultError, FaultUnavailable, _signal
from .load import sleep_until


@dataclass
class TopologyTarget:
    """A running :class:`inferbus.cluster.Topology` as a fault target.

    Attributes:
        topo: the topology (its proxies run on the caller's event loop).
        region: the region node-level faults act on (a drill following failovers may change it).
    """

    topo: object
    region: str

    # ---- actor processes (children of the region's node process) ----------------------------------
    def _node_pid(self) -> int:
        sup = self.topo.site_supervisors.get(f"region:{self.region}")
        if sup is None or self.region in self.topo.down:
            raise FaultUnavailable(f"region {self.region!r} is not running")
        for c in sup.which_children():
            if c.id.startswith("node:") and c.pid:
                return c.pid
        raise FaultUnavailable(f"region {self.region!r} has no running node process")

    def actor_processes(self) -> dict[str, int]:
        """``{child_id: pid}`` of the region node's actor processes (``worker:a-w0``, ``ingress:0``, ...).

        Read from /proc: the node runs each actor as ``python -m inferbus.actors KIND @<dir>/<id>.config.json``.
        """
        from inferbus.cluster._topology import _process_tree

        out: dict[str, int] = {}
        for pid in _process_tree([self._node_pid()])[1:]:
            argv = _cmdline(pid)
            if "inferbus.actors" not in argv:
                continue
            i = argv.index("inferbus.actors")
            if len(argv) < i + 3 or not argv[i + 2].startswith("@"):
                continue
            kind = argv[i + 1]
            base = os.path.basename(argv[i + 2][1:]).removesuffix(".config.json")
            rest = base[len(kind) + 1:] if base.startswith(kind + "-") else ""
            out[f"{kind}:{rest}" if rest else kind] = pid
        return out

    def child_pid(self, prefix: str, index: int = 0) -> tuple[str, int]:
        """``(child_id, pid)`` of the ``index``-th (modulo) actor whose id starts with ``prefix``.

        Raises:
            FaultUnavailable: no such actor process is running.
        """
        kids = sorted((cid, pid) for cid, pid in self.actor_processes().items() if cid.startswith(prefix))
        if not kids:
            raise FaultUnavailable(f"region {self.region}: no running actor whose id starts with {prefix!r}")
        return kids[index % len(kids)]

    async def wait_restart(self, child_id: str, old_pid: int, timeout_s: float = 60.0) -> None:
        """Wait until the node's supervisor runs ``child_id`` again under a new pid.

        Raises:
            FaultError: not restarted within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                pid = self.actor_processes().get(child_id)
            except FaultUnavailable:
                pid = None
            if pid and pid != old_pid:
                return
            await asyncio.sleep(0.02)
        raise FaultError(f"{self.region}/{child_id} was not restarted within {timeout_s:g} s")

    # ---- servers -------------------------------------------------------------------------------------
    def server_names(self, site: str | None = None) -> list[str]:
        """nats-server names of ``site`` (default: the target region), in the order clients try them."""
        return [s.name for s in self.topo.plan.site_servers(site or self.region)]

    def _server_slot(self, name: str):
        site = self.topo.plan.servers[name].site
        sup = self.topo.site_supervisors[f"servers:{site}"]
        for c in sup.which_children():
            if c.id == f"nats:{name}":
                return sup, c
        raise FaultUnavailable(f"no nats-server {name!r}")

    async def server_joined(self, name: str) -> bool:
        """True when server ``name`` answers and has routes to every live server of its site and
        outbound gateways to every other live site (from its monitoring endpoint)."""
        plan = self.topo.plan
        s = plan.servers[name]
        try:
            routez = await _http_json(s.monitor_port, "/routez")
            gatewayz = await _http_json(s.monitor_port, "/gatewayz")
        except (OSError, ValueError, asyncio.TimeoutError):
            return False
        live_sites = [x for x in self.topo.spec.sites if x not in self.topo.down]
        peers = {o.name for o in plan.site_servers(s.site) if o.name != name}
        routed = {r.get("remote_name") for r in routez.get("routes") or []}
        if not peers <= routed:
            return False
        out = set((gatewayz.get("outbound_gateways") or {}).keys())
        return {x for x in live_sites if x != s.site} <= out


# ---- helpers ------------------------------------------------------------------------------------------
def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


async def _http_json(port: int, path: str, timeout_s: float = 1.0) -> dict:
    """GET ``http://127.0.0.1:port/path`` and decode the JSON body (the nats-server monitoring endpoint)."""
    async def get() -> bytes:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        try:
            w.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            await w.drain()
            return await r.read()
        finally:
            w.close()

    raw = await asyncio.wait_for(get(), timeout_s)
    _, _, body = raw.partition(b"\r\n\r\n")
    return json.loads(body)


def _need_topology(target, name: str) -> TopologyTarget:
    if not isinstance(target, TopologyTarget):
        raise FaultUnavailable(f"{name}: needs a multi-server topology (chaos.topology_faults.TopologyTarget); "
                               f"a single node has one nats-server and no gateways")
    return target


def link_pairs(target: TopologyTarget, links="regions") -> list[tuple[str, str]]:
    """Site pairs a gateway fault acts on: ``"regions"``, ``"all"`` or an explicit list of pairs."""
    spec = target.topo.spec
    if links == "regions":
        return list(combinations(spec.regions, 2))
    if links == "all":
        return list(combinations(spec.sites, 2))
    pairs = [tuple(p) for p in links]
    for p in pairs:
        if len(p) != 2 or not set(p) <= set(spec.sites) or p[0] == p[1]:
            raise ValueError(f"links must be pairs of distinct sites of {', '.join(spec.sites)}, got {p!r}")
    return pairs


def _on_links(target: TopologyTarget, links, apply) -> list:
    """Apply ``apply(proxy, peers) -> proxy Fault`` to both directions of every link; the (proxy, fault) list."""
    topo = target.topo
    if not topo.proxies:
        raise FaultUnavailable("the topology's gateways are not proxied (ClusterSpec.proxy_gateways=False)")
    out = []
    for a, b in link_pairs(target, links):
        for site, peer in ((a, b), (b, a)):
            for p in topo.gateway_proxies(site):
                out.append((p, apply(p, {peer})))
    return out


def _gateway_fault(name: str, target, links, apply) -> Fault:
    t = _need_topology(target, name)
    pf = _on_links(t, links, apply)
    f = Fault(name, ",".join(f"{a}<->{b}" for a, b in link_pairs(t, links)), None, time.monotonic())

    async def heal():
        t.topo.heal(pf)
    f._heal = heal
    return f


# ---- injectors ----------------------------------------------------------------------------------------
async def kill_nats_node(target, server: str | None = None, index: int = 0, down_s: float = 0.0,
                         rejoin_timeout_s: float = 30.0, **_) -> Fault:
    """SIGKILL one nats-server of the target region.

    Args:
        server: its name (``A1``); default the ``index``-th (modulo) server of the region, so index 0 is
            the first server of the region's list: the one its actors (``dont_randomize``) and the drills'
            clients are connected to.
        down_s: keep it down this long before the restart (0: the site supervisor restarts it at once).
        rejoin_timeout_s: how long :meth:`Fault.heal` waits for the restart and the rejoin.

    Heal: wait for (or do) the restart, then until the server has its routes and gateways back.
    ``Fault.info`` gets ``restarted_at`` and ``rejoined_at`` (monotonic seconds).
    """
    t = _need_topology(target, "kill-nats-node")
    names = t.server_names()
    name = server or names[index % len(names)]
    if name not in t.topo.plan.servers:
        raise FaultUnavailable(f"kill-nats-node: no server {name!r}; servers: {', '.join(sorted(t.topo.plan.servers))}")
    sup, child = t._server_slot(name)
    if not child.pid:
        raise FaultUnavailable(f"kill-nats-node: nats-server {name} is not running")
    pid = child.pid
    _signal(pid, signal.SIGKILL)
    f = Fault("kill-nats-node", f"nats:{name}", pid, time.monotonic())
    if down_s > 0:
        await sup.terminate_child(child.id)  # keep it down (a restart that won the race is stopped again)

    async def heal():
        deadline = f.t_inject + max(down_s, 0) + rejoin_timeout_s
        if down_s > 0:
            await sleep_until(f.t_inject + down_s)  # down at least down_s (a timer may fire a little early)
            await sup.restart_child(child.id)
        while time.monotonic() < deadline:
            c = next((c for c in sup.which_children() if c.id == child.id), None)
            if c is not None and c.pid and c.pid != pid and c.status == "running":
                f.info.setdefault("restarted_at", time.monotonic())
                if await t.server_joined(name):
                    f.info["rejoined_at"] = time.monotonic()
                    return
            await asyncio.sleep(0.02)
        raise FaultError(f"kill-nats-node: {name} did not rejoin within {rejoin_timeout_s:g} s")
    f._heal = heal
    return f


async def kill_valkey_topology(target: TopologyTarget, **_) -> Fault:
    """SIGKILL the region's Valkey; its supervisor restarts it (heal waits for the new process)."""
    sup = target.topo.site_supervisors[f"region:{target.region}"]
    child = next((c for c in sup.which_children() if c.id.startswith("valkey:") and c.pid), None)
    if child is None:
        raise FaultUnavailable(f"kill-valkey: region {target.region} runs no Valkey")
    _signal(child.pid, signal.SIGKILL)
    f = Fault("kill-valkey", child.id, child.pid, time.monotonic())

    async def heal():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            c = next((c for c in sup.which_children() if c.id == child.id), None)
            if c is not None and c.pid and c.pid != child.pid and c.status == "running":
                return
            await asyncio.sleep(0.02)
        raise FaultError(f"kill-valkey: {child.id} was not restarted within 30 s")
    f._heal = heal
    return f


async def gateway_latency(target, latency_ms: float = 50.0, jitter_ms: float = 0.0, links="regions", **_) -> Fault:
    """Delay every gateway byte on ``links`` by ``latency_ms`` (+ up to ``jitter_ms``) each way."""
    return _gateway_fault("gateway-latency", target, links,
                          lambda p, peers: p.latency(latency_ms, jitter_ms, peers=peers))


async def gateway_drop(target, drop_pct: float = 5.0, rto_ms: float = 200.0, links="regions", **_) -> Fault:
    """``drop_pct`` % packet loss on ``links`` (see :mod:`chaos.proxy`; 100 % = blackhole)."""
    return _gateway_fault("gateway-drop", target, links,
                          lambda p, peers: p.drop(peers=peers, drop_pct=drop_pct, rto_ms=rto_ms))


async def gateway_degrade(target, latency_ms: float = 50.0, jitter_ms: float = 0.0, drop_pct: float = 5.0,
                          rto_ms: float = 200.0, links="regions", **_) -> Fault:
    """``latency_ms`` latency and ``drop_pct`` % loss together on ``links`` (a bad WAN); a 0 leaves that part out."""
    t = _need_topology(target, "gateway-degrade")
    lat = _on_links(t, links, lambda p, peers: p.latency(latency_ms, jitter_ms, peers=peers)) \
        if latency_ms > 0 or jitter_ms > 0 else []
    drop = _on_links(t, links, lambda p, peers: p.drop(peers=peers, drop_pct=drop_pct, rto_ms=rto_ms)) \
        if drop_pct > 0 else []
    f = Fault("gateway-degrade", ",".join(f"{a}<->{b}" for a, b in link_pairs(t, links)), None, time.monotonic())

    async def heal():
        t.topo.heal(lat + drop)
    f._heal = heal
    return f


async def gateway_cut(target, links="regions", **_) -> Fault:
    """Close and refuse the gateway connections on ``links`` (a partition; the default keeps the witness)."""
    return _gateway_fault("gateway-cut", target, links, lambda p, peers: p.cut(peers=peers))


async def isolate_region(target, settle_timeout_s: float = 30.0, **_) -> Fault:
    """Cut the target region from every other site; heal removes the cut and waits for one settled primary."""
    t = _need_topology(target, "isolate-region")
    pf = t.topo.isolate(t.region)
    f = Fault("isolate-region", t.region, None, time.monotonic())

    async def heal():
        t.topo.heal(pf)
        f.info["primary_after"] = await t.topo.wait_settled(settle_timeout_s)
    f._heal = heal
    return f


async def kill_region(target, settle_timeout_s: float = 60.0, **_) -> Fault:
    """SIGKILL every process of the target region; heal starts it again and waits until it rejoined as standby."""
    t = _need_topology(target, "kill-region")
    region = t.region
    t_kill = await t.topo.kill_region(region)
    f = Fault("kill-region", region, None, t_kill)

    async def heal():
        await t.topo.restore_region(region)
        f.info["primary_after"] = await t.topo.wait_settled(settle_timeout_s)
    f._heal = heal
    return f


TOPOLOGY_FAULTS = {
    "kill-nats-node": kill_nats_node,
    "gateway-latency": gateway_latency,
    "gateway-drop": gateway_drop,
    "gateway-degrade": gateway_degrade,
    "gateway-cut": gateway_cut,
    "isolate-region": isolate_region,
    "kill-region": kill_region,
}
"""The injectors of this module by name (merged into :data:`chaos.faults.FAULTS`)."""
