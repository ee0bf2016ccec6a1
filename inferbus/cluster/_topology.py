"""Run a local multi-region topology: every process supervised, logs under one run directory.

Supervision tree (OTP, :mod:`inferbus.supervisor`)::

    cluster (one_for_one)
     ├── servers:W   witness: nats-server W1..W3 (JetStream: the lease's replicas)
     ├── servers:A   nats-server A1..A3
     ├── servers:B   nats-server B1..B3
     ├── region:A    valkey (master), node A (region manager, aggregator, workers, ingress)
     └── region:B    valkey (replica of A's), node B

Every server starts before any node: JetStream elects its meta leader only once the
supercluster is whole (4-9 s after start, Raft election timeouts).

A region's node is its own OS process (``python -m inferbus.cluster node CONFIG``)
whose supervisor runs the actor processes, so :meth:`Topology.kill_region` can
SIGKILL every process of a region (servers, Valkey, node and the node's
children) at once, as a power loss would, and :meth:`Topology.restore_region`
brings it back (it rejoins as standby). The gateway proxies run on the loop
that started the topology.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec

from chaos.proxy import Fault, TcpProxy, nats_gateway_peer

from .._logs import LEVELS
from .._paths import write_private
from ..bus import close_connection, nats_server_binary, valkey_server_binary
from ..bus._embedded import write_valkey_auth
from ..supervisor import ChildSpec, ProcessChild, Restart, Strategy, Supervisor, SupervisorSpec, backing_off, \
    failure_domain_spec, reset_backoff
from ._plan import ClusterSpec, Plan


class TopologyError(RuntimeError):
    """The topology could not start or was used in a state that does not allow the call."""


class ClusterCommand(msgspec.Struct, tag="inferbus.v1.cluster_cmd", tag_field="type"):
    """A fault or repair for a running ``inferbus cluster up`` (on ``<p>._cluster.ctl``, via the witness)."""

    op: str
    """``info``, ``kill``, ``restore``, ``partition``, ``isolate`` or ``heal``."""
    region: str = ""
    side_a: list[str] = []
    side_b: list[str] = []


class ClusterReply(msgspec.Struct, tag="inferbus.v1.cluster_reply", tag_field="type"):
    """The answer of ``cluster up`` to a :class:`ClusterCommand`."""

    ok: bool
    detail: str = ""
    ms: float = 0.0
    """The command's own work, ms (the kill, the restore...), from when it could start."""
    waited_ms: float = 0.0
    """How long a ``kill`` or ``restore`` waited, ms, for those sent before it to finish (they run one at a time, in
    the order received); 0 for the other commands, which never wait."""
    waited_for: list[str] = []
    """The ``kill`` and ``restore`` commands it waited for (e.g. ``["restore A"]``), in the order received."""


class ControlServer:
    """What :meth:`Topology.serve_control` returns: its NATS connection and the commands in progress."""

    def __init__(self, nc) -> None:
        self.nc = nc
        """The witness connection the commands come in on."""
        self._tasks: set[asyncio.Task] = set()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro, name="cluster control command")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop serving: cancel the commands in progress (a restore stops what it had started; nothing is answered)
        and close the connection. Never raises for a connection that is closed or reconnecting."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        await close_connection(self.nc)


async def _wait_tcp(port: int, child: ProcessChild, greeting: bytes, send: bytes | None, timeout_s: float,
                    what: str) -> None:
    """Wait until 127.0.0.1:port answers with ``greeting`` (after sending ``send``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.returncode is not None:
            raise TopologyError(f"{what} exited ({child.returncode}): {' | '.join(child.output_tail[-5:])}")
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 0.5)
            try:
                if send:
                    w.write(send)
                    await w.drain()
                data = await asyncio.wait_for(r.read(len(greeting)), 0.5)
                if data.startswith(greeting):
                    return
            finally:
                w.close()
        except (OSError, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.02)
    raise TopologyError(f"{what} not ready on port {port} after {timeout_s:g} s")


def _process_tree(roots: list[int]) -> list[int]:
    """``roots`` and all their descendants (Linux /proc), parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        try:
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop(0)
        if pid in out:
            continue
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


@dataclass
class NodeProcessConfig:
    """What ``python -m inferbus.cluster node`` runs: one region's node (JSON on its command line)."""

    region: str
    nats_urls: list[str]
    redis_url: str | None
    prefix: str
    models_dir: str
    models: list[str]
    workers: int
    ingress: int
    actors: bool
    run_dir: str
    region_manager: dict
    audit: bool = False
    health_timeout_s: float = 5.0
    l2_lookup: bool = False
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    """``NodeConfig.metrics_host`` (``cluster up --http-host``)."""
    http_infer: bool = False
    """``NodeConfig.http_infer`` (``cluster up --http-infer``)."""
    http_model_control: bool = False
    """``NodeConfig.http_model_control`` (``cluster up --http-model-control``)."""
    http_idle_timeout_s: float = 30.0
    """``NodeConfig.http_idle_timeout_s`` (``cluster up --http-idle-timeout-s``), seconds."""
    http_max_connections: int = 100
    """``NodeConfig.http_max_connections`` (``cluster up --http-max-connections``)."""
    http_processes: int = 0
    """``NodeConfig.http_processes`` (``cluster up --http-processes``)."""
    log_level: str = "info"
    """``NodeConfig.log_level``: the node's and its actors' (``cluster up --log-level``)."""
    log_format: str = "text"
    """``NodeConfig.log_format`` (``cluster up --log-format``); with ``json`` the node process's own output is
    copied into its ``node.log`` as JSON Lines too."""


class Topology:
    """A running local topology (see the module docstring).

    Args:
        spec: what to run.
        run_dir: logs, configs, JetStream data, ``cluster.json``; when None, a new temp dir
            (``inferbus-cluster-*``) whose logs and configs outlive :meth:`stop` (its data —
            JetStream stores, Valkey dumps — is removed then), its path printed on stderr at start
            and stop; ``keep_logs=False`` removes it all.
        keep_logs: keep the temp run dir's logs after :meth:`stop` (ignored with ``run_dir``,
            which is never removed).

    Use ``async with Topology(spec) as topo:`` or :meth:`start` / :meth:`stop`.
    """

    def __init__(self, spec: ClusterSpec, run_dir: str | os.PathLike | None = None, *,
                 keep_logs: bool = True, log_level: str = "info", log_format: str = "text") -> None:
        from .._logs import check_log_options

        check_log_options(log_level, log_format)  # ValueError
        self.log_level, self.log_format = log_level, log_format
        """Each region's node's ``NodeConfig.log_level`` / ``log_format`` (``--log-level`` / ``--log-format``)."""
        self.spec = spec
        self._tmp: str | None = None
        self.keep_logs = keep_logs
        if run_dir is None:
            self._tmp = run_dir = tempfile.mkdtemp(prefix="inferbus-cluster-")
        self.run_dir = Path(run_dir)
        self.plan = Plan.make(spec)
        self.proxies: dict[str, TcpProxy] = {}
        self.supervisor: Supervisor | None = None
        self.site_supervisors: dict[str, Supervisor] = {}
        self._domains: dict[str, ChildSpec] = {}  # each site's child spec in the cluster supervisor (failure domains)
        self._run_task: asyncio.Task | None = None
        self._run_dir_lock: int | None = None
        """The descriptor holding the run dir's lock (``node.lock``, as a node's) from :meth:`start` to :meth:`stop`."""
        self.down: set[str] = set()
        self.models_dir = spec.models_dir or self._default_models()
        self.valkey_password = secrets.token_urlsafe(24)
        """Every region's Valkey requires it (``requirepass``; ``masterauth`` for the standbys' replication), kept in
        0600 files of the run dir only (``valkey/<region>/valkey.conf``, the nodes' configs), never in an argv."""

    def valkey_url(self, region: str) -> str | None:
        """``region``'s Valkey as its node and region manager reach it: with the password (show it with
        :func:`inferbus.bus.shown_url`); None without a cache."""
        url = self.plan.valkey_url(region)
        return url.replace("redis://", f"redis://:{self.valkey_password}@", 1) if url else None

    @staticmethod
    def _default_models() -> str:
        from ..actors import default_models_dir

        return str(Path(default_models_dir()).resolve())

    # ---- child specs -----------------------------------------------------------------------------
    def _nats_child(self, name: str) -> ChildSpec:
        s = self.plan.servers[name]
        d = self.run_dir / "nats" / name
        conf = d / f"{name}.conf"

        async def start():
            d.mkdir(parents=True, exist_ok=True)
            conf.write_text(self.plan.server_conf(name, d / "js"))
            child = await ProcessChild.start([str(nats_server_binary()), "-c", str(conf)], ready_line=None,
                                             log_path=d / f"{name}.log", name=f"nats-{name}")
            try:
                await _wait_tcp(s.port, child, b"INFO", None, 20.0, f"nats-server {name}")
            except BaseException:
                await child.stop(None)
                raise
            return child

        return ChildSpec(id=f"nats:{name}", start=start, restart=Restart.PERMANENT, shutdown_timeout_s=5.0)

    def _valkey_child(self, region: str) -> ChildSpec:
        port = self.plan.valkey_ports[region]
        d = self.run_dir / "valkey" / region
        primary = self.spec.regions[0]

        async def start():
            d.mkdir(parents=True, exist_ok=True)
            conf = write_valkey_auth(d / "valkey.conf", self.valkey_password)
            argv = [str(valkey_server_binary()), str(conf), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", str(d), "--protected-mode", "no", "--maxmemory", "64mb",
                    "--maxmemory-policy", "allkeys-lru"]
            if region != primary:
                argv += ["--replicaof", "127.0.0.1", str(self.plan.valkey_ports[primary])]
            child = await ProcessChild.start(argv, ready_line=None, log_path=d / "valkey.log",
                                             name=f"valkey-{region}")
            try:
                # (it requires the password: a PING without it is answered NOAUTH, which says it serves)
                await _wait_tcp(port, child, b"-NOAUTH", b"PING\r\n", 20.0, f"valkey {region}")
            except BaseException:
                await child.stop(None)
                raise
            return child

        return ChildSpec(id=f"valkey:{region}", start=start, restart=Restart.PERMANENT, shutdown_timeout_s=5.0)

    def region_manager_config(self, region: str) -> dict:
        """The :class:`inferbus.actors.RegionConfig` (as a dict) of ``region``'s manager."""
        from ..actors._region import RegionConfig
        from ..bus import BusConfig

        sp = self.spec
        urls = self.plan.urls(region)
        bus = BusConfig(servers=tuple(urls), prefix=sp.prefix, no_randomize=True, ping_interval_s=0.5,
                        max_outstanding_pings=2)
        # the lease traffic goes straight to the witness (through the region's lease proxies when the
        # gateways are proxied), so a dead server of this region cannot blind it (docs/regions.md)
        lease_urls = ([f"nats://127.0.0.1:{p.port}" for k, p in self.proxies.items()
                       if k.startswith(f"lease:{region}:")] or self.plan.urls(sp.witness))
        lease_bus = BusConfig(servers=tuple(lease_urls), prefix=sp.prefix, no_randomize=True, ping_interval_s=0.5,
                              max_outstanding_pings=2)
        rc = RegionConfig(region=region, bus=bus, lease_bus=lease_bus, valkey_url=self.valkey_url(region),
                          placement_cluster=sp.witness, replicas=sp.lease_replicas, heartbeat_ms=sp.heartbeat_ms,
                          lease_ms=sp.lease_ms, suspect_ms=sp.suspect_ms, hold_ms=sp.hold_ms,
                          initial_primary=region == sp.regions[0])
        return json.loads(rc.to_json())

    def metrics_port(self, region: str) -> int | None:
        """The port of ``region``'s node's HTTP port (metrics and the OIP v2 REST API): :attr:`ClusterSpec.metrics_port`
        + its index, or the one picked for it when that is 0 (:attr:`Plan.metrics_ports`; the same after a
        ``restore``); None without one."""
        return self.plan.metrics_ports.get(region)

    def _node_child(self, region: str) -> ChildSpec:
        sp = self.spec
        d = self.run_dir / "nodes" / region
        cfg = NodeProcessConfig(region=region, nats_urls=self.plan.urls(region),
                                redis_url=self.valkey_url(region), prefix=sp.prefix, models_dir=self.models_dir,
                                models=list(sp.models), workers=sp.workers, ingress=sp.ingress, actors=sp.actors,
                                run_dir=str(d), region_manager=self.region_manager_config(region), audit=sp.audit,
                                health_timeout_s=sp.health_timeout_s, l2_lookup=sp.l2_lookup,
                                metrics_port=self.metrics_port(region), metrics_host=sp.metrics_host,
                                http_infer=sp.http_infer,
                                http_model_control=sp.http_model_control,
                                http_idle_timeout_s=sp.http_idle_timeout_s,
                                http_max_connections=sp.http_max_connections,
                                http_processes=sp.http_processes, log_level=self.log_level,
                                log_format=self.log_format)
        # the config from a 0600 file, not argv (it holds the Valkey's password; every local user can read argv)
        cfg_path = d / "node.config.json"
        argv = [sys.executable, "-m", "inferbus.cluster", "node", f"@{cfg_path}"]

        async def start():
            d.mkdir(parents=True, exist_ok=True)
            write_private(cfg_path, json.dumps(asdict(cfg)))
            as_json = self.log_format == "json"
            return await ProcessChild.start(argv, ready_line="READY", start_timeout_s=120.0,
                                            log_path=d / "node.log", log_timestamps=not as_json,
                                            log_json_actor=f"node-{region.lower()}" if as_json else None,
                                            log_ready=LEVELS[self.log_level] <= logging.INFO,
                                            name=f"node-{region}")

        return ChildSpec(id=f"node:{region}", start=start, restart=Restart.PERMANENT, shutdown_timeout_s=15.0)

    # ---- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> "Topology":
        """Start proxies, the witness, then each region in order; return when every node is READY.

        Raises:
            TopologyError / ChildStartError: something did not start (what started is stopped again).
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self._run_dir_lock is None:  # before anything is written there: a second cluster up on a live one's run
            # dir rewrote its cluster.json, server and Valkey configs (region status then read the other's ports)
            from ..actors._node import _lock_run_dir

            self._run_dir_lock = _lock_run_dir(self.run_dir, "cluster")
        if self._tmp is not None:
            print(f"inferbus cluster: run dir {self.run_dir} (a temp dir; logs are kept after stop)"
                  if self.keep_logs else f"inferbus cluster: run dir {self.run_dir} (removed on stop)",
                  file=sys.stderr, flush=True)
        sp = self.spec
        import anyio

        with anyio.CancelScope():  # loads anyio's backend now, not in the middle of kill_region (~80 ms)
            pass
        if sp.proxy_gateways:
            for s in self.plan.servers.values():
                p = TcpProxy(("127.0.0.1", s.gateway_port), listen_port=s.proxy_port, name=f"gw-{s.name}",
                             labels={"site": s.site, "server": s.name}, classify=nats_gateway_peer)
                await p.start()
                self.proxies[s.name] = p
            # each region manager's lease connection (to the witness's client ports) goes through a
            # proxy of its own, labelled as a link between the witness and that region, so that cutting
            # or degrading the W<->region link affects the lease traffic as it would across a real WAN
            for region in sp.regions:
                for s in self.plan.site_servers(sp.witness):
                    p = TcpProxy(("127.0.0.1", s.port), name=f"lease-{region}-{s.name}",
                                 labels={"site": sp.witness, "server": s.name, "lease_of": region},
                                 classify=lambda _line, r=region: r)
                    await p.start()
                    self.proxies[f"lease:{region}:{s.name}"] = p
        # every nats-server first (a JetStream meta leader is elected only once the supercluster is
        # whole), then each region's Valkey and node; the first region is the initial primary
        specs = []
        for site in sp.sites:
            sup = Supervisor(SupervisorSpec(strategy=Strategy.ONE_FOR_ONE, intensity=20, period_s=10.0),
                             [self._nats_child(s.name) for s in self.plan.site_servers(site)],
                             name=f"servers-{site}")
            self.site_supervisors[f"servers:{site}"] = sup
            # each site is a failure domain: a crash loop it gives up on is restarted after a back-off and does not
            # count against the cluster supervisor's intensity, so it cannot stop the other sites
            specs.append(failure_domain_spec(sup, f"servers:{site}"))
            self._domains[f"servers:{site}"] = specs[-1]
        for region in sp.regions:
            kids = ([self._valkey_child(region)] if sp.cache else []) + [self._node_child(region)]
            sup = Supervisor(SupervisorSpec(strategy=Strategy.ONE_FOR_ONE, intensity=20, period_s=10.0), kids,
                             name=f"region-{region}")
            self.site_supervisors[f"region:{region}"] = sup
            specs.append(failure_domain_spec(sup, f"region:{region}"))
            self._domains[f"region:{region}"] = specs[-1]
        self.supervisor = Supervisor(SupervisorSpec(strategy=Strategy.ONE_FOR_ONE, intensity=10, period_s=10.0),
                                     specs, name="cluster")
        (self.run_dir / "cluster.json").write_text(json.dumps(self.plan.to_dict(), indent=2))
        try:
            await self.supervisor.start()
        except BaseException:
            await self._stop_proxies()
            fd, self._run_dir_lock = self._run_dir_lock, None
            if fd is not None:
                os.close(fd)
            raise
        self._run_task = asyncio.create_task(self.supervisor.run())
        return self

    async def wait_failed(self) -> BaseException | None:
        """Return once the cluster's supervisor tree has ended by itself (it gave up: its intensity exceeded), with
        why; None when it ended otherwise (stopped). Waits for ever while it runs."""
        if self._run_task is None:
            return None
        await asyncio.wait((self._run_task,))
        return None if self._run_task.cancelled() else self._run_task.exception()

    async def stop(self) -> None:
        """Stop everything (regions in reverse order, then the witness, then the proxies). Idempotent."""
        if self.supervisor is not None:
            try:
                await self.supervisor.stop()
            except Exception:
                pass
        if self._run_task is not None:
            self._run_task.cancel()
            try:
                await self._run_task
            except BaseException:
                pass
            self._run_task = None
        await self._stop_proxies()
        fd, self._run_dir_lock = self._run_dir_lock, None
        if fd is not None:
            os.close(fd)
        if self._tmp is not None:
            import shutil

            if self.keep_logs:  # logs and configs stay; the data goes (JetStream stores, Valkey dumps)
                for d in self.run_dir.glob("nats/*/js"):
                    shutil.rmtree(d, ignore_errors=True)
                for f in self.run_dir.glob("valkey/*/*.rdb"):
                    f.unlink(missing_ok=True)
                print(f"inferbus cluster: logs kept in {self.run_dir}", file=sys.stderr, flush=True)
            else:
                shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    async def _stop_proxies(self) -> None:
        for p in self.proxies.values():
            await p.stop()

    async def __aenter__(self) -> "Topology":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def _witness_connect(self):
        """A nats-py connection to the witness servers whose errors are one stderr line each: with nats-py's default
        error callback, a witness SIGKILLed under ``cluster up`` printed a full traceback per failed reconnect (a
        fresh-user trial)."""
        import sys

        import nats

        async def one_line(exc: Exception) -> None:
            print(f"cluster: witness connection: {exc!r}", file=sys.stderr, flush=True)

        return await nats.connect(self.urls(self.spec.witness), connect_timeout=2, error_cb=one_line)

    async def statuses(self, nc=None, timeout_s: float = 1.0) -> dict:
        """``{region: RegionStatus | None}`` from each live region's manager (None = no answer)."""
        from ..actors._region import ask_region

        own = nc is None
        if own:
            nc = await self._witness_connect()
        try:
            async def one(r):
                try:
                    return (await ask_region(nc, self.spec.prefix, r, "status", timeout_s=timeout_s)).status
                except Exception:
                    return None

            regions = [r for r in self.spec.regions if r not in self.down]
            return dict(zip(regions, await asyncio.gather(*(one(r) for r in regions))))
        finally:
            if own:
                await close_connection(nc)

    async def wait_settled(self, timeout_s: float = 30.0) -> str:
        """Wait until exactly one live region is primary and every other live region's manager
        is standby, hears its heartbeats and knows its term, and the primary hears the standby's
        (a demote needs a live successor). Returns the primary region.

        Raises:
            TopologyError: not settled within ``timeout_s`` (the last statuses are in the message).
        """
        nc = await self._witness_connect()
        deadline = time.monotonic() + timeout_s
        last = {}
        try:
            while time.monotonic() < deadline:
                last = await self.statuses(nc, timeout_s=0.5)
                prim = [r for r, st in last.items() if st is not None and st.role == "primary"]
                if len(prim) == 1 and all(st is not None for st in last.values()):
                    p = prim[0]
                    term = last[p].term
                    if all(r == p or (st.role == "standby" and st.term == term
                                      and st.heartbeat_age_ms.get(p, 1e9) < self.spec.suspect_ms
                                      and last[p].heartbeat_age_ms.get(r, 1e9) < self.spec.suspect_ms)
                           for r, st in last.items()):
                        return p
                await asyncio.sleep(0.05)
        finally:
            await close_connection(nc)
        summary = {r: (st.role, st.term, st.lease_rev) if st else None for r, st in last.items()}
        raise TopologyError(f"regions not settled after {timeout_s:g} s: {summary}")

    # ---- remote control ---------------------------------------------------------------------------
    def control_subject(self) -> str:
        return f"{self.spec.prefix}._cluster.ctl"

    async def serve_control(self) -> "ControlServer":
        """Answer :class:`ClusterCommand` s on ``<p>._cluster.ctl`` through a witness server.

        Each command is handled in a task of its own, so one never waits behind another in the subscription (nats-py
        runs a subscription's callbacks one at a time: a ``heal`` or a ``kill`` sent during a 3-7 s ``restore`` was
        handled only after it, and the kill's reply said 107.8 ms where its command took 7.6 s). ``kill`` and
        ``restore`` still run one at a time, in the order received (both go through the cluster supervisor, and a
        kill must not race a restore of the same region); the reply of one that waited says how long and for what
        (:attr:`ClusterReply.waited_ms`, :attr:`ClusterReply.waited_for`), and its ``ms`` is its own work.
        ``info``, ``partition``, ``isolate`` and ``heal`` are answered at once.

        Returns:
            The server; :meth:`ControlServer.close` stops serving (commands in progress are cancelled).
        """
        nc = await self._witness_connect()
        dec = msgspec.msgpack.Decoder(ClusterCommand)
        one_at_a_time = asyncio.Lock()  # FIFO: kill and restore in the order received
        queued: list[str] = []  # the kill and restore commands received and not answered yet, in that order

        async def kill_or_restore(cmd: ClusterCommand) -> ClusterReply:
            if cmd.op == "kill" and cmd.region in self.down:  # (it said "every process ... killed" again)
                return ClusterReply(True, f"region {cmd.region} is down already (killed earlier; nothing to "
                                          f"kill): `cluster restore {cmd.region}` starts it again")
            if cmd.op == "kill":
                await self.kill_region(cmd.region)
                return ClusterReply(True, f"every process of region {cmd.region} killed")
            if cmd.region in self.spec.regions and cmd.region not in self.down and not self.backing_off(cmd.region):
                # (it was the supervisor's "ChildRunning: supervisor 'cluster': child 'servers:B' is running")
                return ClusterReply(False, f"region {cmd.region} is running; nothing to restore (`cluster kill "
                                           f"{cmd.region}` takes it down)")
            await self.restore_region(cmd.region)
            return ClusterReply(True, f"region {cmd.region} started again")

        async def handle(msg, t_in: float) -> None:
            t = t_in
            waited: list[str] = []
            name = None
            try:
                cmd = dec.decode(msg.data)
                if cmd.op in ("kill", "restore"):
                    name = f"{cmd.op} {cmd.region}"
                    waited = list(queued)
                    queued.append(name)
                    async with one_at_a_time:
                        t = time.monotonic()
                        reply = await kill_or_restore(cmd)
                elif cmd.op == "info":
                    reply = ClusterReply(True, json.dumps(self.plan.to_dict()))
                elif cmd.op == "partition":
                    n = len(self.partition(set(cmd.side_a), set(cmd.side_b)))
                    reply = ClusterReply(True, f"{cmd.side_a} cut from {cmd.side_b} ({n} proxy faults)")
                elif cmd.op == "isolate":
                    n = len(self.isolate(cmd.region))
                    reply = ClusterReply(True, f"{cmd.region} cut from every other site ({n} proxy faults)")
                elif cmd.op == "heal":
                    self.heal()
                    reply = ClusterReply(True, "every gateway fault removed")
                else:
                    reply = ClusterReply(False, f"unknown op {cmd.op!r}; ops: info, kill, restore, partition, "
                                                f"isolate, heal")
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                reply = ClusterReply(False, f"bad command: {exc}")
            except Exception as exc:
                reply = ClusterReply(False, f"{type(exc).__name__}: {exc}")
            finally:
                if name is not None:
                    queued.remove(name)
            now = time.monotonic()
            reply.ms = (now - t) * 1000
            reply.waited_ms = (t - t_in) * 1000
            reply.waited_for = waited
            if msg.reply:
                try:
                    await nc.publish(msg.reply, msgspec.msgpack.encode(reply))
                except Exception as exc:  # (the connection closed or reconnecting: the asker times out)
                    print(f"cluster: control: cannot answer {name or 'a command'}: {exc!r}", file=sys.stderr,
                          flush=True)

        server = ControlServer(nc)

        async def on_cmd(msg) -> None:  # returns at once: the next command is taken while this one runs
            server._spawn(handle(msg, time.monotonic()))

        await nc.subscribe(self.control_subject(), cb=on_cmd)
        await nc.flush()
        return server

    # ---- addresses ------------------------------------------------------------------------------
    def urls(self, site: str) -> list[str]:
        """Client URLs of one site's servers."""
        return self.plan.urls(site)

    def client_urls(self, first: str | None = None) -> list[str]:
        """A client server list spanning the regions, ``first``'s servers first."""
        return self.plan.client_urls(first)

    def pids(self, region: str) -> list[int]:
        """Every live process of ``region``: node and its descendants first, then Valkey and servers."""
        kids = (self.site_supervisors[f"region:{region}"].which_children()
                + self.site_supervisors[f"servers:{region}"].which_children())
        node = [c.pid for c in kids if c.pid and c.id.startswith("node:")]
        others = [c.pid for c in kids if c.pid and not c.id.startswith("node:")]
        return _process_tree(node) + _process_tree(others)

    # ---- faults --------------------------------------------------------------------------------
    async def kill_region(self, region: str) -> float:
        """SIGKILL every process of ``region`` at once and keep it down (no restarts).

        The node goes first (so nothing restarts its actors), then its descendants,
        servers and Valkey, all without yielding to the loop in between.

        Returns:
            ``time.monotonic()`` just before the first kill.
        """
        if region not in self.spec.regions:
            raise TopologyError(f"unknown region {region!r}; regions: {', '.join(self.spec.regions)}")
        pids = self.pids(region)
        t = time.monotonic()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.last_kill = {"pids": len(pids), "collect_kill_ms": (time.monotonic() - t) * 1000}
        self.down.add(region)
        await self.supervisor.terminate_child(f"region:{region}")
        await self.supervisor.terminate_child(f"servers:{region}")
        return t

    def backing_off(self, region: str) -> bool:
        """Whether a site supervisor of ``region`` (its servers' or its own) waits out a back-off now, after it gave
        up on a crash loop (:func:`~inferbus.supervisor.failure_domain_spec`)."""
        return any(backing_off(self._domains[cid]) for cid in (f"servers:{region}", f"region:{region}"))

    async def restore_region(self, region: str) -> None:
        """Start a killed (or stopped) region again (servers, Valkey, node), or one waiting out a back-off at once;
        its manager rejoins as standby."""
        for cid in (f"servers:{region}", f"region:{region}"):
            spec = self._domains[cid]
            if region not in self.down and not backing_off(spec):
                continue  # running (a region whose other supervisor is backing off): kept
            if backing_off(spec):
                await self.supervisor.terminate_child(cid)  # cancels the wait
            reset_backoff(spec)  # a deliberate restore starts at once, whatever failed before
            await self.supervisor.restart_child(cid)
        self.down.discard(region)

    def gateway_proxies(self, site: str) -> list[TcpProxy]:
        return [p for p in self.proxies.values() if p.labels.get("site") == site]

    def partition(self, side_a: set[str] | list[str], side_b: set[str] | list[str]) -> list[tuple[TcpProxy, Fault]]:
        """Cut every gateway connection between the sites of ``side_a`` and those of ``side_b``.

        Returns:
            The injected faults, for :meth:`heal`.

        Raises:
            TopologyError: gateways are not proxied.
        """
        if not self.proxies:
            raise TopologyError("gateways are not proxied (ClusterSpec.proxy_gateways=False)")
        a, b = set(side_a), set(side_b)
        faults = []
        for site in a:
            for p in self.gateway_proxies(site):
                faults.append((p, p.cut(peers=b)))
        for site in b:
            for p in self.gateway_proxies(site):
                faults.append((p, p.cut(peers=a)))
        return faults

    def isolate(self, site: str) -> list[tuple[TcpProxy, Fault]]:
        """Cut ``site`` from every other site."""
        return self.partition({site}, set(self.spec.sites) - {site})

    def heal(self, faults: list[tuple[TcpProxy, Fault]] | None = None) -> None:
        """Remove the given faults (None = every fault on every proxy)."""
        if faults is None:
            for p in self.proxies.values():
                p.heal()
        else:
            for p, f in faults:
                p.heal(f)
