"""The plan of a local multi-region topology: sites, servers, ports and nats-server config text.

A *site* is one NATS cluster: each region (``A``, ``B``, ...) and the witness
(``W``), the third site that the JetStream quorum of the lease needs (DESIGN §8).
Sites are joined by gateways into one supercluster. Only the witness servers run
JetStream (``sync_interval: always``), so the election stream lives there and
the JetStream meta group does not depend on either region; clients and actors in
a region reach it through the gateways.

Gateways go through per-server TCP proxies (:mod:`chaos.proxy`) when
``proxy_gateways`` is on: every server advertises its proxy as its gateway
address, so both the configured and the gossiped gateway URLs lead through a
proxy, and a partition between sites needs no root (cut the proxies).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import random
import socket

from .._limits import MAX_HTTP_CONNECTIONS, MAX_HTTP_PROCESSES, interval

_EPHEMERAL_FLOOR = 32768
"""Linux hands out outbound (ephemeral) ports from 32768 up by default; ports planned long before
use are taken below it, so an outbound connection made meanwhile cannot grab one."""


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_FLOOR


def pick_ports(n: int, rng: random.Random | None = None) -> list[int]:
    """``n`` distinct TCP ports free right now on 127.0.0.1, below the ephemeral range."""
    rng = rng or random.Random()
    hi = max(_ephemeral_low(), 11000)
    out: list[int] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise RuntimeError(f"could not find {n} free ports below {hi}")
        p = rng.randrange(10000, hi)
        if p in out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
        out.append(p)
    return out


@dataclass(frozen=True)
class ClusterSpec:
    """What ``inferbus cluster up`` runs. Validated in ``__post_init__``."""

    regions: tuple[str, ...] = ("A", "B")
    """Region names (subject tokens); the first is the initial primary."""
    witness: str = "W"
    """Name of the witness site (the third site of the JetStream quorum)."""
    servers_per_region: int = 3
    witness_servers: int = 3
    """3 or 5 (the lease stream has 3 replicas, all on the witness); 1 is refused (no JetStream cluster of one)."""
    prefix: str = "inferbus"
    models_dir: str | None = None
    """Model repository; None = the package's default ``models/``."""
    models: tuple[str, ...] = ()
    workers: int = 1
    """Worker processes per region."""
    ingress: int = 1
    """Ingress processes per region."""
    actors: bool = True
    """Run the serving actors; False = only servers and region managers (election tests)."""
    cache: bool = True
    """Run a Valkey per region (master in the initial primary, replicas elsewhere)."""
    proxy_gateways: bool = True
    """Route every gateway connection through a TCP proxy (for partitions)."""
    base_port: int = 0
    """0 = free ports; else consecutive ports from here."""
    heartbeat_ms: int = 100
    lease_ms: int = 400
    suspect_ms: int = 400
    hold_ms: int = 3000
    js_max_memory: str = "16MB"
    js_max_file: str = "64MB"
    server_ping_interval: str = "1s"
    """nats-server ``ping_interval`` (applies to routes and gateways too): a blackholed link is noticed
    after about ``ping_interval * ping_max``."""
    audit: bool = False
    """Workers publish executed request ids on ``<p>._audit`` (drills count duplicates)."""
    health_timeout_s: float = 5.0
    l2_lookup: bool = False
    metrics_port: int | None = None
    """Each region's node's HTTP port (Prometheus metrics of its actors and its region manager, ``inferbus_region_*``,
    and the OIP v2 REST API): region ``k`` (in :attr:`regions` order) on ``metrics_port + k``; 0 = a free port for
    each region (:meth:`Plan.make` picks them, below the ephemeral range, as for ``base_port`` 0: not consecutive;
    :attr:`Plan.metrics_ports` says which); None = none (docs/observability.md, docs/http.md)."""
    metrics_host: str = "0.0.0.0"
    """The address each region's node's HTTP port listens on (``NodeConfig.metrics_host``; ``0.0.0.0``: every
    interface, ``127.0.0.1``: this host only)."""
    http_infer: bool = False
    """Serve OIP v2 inference on each region's node's HTTP port (``NodeConfig.http_infer``; docs/http.md); needs
    :attr:`metrics_port` (ValueError)."""
    http_model_control: bool = False
    """Serve Triton's model load and unload on each region's node's HTTP port (``NodeConfig.http_model_control``;
    docs/http.md); needs :attr:`metrics_port` (ValueError)."""
    http_idle_timeout_s: float = 30.0
    """Seconds each region's node's HTTP port keeps a connection without a byte in or out
    (``NodeConfig.http_idle_timeout_s``, ``cluster up --http-idle-timeout-s``), in (0, 3600]; default as the node's."""
    http_max_connections: int = 100
    """Open connections at most on each region's node's HTTP port, and threads running their requests
    (``NodeConfig.http_max_connections``, ``cluster up --http-max-connections``), in [1, 1000]; default as the
    node's."""
    http_processes: int = 0
    """Processes of their own serving each region's node's HTTP port (``NodeConfig.http_processes``, ``cluster up
    --http-processes``; docs/http.md, "HTTP processes"), in [0, 256]; 0 = the node process serves it; needs
    :attr:`metrics_port` when not 0 (ValueError). :attr:`http_max_connections` is per process."""

    def __post_init__(self) -> None:
        names = list(self.regions) + [self.witness]
        if self.metrics_port is not None and (isinstance(self.metrics_port, bool) or not isinstance(
                self.metrics_port, int) or not 0 <= self.metrics_port <= 65536 - len(self.regions)):
            raise ValueError(f"ClusterSpec.metrics_port must be None (none), 0 (a free port for each region) or in "
                             f"{interval(1, 65536 - len(self.regions))} (the first region's port, its "
                             f"{len(self.regions)} regions on consecutive ports), got {self.metrics_port!r}")
        if not (isinstance(self.http_idle_timeout_s, (int, float)) and not isinstance(self.http_idle_timeout_s, bool)
                and 0 < self.http_idle_timeout_s <= 3600):
            raise ValueError(f"ClusterSpec.http_idle_timeout_s must be in {interval(0, 3600, lo_open=True)} s, got "
                             f"{self.http_idle_timeout_s!r}")
        if isinstance(self.http_max_connections, bool) or not isinstance(self.http_max_connections, int) or \
                not 1 <= self.http_max_connections <= MAX_HTTP_CONNECTIONS:
            raise ValueError(f"ClusterSpec.http_max_connections must be in {interval(1, MAX_HTTP_CONNECTIONS)}, got "
                             f"{self.http_max_connections!r}")
        if isinstance(self.http_processes, bool) or not isinstance(self.http_processes, int) or \
                not 0 <= self.http_processes <= MAX_HTTP_PROCESSES:
            raise ValueError(f"ClusterSpec.http_processes must be in {interval(0, MAX_HTTP_PROCESSES)} (0 = each "
                             f"region's node process serves its HTTP port), got {self.http_processes!r}")
        if self.http_processes and self.metrics_port is None:
            raise ValueError("ClusterSpec.http_processes serves the nodes' HTTP ports and needs metrics_port")
        if self.http_infer and self.metrics_port is None:
            raise ValueError("ClusterSpec.http_infer serves inference on the nodes' HTTP ports and needs metrics_port")
        if self.http_model_control and self.metrics_port is None:
            raise ValueError("ClusterSpec.http_model_control serves model load and unload on the nodes' HTTP ports "
                             "and needs metrics_port")
        if len(self.regions) < 2:
            raise ValueError("ClusterSpec.regions: at least two regions")
        if len(set(names)) != len(names):
            raise ValueError(f"ClusterSpec: region and witness names must be distinct, got {', '.join(names)}")
        for n in names:
            if not n or not n.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"ClusterSpec: site name {n!r} must be letters, digits, '_' or '-'")
        if self.servers_per_region < 1 or self.witness_servers not in (3, 5):
            # 1 witness server is refused: its JetStream runs clustered (it is a site of the supercluster) and a
            # JetStream cluster of one server has no routes to form it, so nats-server exits at start; and a lone
            # witness holds the lease with 1 replica, which no server loss leaves writable
            raise ValueError("ClusterSpec: servers_per_region >= 1 and witness_servers in (3, 5) (the lease bucket's "
                             "quorum; 1 cannot form a JetStream cluster)")
        if self.workers < 1 or self.ingress < 1:
            raise ValueError("ClusterSpec: workers >= 1 and ingress >= 1")

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(self.regions) + (self.witness,)

    @property
    def lease_replicas(self) -> int:
        return min(3, self.witness_servers)


@dataclass
class ServerPlan:
    """One nats-server: names and ports."""

    name: str
    site: str
    port: int
    route_port: int
    gateway_port: int
    monitor_port: int
    proxy_port: int = 0
    """Where other sites reach this server's gateway (its proxy; = gateway_port when not proxied)."""

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


@dataclass
class Plan:
    """Every server and Valkey of a topology with its ports."""

    spec: ClusterSpec
    servers: dict[str, ServerPlan] = field(default_factory=dict)
    valkey_ports: dict[str, int] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)
    """Each region's node's HTTP port (:attr:`ClusterSpec.metrics_port`: consecutive from it, or picked when it is 0);
    empty without one."""

    @classmethod
    def make(cls, spec: ClusterSpec) -> "Plan":
        """Assign ports: consecutive from ``spec.base_port``, or free ones when it is 0; the regions' HTTP ports
        consecutive from ``spec.metrics_port``, or free ones (none of the others) when it is 0. A port picked free
        may be taken by another process before its server binds it (the start then fails, naming it).

        Raises:
            ValueError: ``spec.base_port`` is outside 1..65535 or its consecutive ports would pass 65535.
            RuntimeError: no free ports to pick (:func:`pick_ports`).
        """
        n_servers = len(spec.regions) * spec.servers_per_region + spec.witness_servers
        need = 5 * n_servers + len(spec.regions)
        if spec.base_port and not 1 <= spec.base_port <= 65536 - need:
            raise ValueError(f"ClusterSpec.base_port must be 0 (free ports) or in {interval(1, 65536 - need)} (the "
                             f"topology takes {need} consecutive ports from it), got {spec.base_port}")
        nxt = iter(range(spec.base_port, spec.base_port + need) if spec.base_port else pick_ports(need))

        def port() -> int:
            return next(nxt)

        plan = cls(spec)
        for site in spec.sites:
            n = spec.witness_servers if site == spec.witness else spec.servers_per_region
            for i in range(1, n + 1):
                name = f"{site}{i}"
                plan.servers[name] = ServerPlan(name, site, port(), port(), port(), port())
        for s in plan.servers.values():
            s.proxy_port = port() if spec.proxy_gateways else s.gateway_port
        if spec.cache:
            for r in spec.regions:
                plan.valkey_ports[r] = port()
        if spec.metrics_port:
            plan.metrics_ports = {r: spec.metrics_port + k for k, r in enumerate(spec.regions)}
        elif spec.metrics_port == 0:
            taken = {p for s in plan.servers.values() for p in (s.port, s.route_port, s.gateway_port,
                                                                s.monitor_port, s.proxy_port)}
            taken |= set(plan.valkey_ports.values())
            free = [p for p in pick_ports(len(spec.regions) + len(taken)) if p not in taken]
            plan.metrics_ports = dict(zip(spec.regions, free))
        return plan

    def site_servers(self, site: str) -> list[ServerPlan]:
        return [s for s in self.servers.values() if s.site == site]

    def urls(self, site: str) -> list[str]:
        return [s.url for s in self.site_servers(site)]

    def client_urls(self, first: str | None = None) -> list[str]:
        """Client server list spanning the regions, ``first``'s servers first (the witness is left out)."""
        order = [first] if first else []
        order += [r for r in self.spec.regions if r != first]
        return [u for r in order for u in self.urls(r)]

    def valkey_url(self, region: str) -> str | None:
        p = self.valkey_ports.get(region)
        return f"redis://127.0.0.1:{p}/0" if p else None

    def server_conf(self, name: str, store_dir: Path | str) -> str:
        """The nats-server config text of server ``name``."""
        s = self.servers[name]
        spec = self.spec
        routes = ", ".join(f'"nats-route://127.0.0.1:{o.route_port}"' for o in self.site_servers(s.site)
                           if o.name != name)
        gws = ",\n    ".join(
            '{name: "%s", urls: [%s]}' % (site, ", ".join(f'"nats://127.0.0.1:{o.proxy_port}"'
                                                          for o in self.site_servers(site)))
            for site in spec.sites if site != s.site)
        lines = [
            f'server_name: "{name}"',
            f"listen: 127.0.0.1:{s.port}",
            f"http: 127.0.0.1:{s.monitor_port}",
            "max_payload: 8MB",
            "max_pending: 256MB",
            f'ping_interval: "{spec.server_ping_interval}"',
            "ping_max: 3",
            "cluster {",
            f'  name: "{s.site}"',
            f"  listen: 127.0.0.1:{s.route_port}",
            f"  routes: [{routes}]",
        ]
        if s.site == spec.witness:
            # region managers reach the witness through per-region proxies (the lease connection);
            # advertised client URLs would let nats-py reconnect around them (and around a partition)
            lines.append("  no_advertise: true")
        lines += [
            "}",
            "gateway {",
            f'  name: "{s.site}"',
            f"  listen: 127.0.0.1:{s.gateway_port}",
            f'  advertise: "127.0.0.1:{s.proxy_port}"',
            "  reject_unknown_cluster: true",
            f"  gateways: [\n    {gws}\n  ]",
            "}",
        ]
        if s.site == spec.witness:
            lines += [
                "jetstream {",
                f'  store_dir: "{store_dir}"',
                f"  max_memory_store: {spec.js_max_memory}",
                f"  max_file_store: {spec.js_max_file}",
                "  sync_interval: always",
                "}",
            ]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict:
        """JSON-safe description (written to ``cluster.json`` in the run directory)."""
        return {
            "spec": asdict(self.spec),
            "servers": {n: asdict(s) | {"url": s.url} for n, s in self.servers.items()},
            "valkey": {r: self.valkey_url(r) for r in self.valkey_ports},
            "client_urls": self.client_urls(self.spec.regions[0]),
            # (only with HTTP ports: cluster config's file, and the deploy/ copy of it, stay as they were)
            **({"metrics_ports": dict(self.metrics_ports)} if self.metrics_ports else {}),
        }

    def valkey_conf(self, region: str, data_dir: Path | str) -> str:
        """A valkey.conf for ``region``: the first region is the master, the others replicate from it."""
        lines = [f"port {self.valkey_ports[region]}", "bind 127.0.0.1", 'save ""', "appendonly no",
                 f"dir {data_dir}", "protected-mode no", "maxmemory 64mb", "maxmemory-policy allkeys-lru"]
        first = self.spec.regions[0]
        if region != first:
            lines.append(f"replicaof 127.0.0.1 {self.valkey_ports[first]}")
        return "\n".join(lines) + "\n"

    def write_configs(self, out: Path, data_root: Path | str | None = None) -> list[Path]:
        """Render every server's config into ``out`` (``<name>.conf``, ``valkey-<region>.conf``) and ``cluster.json``.

        Args:
            out: folder for the files.
            data_root: where the servers keep data (JetStream store, Valkey dir); default ``out``.
        """
        out.mkdir(parents=True, exist_ok=True)
        root = Path(data_root) if data_root is not None else out
        paths = []
        for name in self.servers:
            p = out / f"{name}.conf"
            p.write_text(self.server_conf(name, root / "js" / name))
            paths.append(p)
        for region in self.valkey_ports:
            p = out / f"valkey-{region}.conf"
            p.write_text(self.valkey_conf(region, root / "valkey" / region))
            paths.append(p)
        (out / "cluster.json").write_text(json.dumps(self.to_dict(), indent=2))
        return paths
