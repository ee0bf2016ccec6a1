"""A node: the OS processes of one machine under one supervisor (DESIGN §7, upper level).

Children, in start order: the aggregator, one worker per device slot, then the
ingress replicas (so an ingress starts when workers already report). Strategy
``one_for_one``: a dead worker is restarted alone. When a child exits, the node
publishes a ``ProcessEvent(kind="down")`` on ``<p>._events`` *before* the
restart, so every ingress fails the requests that worker held with UNAVAILABLE
at once instead of letting them wait for their timeout.

Colocated mode (``NodeConfig.colocate``): each ONNX Runtime CPU slot runs as one
colocated process (an ingress and its worker, :mod:`inferbus.actors._colocated`)
instead of a worker process plus separate ingress processes; other backends'
workers stay separate processes. Such a child's exit is published as the
``down`` event of its worker (its ingress has no state others depend on).

Embedded nats-server and Valkey (started when no URL is given) are the children of a second
supervisor, started first and stopped last: ``one_for_one``, ``server_intensity`` restarts in
``server_period_s`` (default 5 in 10 s). A server that exits is logged with its exit status and
restarted on the same port with the same config and data folder; the actors' NATS connections
reconnect by themselves and their Redis clients per command. Past the intensity either supervisor
escalates: the node logs why, stops its children and :meth:`Node.wait_failed` returns the
``IntensityExceeded`` (``inferbus up`` then exits 1).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .._cpus import cores_text, usable_cores
from .._limits import (MAX_HTTP_CONNECTIONS, MAX_HTTP_PROCESSES, MAX_MAX_PAYLOAD_BYTES, MAX_NODE_PROCESSES,
                       MIN_MAX_PAYLOAD_BYTES, binary_size, interval)
from .._logs import LEVELS, WAITRESS_LOG_PERIOD_S, check_log_options, formatter, route_logger
from .._paths import write_private
from ..bus import (BusConfig, EmbeddedNats, EmbeddedValkey, Subjects, close_connection, connect, connected_server,
                   split_servers)
from ..bus._connect import closed_on_purpose
from ..bus._busypoll import check_busy_poll_us
from ..bus._embedded import EmbeddedServerError
from ..schemas._internal import InternalDecodeError, LoadReport, ProcessEvent, decode_internal, encode_internal
from ..supervisor import (ChildSpec, ChildStartError, IntensityExceeded, ProcessChild, Restart, Strategy, Supervisor,
                          SupervisorSpec)
from ._models import StateKeeper
from ._pinning import pin_repository
from ._repository import read_configs
from ._config import (RATE_FIELDS, AggregatorConfig, ColocatedConfig, HttpProcessConfig, IngressConfig, WorkerConfig,
                      check_rate_limits, check_trace)
from ._crashes import CrashKeeper, request_digest
from ._flight import read_flight_record
from ._region import RegionConfig

log = logging.getLogger("inferbus.node")

_FAULT_SIGNALS = frozenset({"SIGFPE", "SIGSEGV", "SIGBUS", "SIGILL", "SIGABRT"})


def _fault_exit(exit) -> bool:
    """Whether a child process was killed by a signal its own code raised (SIGFPE, SIGSEGV, SIGBUS, SIGILL,
    SIGABRT: a runtime dying on an input), not one sent from outside (SIGKILL, SIGTERM)."""
    return exit.signal in _FAULT_SIGNALS


def _attach_node_log(path: Path, level: str = "info", log_format: str = "text", actor: str = "node"):
    """Write the node's own log records (supervisors: starts, exits with their cause, restarts; ``level`` and up,
    INFO by default) to ``path`` with UTC timestamps (``log_format`` text), or as JSON Lines (``json``: ``actor``
    names the node), so a node run detached keeps its restart history in its run dir (a second
    fresh-user trial, 2026-12-02: a ``kill -9`` showed only as a second ``READY`` in the actor's own log). What
    reached stderr before (WARNING and up, or ``level`` if higher; the message alone, Python's last-resort
    handler's form, or JSON) still does, unless the application configured logging itself. The ``waitress`` logger's
    records (the HTTP server's) go to the same handlers (:func:`~inferbus._logs.route_logger`). Returns the function
    that detaches both handlers again."""
    lg = logging.getLogger("inferbus")
    lvl = LEVELS[level]
    fh = logging.FileHandler(path, encoding="utf-8")
    fh.setLevel(lvl)
    fmt = formatter(log_format, actor, "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s")
    fmt.converter = time.gmtime
    fmt.datefmt = "%Y-%m-%dT%H:%M:%S"
    fh.setFormatter(fmt)
    added = [fh]
    if not logging.getLogger().handlers and not lg.handlers:
        sh = logging.StreamHandler()
        sh.setLevel(max(lvl, logging.WARNING))
        sh.setFormatter(formatter(log_format, actor, "%(message)s"))
        added.append(sh)
    old_level = lg.level
    if lg.getEffectiveLevel() > lvl:
        lg.setLevel(lvl)
    for h in added:
        lg.addHandler(h)
    # the HTTP server's (waitress's) records are the node's too: these handlers and up's stderr, this format and
    # level, each repetitive one ("Task queue depth is N") once per WAITRESS_LOG_PERIOD_S; they were plain text on
    # stderr, never in node.log (a fresh-user trial)
    unroute = route_logger("waitress", lg, lvl, WAITRESS_LOG_PERIOD_S)

    def detach() -> None:
        unroute()
        for h in added:
            lg.removeHandler(h)
            h.close()
        lg.setLevel(old_level)

    return detach


@dataclass(frozen=True)
class NodeConfig:
    """What ``inferbus up`` runs on one machine."""

    models_dir: str
    workers: int = 0
    """CPU worker processes (0 = one per core, at least 1)."""
    ingress: int = 1
    """Ingress replicas (one queue group). Not used with ``colocate`` when there are CPU slots: each
    colocated process is an ingress replica."""
    colocate: bool = False
    """Run each ONNX Runtime CPU worker slot in one process with an ingress replica (same event loop and
    connection): the ingress hands requests its router sends to that worker in-process, without the
    forward publish and the completion notice (docs/architecture.md, "Colocated workers"). GPU/TPU/JAX
    workers stay separate processes and still get forwards over NATS."""
    nats_url: str | None = None
    """Use this NATS instead of an embedded nats-server (comma-separated URLs)."""
    spread_servers: bool = False
    """With several URLs in ``nats_url``: actor process ``k`` (worker ``k``, ingress ``k``, colocated process
    ``k``) connects to server ``k mod n`` first, and reconnects to the others in order
    (:meth:`BusConfig.rotated`). On servers joined by gateways (one server per cluster,
    :func:`inferbus.bus.gateway_mesh`) a client's request then stays on its server when a colocated process
    there serves it (docs/architecture.md, "Spreading over several nats-servers"). Off: every process gets
    the whole list, shuffled by nats-py."""
    nats_port: int = 0
    """Port of the embedded nats-server (0 = free port)."""
    redis_url: str | None = None
    """Use this Redis/Valkey for L2 instead of an embedded Valkey."""
    l2_lookup: bool = False
    """Ingress looks up L2 on an L1 miss (one Redis round trip per miss)."""
    no_cache: bool = False
    """Run without L2 (no Valkey at all)."""
    prefix: str = "inferbus"
    node_id: str = "n1"
    """Prefix of this node's process ids (``<node_id>-w0``, ``<node_id>-i0``, ``<node_id>-agg``): unique per
    NATS and subject prefix (checked at start on a NATS given by URL: :class:`NodeIdInUse`)."""
    region: str = ""
    run_dir: str | None = None
    models: tuple[str, ...] = ()
    backend: str = "onnxruntime"
    backends: tuple[str, ...] = ()
    """Backends to start workers for, one worker per device each serves (``onnxruntime``: ``workers`` CPU
    slots; ``jax``: each TPU chip, else each GPU, else one CPU worker; ``tensorrt``: each GPU). Empty = ``(backend,)``."""
    precision: str = "auto"
    """Requested precision of every worker: ``auto`` (fp16 on GPU/TPU, fp32 on CPU), fp32, fp16, bf16 or int8;
    each model falls back to fp32 where the requested one fails its check (docs/accelerators.md)."""
    pin_cpus: bool = False
    """Pin each process to one core (round robin over the cores not in ``nats_cpus``)."""
    nats_cpus: tuple[int, ...] = ()
    """The cores the embedded nats-server runs on (its CPU affinity, set before it starts, so that the Go runtime
    sizes ``GOMAXPROCS`` to them); () = every core. With ``pin_cpus`` the actors go round robin over the other
    cores, and ``workers`` = 0 means one per core left. On the 16-core H200 host, keeping nats-server's threads
    off the serving processes' cores cut its CPU per request by 37-53 % and raised the misses/s of 64 requests
    in flight by 22-27 % (docs/performance.md, twenty-sixth session). Only for the embedded server: with
    ``nats_url``, place that server where it runs (``taskset``)."""
    busy_poll_us: float = 0.0
    """Busy polling for every worker and ingress process (``WorkerConfig.busy_poll_us``): keep polling this
    many µs after each request instead of blocking. A full core per busy process; use with ``pin_cpus`` on
    dedicated cores. 0 = off. A ``busy_poll_us`` in ``worker_options``/``ingress_options`` wins."""
    intensity: int = 10
    period_s: float = 10.0
    """Restart intensity of the actors' supervisor: more than ``intensity`` restarts within ``period_s``
    seconds escalate (the node stops)."""
    server_intensity: int = 5
    server_period_s: float = 10.0
    """Restart intensity of each embedded server's supervisor: more than ``server_intensity`` restarts within
    ``server_period_s`` seconds escalate. The nats-server's escalation stops the node (nothing serves without its
    bus); Valkey's leaves the node serving without its shared result cache (L2) for ``cache_restart_backoff_s``,
    after which Valkey is started again on the same port (docs/supervision.md)."""
    cache_restart_backoff_s: float = 30.0
    """After the embedded Valkey escalated (restarted more than ``server_intensity`` times in ``server_period_s``),
    how long the node serves without it before starting it again (s); a failed start waits as long again."""
    health_timeout_s: float = 5.0
    mailbox_size: int = 1024
    max_batch_size: int | None = None
    audit: bool = False
    """Workers publish executed request ids on ``<p>._audit`` (drills count duplicate executions)."""
    region_manager: RegionConfig | None = None
    """Run this region's manager (lease, fencing term, Valkey role) as the first child; its bus is the node's."""
    actors: bool = True
    """Run aggregator, workers and ingress (False: only the region manager, for election tests)."""
    bus_extra: dict = field(default_factory=dict)
    bus_options: dict = field(default_factory=dict)
    """:class:`BusConfig` fields for every connection: credentials (``user``/``password``, ``token``,
    ``nkeys_seed``, ``user_credentials``) and TLS files. With an embedded nats-server, a ``token`` or
    ``user``/``password`` is also required by that server."""
    nats_max_payload_bytes: int = 8 * 1024 * 1024
    """``max_payload`` of the embedded nats-server (largest message, headers included): 64 KiB to 64 MiB
    (nats-server's own ceiling); below 64 KiB the actors' own messages (load reports, ``$SRV`` answers, model
    lists) would not fit and the node would never get ready. With it (no ``nats_url``), a
    ``max_request_bytes`` in ``ingress_options`` above it is refused (ValueError): the server would refuse such a
    request before the ingress saw it."""
    metrics_port: int | None = None
    """Serve Prometheus metrics over HTTP on this port (0 = a free one; None = off): one endpoint for the node,
    read from the actors' ``$SRV.STATS`` at scrape time, nothing counted per request, with every process's CPU and
    memory, and the OIP v2 health paths (``/v2/health/live``, ``/v2/health/ready``,
    ``/v2/models/<name>[/versions/<v>]/ready``: :mod:`inferbus.actors._probes`) (docs/observability.md), and the
    OIP v2 REST metadata and inference (``/v2``, ``/v2/models/<name>[/versions/<v>][/infer]``:
    :mod:`inferbus.actors._gateway`, docs/http.md), and Triton's statistics and model repository extensions
    (``/v2/models[/<name>[/versions/<v>]]/stats``, ``/v2/repository/...``: :mod:`inferbus.actors._httpext`).
    ``inferbus up --http-port`` is ``--metrics-port``."""
    metrics_host: str = "0.0.0.0"
    """Address the metrics endpoint listens on (``0.0.0.0``: every interface, as Triton's; ``127.0.0.1``: this
    host only)."""
    http_infer: bool = False
    """Answer ``POST /v2/models/<name>[/versions/<v>]/infer`` on the ``metrics_port`` (off: 403 naming
    ``--http-infer``). Off by default: the HTTP port has no authentication, so whoever reaches it could run the
    models without the NATS credentials a bus client needs; health, metadata and metrics are served either way."""
    http_model_control: bool = False
    """Answer ``POST /v2/repository/models/<name>/load`` and ``.../unload`` on the ``metrics_port`` (Triton's model
    repository extension, as its ``--model-control-mode=explicit``; off: 403 naming ``--http-model-control``). Off by
    default: the HTTP port has no authentication, and these change what every node on the NATS serves. The index
    (``POST /v2/repository/index``) and the statistics are served either way (docs/http.md)."""
    http_idle_timeout_s: float = 30.0
    """How long the HTTP server on ``metrics_port`` keeps a connection without a byte in or out and no request being
    served (a kept-alive one between requests, or a request's line, headers or body not coming) before it closes it,
    seconds, in (0, 3600]; one that sent part of a body is answered 408 first. The wait for an inference's answer does
    not count (:mod:`inferbus.actors._http`)."""
    http_max_connections: int = 100
    """Open connections at most on ``metrics_port``, and so threads running their requests, in
    [1, :data:`~inferbus._limits.MAX_HTTP_CONNECTIONS`] (1,000): past it the server stops accepting and the next
    connections wait in the kernel's listen backlog until one closes (docs/http.md)."""
    http_processes: int = 0
    """Serve ``metrics_port`` from this many processes of their own (:mod:`inferbus.actors._httpproc`, docs/http.md,
    "HTTP processes"), in [0, :data:`~inferbus._limits.MAX_HTTP_PROCESSES`]: each listens on the port with
    ``SO_REUSEPORT``, runs the inferences over HTTP itself on its own NATS connection, and forwards every other request
    to the node's own server (then on ``127.0.0.1`` at a free port). 0 (default): the node process serves the port
    itself, inference included (about 2k inferences/s at most). ``http_max_connections`` is per process."""
    trace_otlp_endpoint: str | None = None
    """OpenTelemetry tracing: every ingress and worker exports spans of sampled requests to this OTLP/HTTP traces URL
    (:attr:`IngressConfig.trace_otlp_endpoint`; needs the ``otel`` extra); None (default): off."""
    trace_ratio: float = 1.0
    """With ``trace_otlp_endpoint``: the head-sampling probability of a request without a ``traceparent``, in [0, 1]
    (:attr:`IngressConfig.trace_ratio`)."""
    worker_options: dict = field(default_factory=dict)
    """Further :class:`WorkerConfig` fields for every worker (e.g. ``health_window_s``, ``fault_control``)."""
    ingress_options: dict = field(default_factory=dict)
    """Further :class:`IngressConfig` fields for every ingress. The rate limits (``rate_limit_per_s``,
    ``rate_burst``, ``client_rate_limit_per_s``, ``client_rate_burst``) are for the node: each of the
    ``ingress`` replicas enforces an even share (a share of a burst is at least 1 request). They are not
    cluster-wide: N nodes on one NATS admit N times these limits. Validated here (ValueError)."""
    log_level: str = "info"
    """Least severity of the log records the node (``node.log``) and every actor process (``<actor>.log``) write:
    debug, info, warning or error (:data:`inferbus._limits.LOG_LEVELS`). The stderr of ``inferbus up`` shows
    warning and above (or this, if higher)."""
    log_format: str = "text"
    """``text`` or ``json`` (one JSON object per line: ``ts``, ``level``, ``logger``, ``actor``, ``msg``, ``exc``;
    :mod:`inferbus._logs`), for ``node.log``, the actors' logs and the stderr lines of the node's records."""

    def __post_init__(self) -> None:
        try:
            check_log_options(self.log_level, self.log_format)
        except ValueError as exc:
            raise ValueError(f"NodeConfig.{exc}") from None
        if not 0 <= self.workers <= MAX_NODE_PROCESSES:
            raise ValueError(f"NodeConfig.workers must be in {interval(0, MAX_NODE_PROCESSES)} (0 = one per core), "
                             f"got {self.workers}")
        if not 1 <= self.ingress <= MAX_NODE_PROCESSES:
            raise ValueError(f"NodeConfig.ingress must be in {interval(1, MAX_NODE_PROCESSES)}, got {self.ingress}")
        check_busy_poll_us(self.busy_poll_us, "NodeConfig.busy_poll_us")
        from ..accelerators import BACKENDS, PRECISIONS

        if any(b not in BACKENDS for b in self.backends or (self.backend,)):
            raise ValueError(f"NodeConfig.backends must each be one of {', '.join(BACKENDS)}, got "
                             f"{','.join(map(str, self.backends or (self.backend,)))!r}")
        if self.precision != "auto" and self.precision not in PRECISIONS:
            raise ValueError(f"NodeConfig.precision must be auto or one of {', '.join(PRECISIONS)}, got "
                             f"{self.precision!r}")
        check_rate_limits("NodeConfig.ingress_options", self.ingress_options)
        if not self.cache_restart_backoff_s >= 0:
            raise ValueError(f"NodeConfig.cache_restart_backoff_s must be >= 0 seconds, got "
                             f"{self.cache_restart_backoff_s}")
        if self.server_intensity < 0 or not self.server_period_s > 0:
            raise ValueError(f"NodeConfig: server_intensity must be >= 0 and server_period_s > 0 seconds, got "
                             f"{self.server_intensity}, {self.server_period_s}")
        if not MIN_MAX_PAYLOAD_BYTES <= self.nats_max_payload_bytes <= MAX_MAX_PAYLOAD_BYTES:
            raise ValueError(f"NodeConfig.nats_max_payload_bytes must be in "
                             f"{interval(MIN_MAX_PAYLOAD_BYTES, MAX_MAX_PAYLOAD_BYTES)} bytes "
                             f"({binary_size(MIN_MAX_PAYLOAD_BYTES)} to {binary_size(MAX_MAX_PAYLOAD_BYTES)}, "
                             f"nats-server's ceiling), got {self.nats_max_payload_bytes}")
        if self.nats_cpus:
            usable = usable_cores()
            if any(isinstance(c, bool) or not isinstance(c, int) or c not in usable for c in self.nats_cpus):
                raise ValueError(f"NodeConfig.nats_cpus must be cores this process may run on ({cores_text(usable)}), "
                                 f"got {', '.join(map(str, self.nats_cpus))}")
            if self.nats_url is not None:
                raise ValueError("NodeConfig.nats_cpus places the embedded nats-server, and nats_url replaces it; "
                                 "place that server where it runs (taskset -c), or leave nats_url out")
            if self.pin_cpus and set(usable) <= set(self.nats_cpus):
                raise ValueError(f"NodeConfig.nats_cpus leaves no core for the pinned actors (pin_cpus): it is "
                                 f"{cores_text(self.nats_cpus)} of the cores this process may run on, "
                                 f"{cores_text(usable)}")
        if not 0 <= self.nats_port <= 65535:
            raise ValueError(f"NodeConfig.nats_port must be in [0, 65535] (0 = any free port), got {self.nats_port}")
        if not (isinstance(self.http_idle_timeout_s, (int, float)) and not isinstance(self.http_idle_timeout_s, bool)
                and 0 < self.http_idle_timeout_s <= 3600):
            raise ValueError(f"NodeConfig.http_idle_timeout_s must be in {interval(0, 3600, lo_open=True)} s, got "
                             f"{self.http_idle_timeout_s!r}")
        if isinstance(self.http_max_connections, bool) or not isinstance(self.http_max_connections, int) or \
                not 1 <= self.http_max_connections <= MAX_HTTP_CONNECTIONS:
            raise ValueError(f"NodeConfig.http_max_connections must be in {interval(1, MAX_HTTP_CONNECTIONS)}, got "
                             f"{self.http_max_connections!r}")
        if isinstance(self.http_processes, bool) or not isinstance(self.http_processes, int) or \
                not 0 <= self.http_processes <= MAX_HTTP_PROCESSES:
            raise ValueError(f"NodeConfig.http_processes must be in {interval(0, MAX_HTTP_PROCESSES)} (0 = the node "
                             f"process serves the HTTP port), got {self.http_processes!r}")
        if self.http_processes and self.metrics_port is None:
            raise ValueError("NodeConfig.http_processes needs metrics_port (the HTTP port they serve)")
        if self.metrics_port is not None and (isinstance(self.metrics_port, bool) or not isinstance(self.metrics_port, int)
                                              or not 0 <= self.metrics_port <= 65535):
            raise ValueError(f"NodeConfig.metrics_port must be None (off) or in [0, 65535] (0 = any free port), got "
                             f"{self.metrics_port!r}")
        # with the embedded nats-server, a larger request limit than its max_payload is one that can never apply
        # (the server refuses the message first): a mistake in one of the two values, refused rather than kept
        # silently; checked before the ingress's own check (>= 0), so that a refusal names both ends. Another
        # NATS's max_payload (nats_url) is not known until connected.
        request_bytes = self.ingress_options.get("max_request_bytes", 0)
        if self.nats_url is None and isinstance(request_bytes, int) and \
                not 0 <= request_bytes <= self.nats_max_payload_bytes:
            raise ValueError(f"NodeConfig.ingress_options.max_request_bytes must be in "
                             f"{interval(0, self.nats_max_payload_bytes)} bytes (at most nats_max_payload_bytes, the "
                             f"embedded nats-server's largest message; 0 = that size), got {request_bytes}")
        from ..bus import BusConfig

        # the actors' own checks of the options passed through, now: a bad value fails here, before any
        # server or process starts, instead of in the middle of the start
        check_trace(self.trace_otlp_endpoint, self.trace_ratio, "NodeConfig")
        IngressConfig(ingress_id="check", bus=BusConfig(prefix=self.prefix), models_dir=self.models_dir,
                      health_timeout_s=self.health_timeout_s, **{"busy_poll_us": self.busy_poll_us,
                                                                  **self.ingress_options})
        WorkerConfig(worker_id="check", bus=BusConfig(prefix=self.prefix), models_dir=self.models_dir,
                     mailbox_size=self.mailbox_size, **{"busy_poll_us": self.busy_poll_us, **self.worker_options})


class Node:
    """Starts, supervises and stops one machine's inferbus processes.

    Use ``async with Node(cfg) as node:``; ``node.nats_url`` is where clients connect.
    """

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.nats: EmbeddedNats | None = None
        self.valkey: EmbeddedValkey | None = None
        self.supervisor: Supervisor | None = None
        """The actors' supervisor."""
        self.servers: Supervisor | None = None
        """The embedded nats-server's supervisor (child ``nats``); None when NATS is external."""
        self.cache_servers: Supervisor | None = None
        """The embedded Valkey's supervisor (child ``valkey``); None with an external Redis or no cache. Apart from
        the nats-server's: a cache that keeps crashing must not take the bus down with it (it did, one restart
        budget for both: a fresh-user trial's Valkey crash loop stopped the node's nats-server and every answer)."""
        self.nc = None
        self.model_states: StateKeeper | None = None
        """The node's copy of the model-management writes (:class:`StateKeeper`), so that they outlive its actors."""
        self.crashes: CrashKeeper | None = None
        """The node's copy of the query-of-death memory (:class:`~inferbus.actors._crashes.CrashKeeper`), likewise."""
        self._run_task: asyncio.Task | None = None
        self._servers_task: asyncio.Task | None = None
        self._cache_task: asyncio.Task | None = None
        self._server_started: set[str] = set()
        self._failed: asyncio.Future | None = None
        self._stopping = False
        self._t_start = time.monotonic()
        self._bus_lost_at: float | None = None
        """``time.monotonic()`` when the node's NATS connection was lost (None while connected)."""
        self._bus_server = ""
        """``host:port`` of the NATS server the node's connection is on (nats-py forgets it when it drops)."""
        self._bus: BusConfig | None = None
        """How the node connects to NATS (set by :meth:`start`): a connection closed for good is made anew with it."""
        self._renewable = False
        """Whether a connection that nats-py closed for good is made anew (:meth:`_renew_bus`): from the end of
        :meth:`start` until :meth:`stop`; before, the start fails instead."""
        self._renew_task: asyncio.Task | None = None
        self._renewed_at = 0.0
        """``time.monotonic()`` of the last new connection :meth:`_renew_bus` made (0: none)."""
        self._quiesced = False
        """The worker processes were sent the quiesce notice of this stop (:meth:`_maybe_quiesce`)."""
        self._pids: dict[str, int] = {}
        self._flight_paths: dict[str, str] = {}
        """Child id → the flight record file of a worker process (:mod:`inferbus.actors._flight`)."""
        self._actor_ids: dict[str, list[str]] = {}
        """Child id → the ids its actors have on the bus (``ingress:0`` → ``["n1-i0"]``, ``colocated:n1-w0`` →
        ``["n1-i0", "n1-w0"]``, ``aggregator`` → ``["n1-agg"]``): what health, metrics and the logs name them by
        (:meth:`tree`)."""
        self._crash_running: dict[str, list | None] = {}
        """Child id → what its model runs held at its last abnormal exit (read in :meth:`_on_exit`)."""
        self._tmp = None
        self._run_dir_lock: int | None = None
        """The descriptor holding the run dir's lock (:func:`_lock_run_dir`) while the node runs, else None."""
        self._detach_log = None
        """Removes the handlers writing ``node.log`` (:func:`_attach_node_log`); None before start and after stop."""
        self.nats_url = config.nats_url
        self.redis_url = config.redis_url
        self.worker_ids: list[str] = []
        self.n_ingress = config.ingress
        """Ingress replicas started (with ``colocate``: one per CPU worker slot)."""
        self.metrics = None
        """The Prometheus endpoint (:class:`~inferbus.actors._metrics.MetricsServer`) once started with
        ``metrics_port``; ``metrics.port`` is where it listens."""
        self.http_port: int | None = None
        """The port of the node's HTTP API and metrics (``metrics_port``, or the one chosen for 0) once started;
        with ``http_processes`` the HTTP processes listen there, and :attr:`metrics` on ``127.0.0.1`` at another."""
        self._http_reservation = None
        """With ``http_processes``: a socket bound to :attr:`http_port` with ``SO_REUSEPORT``, not listening (no
        connection comes to it), held while the node runs: the port stays this node's while an HTTP process
        restarts."""
        self.http_calls = None
        """The HTTP server's calls on this node's loop under way (:class:`~inferbus.actors._probes.LoopCalls`),
        while it serves; :meth:`stop` ends those its drain did not see answered."""
        self._killed = False
        """:meth:`kill` was called: the stop does not wait for HTTP requests (their ingresses are gone)."""

    @property
    def serving_cores(self) -> tuple[int, ...]:
        """The cores the actors are pinned to with ``pin_cpus`` (round robin): every core this process may run on
        (:func:`~inferbus._cpus.usable_cores`) but ``nats_cpus``."""
        usable = usable_cores()
        return tuple(c for c in usable if c not in self.config.nats_cpus) or usable

    @property
    def n_workers(self) -> int:
        """``workers``, or with 0 one per core this process may run on that ``nats_cpus`` leaves (at least 1)."""
        return self.config.workers or max(len([c for c in usable_cores() if c not in self.config.nats_cpus]), 1)

    async def _plan_workers(self) -> list:
        """Worker placements: ``n_workers`` ONNX Runtime CPU slots, or a device probe for other backends.

        Raises:
            BackendUnavailable: a requested backend is missing or has no device here.
        """
        from ..accelerators import DevicePlan, discover_devices, plan_workers

        backends = self.config.backends or (self.config.backend,)
        if tuple(backends) == ("onnxruntime",):
            return [DevicePlan("onnxruntime", "cpu", i) for i in range(self.n_workers)]
        self.discovery = await asyncio.to_thread(discover_devices)
        return plan_workers(tuple(backends), self.discovery, self.n_workers)

    def _child(self, child_id: str, kind: str, cfg_json: str, log_dir: Path, actor: str, env: dict | None = None,
               exempt=None, cpu_affinity: tuple[int, ...] = (), shutdown_timeout_s: float = 5.0) -> ChildSpec:
        """The child spec of one actor process. ``actor``: its name in its log records (the JSON format's
        ``actor``), as its NATS connection is named (``worker-n1-w0``). ``cpu_affinity``: the cores it runs on from
        its exec on (set in the child before exec, so the interpreter's and the libraries' threads are born there;
        every restart gets it too); empty = any core. The actor pins itself to its config's ``cpu_affinity`` as
        well, which matters only when it is started without a node."""
        # the config travels in a file only we can read, not on the command line: it may hold credentials
        stem = child_id.replace(":", "-")  # worker:n1-w0 -> worker-n1-w0 (no ':' in file names: scp, Windows shares)
        cfg_path = log_dir / f"{stem}.config.json"
        write_private(cfg_path, cfg_json)
        c = self.config
        argv = [sys.executable, "-m", "inferbus.actors", kind, f"@{cfg_path}", "--log-level", c.log_level,
                "--log-format", c.log_format, "--log-actor", actor]
        as_json = c.log_format == "json"  # JSON Lines: the actor's records as they are, its other lines wrapped
        # its READY line (the start handshake, an info line: one per incarnation) is written only where the log
        # level takes info; at warning and error the log holds no line below it (docs/observability.md, Logs)
        log_ready = LEVELS[c.log_level] <= logging.INFO
        full_env = {**os.environ, **env} if env else None  # device isolation (CUDA_VISIBLE_DEVICES, TPU_*)

        async def start():
            return await ProcessChild.start(argv, env=full_env, ready_line="READY", start_timeout_s=120.0,
                                            log_path=log_dir / f"{stem}.log", log_timestamps=not as_json,
                                            log_json_actor=actor if as_json else None, log_ready=log_ready,
                                            name=child_id,
                                            cpu_affinity=cpu_affinity or None)

        return ChildSpec(id=child_id, start=start, restart=Restart.PERMANENT, shutdown_timeout_s=shutdown_timeout_s,
                         exempt=exempt)

    def _input_crash(self, child_id: str, exit) -> bool:
        """A worker's exit that its input caused, not the worker (:attr:`ChildSpec.exempt`: not counted against the
        node's restart intensity): killed by a fault signal (:func:`_fault_exit`) while its flight record says a
        model run held requests. Each such request is refused after one or two such deaths (docs/failure-semantics.md,
        a request that kills its worker), so the crashes end with the requests; counted, a handful of different
        such requests made the node stop (10 restarts in 10 s; a fresh-user trial)."""
        return _fault_exit(exit) and bool(self._crash_running.get(child_id))

    def _on_start(self, child_id: str, child) -> None:
        if child.pid:
            self._pids[child_id] = child.pid

    def _on_exit(self, child_id: str, exit) -> None:
        self._maybe_quiesce()
        if self.nc is None or self.nc.is_closed:
            return
        kind, _, rest = child_id.partition(":")
        # a colocated process's exit is its worker's death too: every ingress fails what it forwarded there
        worker_id = rest if kind in ("worker", "colocated") else None
        flight = self._flight_paths.get(child_id)
        # the requests its model runs held when it died (read before the restart truncates the file; 512 KiB)
        entries = self._crash_running[child_id] = (read_flight_record(flight) if flight and not exit.normal
                                                   else None)
        running = running_local = None
        if entries is not None:
            running = [e for e in entries if len(e) == 2]
            if kind == "colocated":  # what its own ingress handed over in-process, by digest (not the bodies)
                running_local = [(e[0], e[1], request_digest(e[2])) for e in entries if len(e) == 3]
        ev = ProcessEvent(kind="down", child_id=child_id, worker_id=worker_id, pid=self._pids.get(child_id),
                          reason=exit.reason, running=running, fault=_fault_exit(exit), running_local=running_local)
        changed = None
        if running_local and self.crashes is not None:  # their ingress died too: the node remembers them
            changed = self.crashes.on_crash(running_local, len(running or ()), ev.fault, exit.reason)
        asyncio.ensure_future(self._publish_event(ev, changed))

    def _maybe_quiesce(self) -> None:
        """During :meth:`stop`, once no ingress (or colocated) process of this node runs any more, send every
        running worker process the *quiesce* notice (SIGUSR1) at once: each drains its infer subscription, says
        ``draining`` in its load reports (routers, other nodes' too, stop sending it requests) and answers what
        it holds within its ``drain_timeout_s``, refusing the rest UNAVAILABLE. The supervisor still stops the
        workers one at a time in reverse start order (OTP); each SIGTERM then joins the drain already under way,
        so N workers take about one drain, not N, and none takes requests while it waits for its turn. Sent
        after the ingresses so the requests they drain are still forwarded to this node's workers."""
        if not self._stopping or self._quiesced or self.supervisor is None:
            return
        import signal

        children = self.supervisor.which_children()
        if any(i.status == "running" and i.id.partition(":")[0] in ("ingress", "colocated") for i in children):
            return
        self._quiesced = True
        if not hasattr(signal, "SIGUSR1"):
            return
        sent = 0
        for i in children:
            if i.id.startswith("worker:") and i.status == "running" and i.pid:
                try:
                    os.kill(i.pid, signal.SIGUSR1)  # the worker ignores it until it serves (never fatal)
                    sent += 1
                except OSError:
                    pass
        if sent:
            log.info("node %s: quiesce: %d worker(s) stop taking requests and drain together", self.config.node_id,
                     sent)

    async def _publish_event(self, ev: ProcessEvent, crash_keys: list | None = None) -> None:
        try:
            await self.nc.publish(Subjects(self.config.prefix).events, encode_internal(ev))
            if crash_keys:
                await self.crashes.share(crash_keys)
            await self.nc.flush(timeout=1)
        except Exception:
            pass

    def _server_spec(self, child_id: str, server: EmbeddedNats | EmbeddedValkey) -> ChildSpec:
        return ChildSpec(id=child_id, start=server.start_child, restart=Restart.PERMANENT, shutdown_timeout_s=5.0)

    def server_children(self) -> list:
        """``ChildInfo`` of the embedded servers (``nats``, ``valkey``; those this node runs)."""
        return [i for sup in (self.servers, self.cache_servers) if sup is not None for i in sup.which_children()]

    def _on_server_start(self, child_id: str, child) -> None:
        server = self.nats if child_id == "nats" else self.valkey
        if child_id in self._server_started:
            log.warning("node %s: embedded %s restarted on port %d (pid %s)", self.config.node_id, child_id,
                        server.port, child.pid)
        self._server_started.add(child_id)

    def _on_server_exit(self, child_id: str, exit) -> None:
        if self._stopping or any(i.id == child_id and i.status != "restarting" for i in self.server_children()):
            return  # stopped by us or by the supervisor (which logs that), not a crash
        server = self.nats if child_id == "nats" else self.valkey
        log.error("node %s: embedded %s on port %d exited: %s; restarting it (%d restarts in %g s at most)",
                  self.config.node_id, child_id, server.port, exit.reason, self.config.server_intensity,
                  self.config.server_period_s)

    async def _supervise(self, sup: Supervisor, what: str) -> None:
        """Run ``sup``; on escalation log it, stop the actors if the servers escalated, resolve :meth:`wait_failed`."""
        try:
            await sup.run()
        except IntensityExceeded as exc:
            log.error("node %s: %s restarted too often, the node stops: %s", self.config.node_id, what, exc)
            if sup is self.servers and self.supervisor is not None:
                # they cannot serve without their bus, nor drain through it: stopped one by one, each waited out its
                # drain with no bus (3 s per actor: 9-12 s in a fresh-user trial, against ~1 s for a SIGTERM)
                log.error("node %s: the actors are killed: their bus is gone, nothing can drain", self.config.node_id)
                await self.supervisor.kill()
            if not self._failed.done():
                self._failed.set_result(exc)

    async def _supervise_cache(self, sup: Supervisor) -> None:
        """Run the embedded Valkey's supervisor. On its escalation the node serves on without the cache (the actors'
        Redis clients fail fast: hits and fills are lost and counted, answers are not) and starts it again after
        ``cache_restart_backoff_s``, on the same port, as long as the node runs."""
        c = self.config
        while True:
            try:
                await sup.run()
                return  # stopped
            except IntensityExceeded as exc:
                log.error("node %s: the embedded valkey restarted too often (%s); the node serves on without the "
                          "shared result cache and starts valkey again in %g s", c.node_id, exc,
                          c.cache_restart_backoff_s)
            while True:
                await asyncio.sleep(c.cache_restart_backoff_s)
                if self._stopping:
                    return
                try:
                    await sup.start()
                except ChildStartError as exc:
                    log.error("node %s: the embedded valkey did not start again (%s); next try in %g s", c.node_id,
                              exc, c.cache_restart_backoff_s)
                    continue
                log.warning("node %s: embedded valkey started again on port %d", c.node_id, self.valkey.port)
                break

    async def wait_failed(self) -> IntensityExceeded:
        """Block until a supervisor of this node escalated; return its ``IntensityExceeded``.

        Escalation: an embedded server (or an actor process) was restarted more than its intensity allows
        (``server_intensity`` in ``server_period_s``; ``intensity`` in ``period_s``). By the time this
        returns, the escalating supervisor has stopped its children and, for the servers, the actors were
        stopped too; call :meth:`stop` to release the rest. Never returns on a healthy node (cancel it).
        Call after :meth:`start`.
        """
        return await asyncio.shield(self._failed)

    async def start(self) -> None:
        """Start embedded servers (if needed) and every actor process; return when all printed READY.

        Raises:
            EmbeddedServerError: an embedded server did not start.
            ChildStartError: an actor process failed to start.
            NodeIdInUse: on a NATS given by URL, workers of this ``node_id`` already report on this prefix.
            MetricsPortUnavailable: ``metrics_host:metrics_port`` cannot be bound; everything started is stopped.
            RunDirInUse: another live node runs in ``run_dir`` (nothing was started or written there).
            BackendUnavailable: a backend of ``backends`` has no runtime or no device here (the device probe);
                the embedded servers are stopped again.
        """
        try:
            await self._start()
        except BaseException:  # (the paths that stopped what had started released it already: a no-op then)
            self._release_run_dir()
            raise

    async def _start(self) -> None:
        c = self.config
        self._failed = asyncio.get_running_loop().create_future()
        self._stopping = False
        self._killed = False
        self._quiesced = False
        if c.run_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="inferbus-run-")
            run_dir = Path(self._tmp.name)
        else:
            run_dir = Path(c.run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
        # before anything is written there: a second node on this folder overwrote the first one's actor configs
        # (which a restarted actor reads again: it then connected to the other node's NATS, in a crash loop), its
        # workers' flight records and its logs
        self._run_dir_lock = _lock_run_dir(run_dir)
        self.run_dir = run_dir
        self._detach_log = _attach_node_log(run_dir / "node.log", c.log_level, c.log_format, f"node-{c.node_id}")
        servers = []  # the nats-server's supervisor; Valkey's is another (cache_servers)
        if self.nats_url is None:
            self.nats = EmbeddedNats(port=c.nats_port, run_dir=run_dir / "nats", server_name=f"inferbus-{c.node_id}",
                                     max_payload_bytes=c.nats_max_payload_bytes,
                                     extra_config=_auth_config(c.bus_options), cpus=c.nats_cpus or None)
            servers.append(self._server_spec("nats", self.nats))
        if servers:
            # started on the loop's thread (ProcessChild): PDEATHSIG follows the spawning thread, not the process
            self.servers = Supervisor(SupervisorSpec(strategy=Strategy.ONE_FOR_ONE, intensity=c.server_intensity,
                                                     period_s=c.server_period_s),
                                      servers, name=f"node-{c.node_id}-servers", on_child_exit=self._on_server_exit,
                                      on_child_start=self._on_server_start)
            try:
                await self.servers.start()
            except ChildStartError as exc:
                if isinstance(exc.__cause__, EmbeddedServerError):
                    raise exc.__cause__ from None
                raise
            self.nats_url = self.nats_url or self.nats.url
        if self.redis_url is None and not c.no_cache:
            # a password of its own, in 0600 files only (valkey.conf, the actors' configs): any local user could
            # read and write a cache without one, and an entry written there is served as a hit (--l2-lookup)
            self.valkey = EmbeddedValkey(run_dir=run_dir / "valkey", password=secrets.token_urlsafe(24))
            self.cache_servers = Supervisor(
                SupervisorSpec(strategy=Strategy.ONE_FOR_ONE, intensity=c.server_intensity,
                               period_s=c.server_period_s),
                [self._server_spec("valkey", self.valkey)], name=f"node-{c.node_id}-cache",
                on_child_exit=self._on_server_exit, on_child_start=self._on_server_start)
            try:
                await self.cache_servers.start()
            except ChildStartError as exc:
                await _stop_tree(self.servers, None)
                if isinstance(exc.__cause__, EmbeddedServerError):
                    raise exc.__cause__ from None
                raise
            self.redis_url = self.valkey.url
            self._cache_task = asyncio.create_task(self._supervise_cache(self.cache_servers))
        if self.servers is not None:
            self._servers_task = asyncio.create_task(self._supervise(self.servers, "the embedded servers"))
        redis_url = None if c.no_cache else self.redis_url
        bus = BusConfig(servers=split_servers(self.nats_url), prefix=c.prefix, extra=dict(c.bus_extra),
                        **c.bus_options)
        self._bus = bus
        try:
            self.nc = await self._connect_bus()
            self._bus_server = connected_server(self.nc)
            if self.nats is None:  # joined a NATS others may use: are this node's process ids taken?
                await self._check_node_id_free(bus)
            if c.actors:  # the model writes outlive the actors: every one of them dying at once undoes none
                self.model_states = StateKeeper(Subjects(c.prefix), f"node {c.node_id}")
                # so does the query-of-death memory: an ingress that starts after every peer died learns it here
                self.crashes = CrashKeeper(Subjects(c.prefix), f"node {c.node_id}")
            await self._subscribe_bus(self.nc)
        except BaseException:
            if self.nc is not None:
                await close_connection(self.nc)
            await self._stop_servers()
            raise
        cores = self.serving_cores
        children = []
        if c.region_manager is not None:  # first: workers and ingress learn the fencing term from it
            rc = replace(c.region_manager, bus=replace(bus, no_randomize=True, ping_interval_s=0.5))
            children.append(self._child("region", "region", rc.to_json(), run_dir, f"region-{rc.region}"))
        if c.actors:
            agg = AggregatorConfig(f"{c.node_id}-agg", bus, redis_url, cpu_affinity=cores if c.pin_cpus else ())
            self._actor_ids["aggregator"] = [agg.aggregator_id]
            children.append(self._child("aggregator", "aggregator", agg.to_json(), run_dir,
                                        f"aggregator-{agg.aggregator_id}", cpu_affinity=agg.cpu_affinity))
        self.worker_ids = []
        try:
            plan = await self._plan_workers() if c.actors else []
        except BaseException:  # BackendUnavailable (no runtime or device here): nothing of this node stays up
            await close_connection(self.nc)
            await self._stop_servers()
            raise
        # version pinning: the digest of each version's files now, before any actor loads it; a worker restarted later
        # serves a version only from files with that digest (docs/models.md, "Pinned versions"). Reads every version
        # once, off the loop (about 1 s per GB, docs/models.md)
        # and the configs as they are now: an actor restarted later serves them, not an edit made since (that is
        # applied by `inferbus models load`, which carries it in the serving state to every actor)
        configs = await asyncio.to_thread(read_configs, Path(c.models_dir), c.models) if c.actors else {}
        pins = await asyncio.to_thread(pin_repository, Path(c.models_dir), c.models, configs) if c.actors else {}
        n_colocated = sum(1 for p in plan if p.backend == "onnxruntime" and p.device_kind == "cpu") if c.colocate else 0
        n_ingress = self.n_ingress = n_colocated or c.ingress
        colocated = []
        for i, p in enumerate(plan):  # one worker per device
            cpu_ort = p.backend == "onnxruntime" and p.device_kind == "cpu"
            wid = f"{c.node_id}-w{p.device_index}" if cpu_ort else f"{c.node_id}-{p.backend}-{p.device_kind}{p.device_index}"
            self.worker_ids.append(wid)
            wc = WorkerConfig(worker_id=wid, bus=bus.rotated(i) if c.spread_servers else bus, models_dir=c.models_dir,
                              models=c.models, pins=pins, configs=configs, backend=p.backend,
                              device_kind=p.device_kind, device_index=p.device_index, precision=c.precision,
                              region=c.region, mailbox_size=c.mailbox_size,
                              max_batch_size=c.max_batch_size, audit=c.audit,
                              stall_fence_s=0.3 * c.health_timeout_s,  # < the ingresses' suspicion age
                              cpu_affinity=(cores[i % len(cores)],) if c.pin_cpus else (),
                              trace_otlp_endpoint=c.trace_otlp_endpoint, trace_ratio=c.trace_ratio,
                              **{"busy_poll_us": c.busy_poll_us, **c.worker_options})
            if cpu_ort and c.colocate:
                colocated.append(wc)  # started after the separate workers, in the ingress's place
            else:
                # what its model runs hold, read here after a crash (its file next to its log)
                wc = replace(wc, flight_record_path=str(run_dir / f"worker-{wid}.running"))
                self._flight_paths[f"worker:{wid}"] = wc.flight_record_path
                self._actor_ids[f"worker:{wid}"] = [wid]
                children.append(self._child(f"worker:{wid}", "worker", wc.to_json(), run_dir, f"worker-{wid}",
                                            env=p.env,
                                            cpu_affinity=wc.cpu_affinity,
                                            exempt=functools.partial(self._input_crash, f"worker:{wid}")))
        for j in range(n_ingress if c.actors else 0):
            ic = IngressConfig(ingress_id=f"{c.node_id}-i{j}", bus=bus.rotated(j) if c.spread_servers else bus,
                               models_dir=c.models_dir, models=c.models, pins=pins, configs=configs,
                               redis_url=redis_url, l2_lookup=c.l2_lookup, region=c.region, health_timeout_s=c.health_timeout_s,
                               cpu_affinity=(cores[(self.n_workers + j) % len(cores)],) if c.pin_cpus else (),
                               trace_otlp_endpoint=c.trace_otlp_endpoint, trace_ratio=c.trace_ratio,
                               **{"busy_poll_us": c.busy_poll_us, **_per_replica(c.ingress_options, n_ingress)})
            if colocated:  # one core slot each: the worker's core
                wc = colocated[j]
                cid = f"colocated:{wc.worker_id}"
                # its worker's flight record, as a separate worker's: the in-process requests too (their ingress
                # dies with the process; the node passes them on to the other ingresses)
                wc = replace(wc, bus=ic.bus, flight_record_path=str(run_dir / f"worker-{wc.worker_id}.running"))
                self._flight_paths[cid] = wc.flight_record_path
                self._actor_ids[cid] = [ic.ingress_id, wc.worker_id]
                cc = ColocatedConfig(replace(ic, cpu_affinity=wc.cpu_affinity), wc)
                children.append(self._child(cid, "colocated", cc.to_json(), run_dir, f"colocated-{ic.ingress_id}",
                                            cpu_affinity=wc.cpu_affinity,
                                            exempt=functools.partial(self._input_crash, cid)))
            else:
                self._actor_ids[f"ingress:{j}"] = [ic.ingress_id]
                children.append(self._child(f"ingress:{j}", "ingress", ic.to_json(), run_dir,
                                            f"ingress-{ic.ingress_id}", cpu_affinity=ic.cpu_affinity))
        if c.metrics_port is not None and c.http_processes:
            from ._httpproc import POOL_IDLE

            # the port first (reserved: bound with SO_REUSEPORT, not listening, so no connection comes to this
            # process), then the node's own server on the loopback, where the HTTP processes forward what they do
            # not serve themselves; both before the actors, whose configs name them
            try:
                self._http_reservation = _reserve_port(c.metrics_host, c.metrics_port)
                self.http_port = self._http_reservation.getsockname()[1]
                # (its connections: the processes' forwarded requests, plus those each keeps idle between them: with
                # the bound alone, 64 processes' idle ones held all 100 and forwarded requests waited ~30 s)
                self._start_http_server("127.0.0.1", 0, c.http_max_connections + POOL_IDLE * c.http_processes)
            except OSError as exc:
                await self.stop()
                raise MetricsPortUnavailable(f"cannot serve metrics on {c.metrics_host}:{c.metrics_port}: "
                                             f"{exc.strerror or exc}") from exc
            for k in range(c.http_processes):
                hc = HttpProcessConfig(http_id=f"{c.node_id}-h{k}", bus=bus, node_id=c.node_id, host=c.metrics_host,
                                       port=self.http_port, upstream_port=self.metrics.port,
                                       models_dir=str(c.models_dir), ingress_options=dict(c.ingress_options),
                                       http_infer=c.http_infer, http_model_control=c.http_model_control,
                                       idle_timeout_s=c.http_idle_timeout_s, max_connections=c.http_max_connections,
                                       drain_timeout_s=self.http_drain_s)
                self._actor_ids[f"http:{k}"] = [hc.http_id]
                # last: stopped first (after the stop's drain, Node.stop), while the ingresses and workers still serve
                children.append(self._child(f"http:{k}", "http", hc.to_json(), run_dir, f"http-{hc.http_id}",
                                            shutdown_timeout_s=self.http_drain_s + 3.0))
        self.supervisor = Supervisor(SupervisorSpec(strategy=Strategy.ONE_FOR_ONE, intensity=c.intensity,
                                                    period_s=c.period_s),
                                     children, name=f"node-{c.node_id}", on_child_exit=self._on_exit,
                                     on_child_start=self._on_start)
        try:
            await self.supervisor.start()
        except BaseException:
            if self.metrics is not None:
                await asyncio.to_thread(self.metrics.stop)
                self.metrics = None
            await self._stop_servers()
            raise
        self._run_task = asyncio.create_task(self._supervise(self.supervisor, "the actor processes"))
        if c.metrics_port is not None and not c.http_processes:
            try:
                self._start_http_server(c.metrics_host, c.metrics_port)
            except OSError as exc:
                await self.stop()
                raise MetricsPortUnavailable(f"cannot serve metrics on {c.metrics_host}:{c.metrics_port}: "
                                             f"{exc.strerror or exc}") from exc
            self.http_port = self.metrics.port
        self._renewable = not self._stopping
        if self._renewable and self.nc is not None and self.nc.is_closed and not closed_on_purpose(self.nc):
            self._start_renewal()  # closed for good while the start went on (its closed_cb made no new one)

    def _start_http_server(self, host: str, port: int, max_connections: int | None = None) -> None:
        """Serve the node's WSGI app (metrics, the OIP v2 REST API) on ``host:port`` (:attr:`metrics`), with
        ``max_connections`` (default ``http_max_connections``) connections at most.

        Raises:
            OSError: the address cannot be listened on.
        """
        from ._gateway import NodeGateway
        from ._metrics import MetricsServer, NodeCollector
        from ._probes import LoopCalls, NodeProbes

        c = self.config
        loop = asyncio.get_running_loop()
        self.http_calls = LoopCalls()
        self.metrics = MetricsServer.start(NodeCollector(self, loop), host, port, probes=NodeProbes(self, loop),
                                           gateway=NodeGateway(self, loop), socket_timeout_s=c.http_idle_timeout_s,
                                           max_connections=max_connections or c.http_max_connections)

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Wait until an ingress reports every model ready (workers' reports seen).

        Raises:
            ModelsUnservable: every worker of this node has reported (its ``_load`` report, sent once its
                models are loaded) and a model version is loaded by none of them, each having failed to load it
                (e.g. an operator the JAX interpreter lacks): waiting longer cannot make the node ready.
            TimeoutError: not ready within ``timeout_s`` for another reason (the logs in the run dir say why).
        """
        from ..client import Client

        reports: dict[str, LoadReport] = {}
        mine = set(self.worker_ids)

        async def on_load(msg) -> None:
            try:
                r = decode_internal(msg.data)
            except InternalDecodeError:
                return
            if isinstance(r, LoadReport) and r.worker_id in mine:
                reports[r.worker_id] = r

        sub = await self.nc.subscribe(f"{self.config.prefix}._load", cb=on_load)
        client = Client(self.nc, self.config.prefix, retry_unavailable=False)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                try:
                    h = await client.health(timeout_s=0.5)
                    if h.ready:
                        return
                except Exception:
                    pass
                if mine and len(reports) == len(mine):
                    unservable = _unservable(reports.values())
                    if unservable:
                        raise ModelsUnservable(unservable)
                await asyncio.sleep(0.05)
        finally:
            await sub.unsubscribe()
        raise TimeoutError(f"inferbus not ready after {timeout_s}s (logs in {self.run_dir})")

    async def _check_node_id_free(self, bus: BusConfig, listen_s: float = 0.35) -> None:
        """Refuse to start when a worker of this node id already reports on this prefix (another node).

        Process ids are ``<node_id>-w0``, ``<node_id>-i0``...: two nodes with one id on one NATS and prefix
        would share worker subjects and overwrite each other's routing state. Workers report every 100 ms,
        so ``listen_s`` (0.35 s) hears any live one.

        Raises:
            NodeIdInUse: a live worker's id starts with ``<node_id>-``.
        """
        taken: set[str] = set()
        mine = f"{self.config.node_id}-"

        async def on_load(msg) -> None:
            try:
                r = decode_internal(msg.data)
            except InternalDecodeError:
                return
            if isinstance(r, LoadReport) and r.worker_id.startswith(mine):
                taken.add(r.worker_id)

        sub = await self.nc.subscribe(Subjects(bus.prefix).load, cb=on_load)
        try:
            await asyncio.sleep(listen_s)
        finally:
            await sub.unsubscribe()
        if taken:
            from ..bus import shown_servers

            raise NodeIdInUse(f"node id {self.config.node_id!r} is in use on {shown_servers(self.nats_url)} with prefix "
                              f"{bus.prefix!r} (live workers {', '.join(sorted(taken))}): give this node another "
                              f"--node-id, or another --prefix for a separate deployment")

    @property
    def stopping(self) -> bool:
        """True from the start of :meth:`stop` (or :meth:`kill`) on."""
        return self._stopping

    def running_ingress_ids(self) -> list[str]:
        """The ids of this node's ingresses whose process is running now (``ingress:<j>`` and ``colocated:<w>``
        children of status ``running``; ``[]`` before :meth:`start`), as health, metrics and logs name them."""
        if self.supervisor is None:
            return []
        ids = []
        for info in self.supervisor.which_children():
            kind = info.id.partition(":")[0]
            if info.status == "running" and kind in ("ingress", "colocated"):
                ids.extend(a for a in self._actor_ids.get(info.id, ()) if a not in self.worker_ids)
        return ids

    def process_ids(self) -> dict[str, int]:
        """``{child id: pid}`` of every process of this node now running: the actor processes (``worker:n1-w0``,
        ``ingress:0``, ``colocated:n1-w0``, ``aggregator``, ``region``), the embedded servers (``nats``,
        ``valkey``) and the node process itself (``node``); a child that is restarting or stopped is left out."""
        infos = self.server_children() + (self.supervisor.which_children() if self.supervisor is not None else [])
        pids = {i.id: i.pid for i in infos if i.status == "running" and i.pid}
        pids["node"] = os.getpid()
        return pids

    def pid_of(self, child_id: str) -> int | None:
        for info in self.supervisor.which_children():
            if info.id == child_id:
                return info.pid
        return None

    async def _connect_bus(self):
        """A connection to NATS with this node's callbacks (:meth:`_on_bus_lost`, :meth:`_on_bus_back`,
        :meth:`_on_bus_closed`), each told which connection it is about: one replaced by a new one says nothing."""
        made: list = []

        async def lost() -> None:
            await self._on_bus_lost(made[0] if made else None)

        async def back() -> None:
            await self._on_bus_back(made[0] if made else None)

        async def closed() -> None:
            await self._on_bus_closed(made[0] if made else None)

        nc = await connect(self._bus, name=f"node-{self.config.node_id}", disconnected_cb=lost, reconnected_cb=back,
                           closed_cb=closed)
        made.append(nc)
        return nc

    async def _on_bus_lost(self, nc) -> None:
        """A WARNING (``up``'s stderr and node.log) when the node's own NATS connection drops, unless the node is
        stopping: its actors lose theirs at the same time and serve nothing until it is back. A node joined to
        another node's embedded NATS (``--nats-url``) said nothing while that node was stopped or restarted, only
        its actors' own logs did (a fresh-user trial: 2-4 s outages, 118-301 requests failed, node.log silent).
        A connection that nats-py closes for good (nats-py calls this, then ``closed_cb``) is said by
        :meth:`_on_bus_closed` instead: nats-py does not retry that one."""
        if (self._stopping or self._bus_lost_at is not None or nc is None or nc is not self.nc
                or closed_on_purpose(nc) or nc.is_closed):
            # (never connected: nats-py calls this on a first connect that fails too; or a close of ours, e.g. a
            # start that failed: nats-py calls it on close() as well; or one replaced by a new connection)
            return
        self._bus_lost_at = time.monotonic()
        log.warning("node %s: lost its NATS connection (%s); its actors serve nothing until they reconnect (nats-py "
                    "retries by itself)", self.config.node_id, self._bus_server or "its server")

    async def _on_bus_back(self, nc) -> None:
        """The WARNING's pair: how long the node's NATS connection was down."""
        if nc is None or nc is not self.nc:
            return
        lost_at, self._bus_lost_at = self._bus_lost_at, None
        self._bus_server = connected_server(nc) or self._bus_server
        if lost_at is not None and not self._stopping:
            log.warning("node %s: reconnected to NATS (%s) after %.1f s", self.config.node_id, self._bus_server,
                        time.monotonic() - lost_at)

    @property
    def http_drain_s(self) -> float:
        """How long a graceful stop waits for the HTTP requests received before it, seconds: the workers' own drain
        (``drain_timeout_s``, 3 s by default; ``NodeConfig.worker_options``), 0 once :meth:`kill` was called."""
        from ._config import WorkerConfig

        if self._killed:
            return 0.0
        return float(self.config.worker_options.get("drain_timeout_s", WorkerConfig.drain_timeout_s))

    async def _on_bus_closed(self, nc) -> None:
        """The node's connection was closed by nats-py itself, for good: the server answered ``-ERR`` (e.g.
        ``maximum control line exceeded``, ``maximum payload exceeded``) and closed it, and nats-py does not reconnect
        after that. Nothing of the node's own work on the bus (the HTTP gateway and probes, ``/metrics``'
        ``inferbus_actor_up``, ``inferbus nodes``, the model states it keeps) would work again, and the WARNING said
        "nats-py retries by itself" (a fresh-user trial: one HTTP request naming a model of 4,100 characters; every
        ``/v2`` path answered 503 afterwards). Says so, and makes a new connection (:meth:`_renew_bus`); one closed
        while the node starts, once the start is done (:meth:`start`). The actors keep their own connections."""
        if self._stopping or nc is None or nc is not self.nc or closed_on_purpose(nc):
            return
        self._bus_lost_at = self._bus_lost_at or time.monotonic()
        err = getattr(nc, "last_error", None)
        log.warning("node %s: its NATS connection (%s) was closed%s, and nats-py does not reconnect after that; %s",
                    self.config.node_id, self._bus_server or "its server",
                    f" ({' '.join(str(err).split())})" if err else "",
                    "connecting anew (the HTTP gateway, probes and metrics answer 503 meanwhile)" if self._renewable
                    else "the node is still starting: it connects anew once the start is done")
        if self._renewable:
            self._start_renewal()

    async def _subscribe_bus(self, nc) -> None:
        """What the node serves on its connection ``nc`` (at the start, and on a new one, :meth:`_renew_bus`): the
        model states and the query-of-death memory it keeps (with actors), and ``<p>.nodes``."""
        if self.model_states is not None:
            await self.model_states.start(nc)
        if self.crashes is not None:
            await self.crashes.start(nc)
        await nc.subscribe(Subjects(self.config.prefix).nodes, cb=self._on_nodes)

    def _start_renewal(self) -> None:
        if self._renew_task is None or self._renew_task.done():
            self._renew_task = asyncio.ensure_future(self._renew_bus())

    async def _renew_bus(self) -> None:
        """Replace the node's connection that nats-py closed for good with a new one: connect, subscribe what the
        node serves (the model states, the query-of-death memory, ``<p>.nodes``), then make it :attr:`nc` (the
        gateway, probes and metrics take :attr:`nc` at each request). Tries until it succeeds or the node stops:
        0.1 s after a failure, doubling up to 5 s; and at most one new connection a second (a connection closed
        again and again does not spin). Cancellation (:meth:`stop`): what it made is closed."""
        lost_at = self._bus_lost_at or time.monotonic()
        wait_s = max(0.0, self._renewed_at + 1.0 - time.monotonic())
        backoff_s = 0.1
        while True:
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            if self._stopping:
                return
            nc = None
            try:
                nc = await self._connect_bus()
                await self._subscribe_bus(nc)
            except asyncio.CancelledError:
                if nc is not None:
                    await close_connection(nc)
                raise
            except Exception as exc:
                if nc is not None:
                    await close_connection(nc)
                log.warning("node %s: a new NATS connection failed (%s: %s); next try in %.1f s", self.config.node_id,
                            type(exc).__name__, " ".join(str(exc).split()), backoff_s)
                wait_s, backoff_s = backoff_s, min(backoff_s * 2, 5.0)
                continue
            if self._stopping:
                await close_connection(nc)
                return
            self.nc = nc
            self._renewed_at = time.monotonic()
            self._bus_lost_at = None
            self._bus_server = connected_server(nc) or self._bus_server
            log.warning("node %s: connected to NATS again (%s) with a new connection, %.1f s after it was closed",
                        self.config.node_id, self._bus_server, time.monotonic() - lost_at)
            return

    async def stop(self) -> None:
        """Stop gracefully: the HTTP port's drain, the actors (reverse start order), the HTTP server, the node's
        NATS connection, then the embedded servers (Valkey, then NATS). Idempotent; a :meth:`kill` meanwhile cuts
        the waits short.

        The HTTP port first (docs/http.md, "A graceful stop"): its listener is closed (new connections refused), a
        request received after this moment is answered 503 UNAVAILABLE with ``Connection: close``, a keep-alive
        connection idle after an answer is closed, and the stop waits for the requests received before it to be
        answered, :attr:`http_drain_s` at most, with the actors serving as usual: only then do they stop (the
        ingresses drain, then the workers). Requests still unanswered after the actors stopped are answered 503 (their
        calls on this loop cancelled) and written out (1 s at most) before the HTTP server closes every connection,
        then the NATS connection closes. Until 2026-12-07 the HTTP server was closed first, at once: every request in
        flight had its connection closed unanswered (a fresh-user trial: 6 of 6 ``RemoteDisconnected``)."""
        self._stopping = True
        self._renewable = False
        if self._renew_task is not None:  # a new connection under way: ended (it closes what it made)
            self._renew_task.cancel()
            await asyncio.gather(self._renew_task, return_exceptions=True)
            self._renew_task = None
        await self._drain_http_processes()
        http = self.metrics
        if http is not None:  # (on a thread: its requests' calls wait on this loop)
            t0, bound_s = time.monotonic(), self.http_drain_s
            drained = await asyncio.to_thread(http.drain, bound_s,
                                              f"node {self.config.node_id} is stopping: it answers the requests it "
                                              f"had received and takes no new ones; send this one to another node")
            if drained:
                log.info("node %s: HTTP: new connections refused; the requests received before the stop answered in "
                         "%.2f s", self.config.node_id, time.monotonic() - t0)
            elif not self._killed:
                log.warning("node %s: HTTP: requests received before the stop are still unanswered after %.1f s (the "
                            "drain's bound): the actors stop now; what they do not answer is answered 503",
                            self.config.node_id, bound_s)
        self._maybe_quiesce()  # at once when no ingress runs here; else when the last one has exited
        await _stop_tree(self.supervisor, self._run_task)
        self._run_task = None
        if http is not None:
            if self.http_calls is not None:
                self.http_calls.close()  # what is still waiting on this loop: 503
            await asyncio.to_thread(http.stop)  # joins its thread, which may wait on this loop (a scrape)
            if self.metrics is http:
                self.metrics = None
        if self.nc is not None:
            await close_connection(self.nc)
        await self._stop_servers()

    async def _drain_http_processes(self) -> None:
        """The HTTP processes' part of a graceful stop (``http_processes``): each is told to begin its drain at once
        (``SIGUSR1``: new connections refused, later requests 503; :class:`~inferbus.actors._httpproc.HttpProcess`),
        all together, then each is stopped (``SIGTERM``, OTP ``terminate_child``: it finishes its drain, within
        :attr:`http_drain_s` of the first signal, and exits), so the stop waits for the slowest drain, not their
        sum, with the actors serving meanwhile."""
        sup = self.supervisor
        if sup is None or not self.config.http_processes or self._killed or sup.state != "running":
            return  # (a second stop, up's own at its end: the supervisor's stop stopped them)
        import signal

        t0 = time.monotonic()
        ids = [info.id for info in sup.which_children() if info.id.startswith("http:")]
        for info in sup.which_children():
            if info.id in ids and info.status == "running" and info.pid:  # (past READY: its handler is set)
                try:
                    os.kill(info.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        for child_id in ids:
            try:
                await sup.terminate_child(child_id)
            except Exception as exc:  # (a supervisor stopped by escalation meanwhile: its stop stops them)
                log.warning("node %s: HTTP process %s: %r", self.config.node_id, child_id, exc)
        log.info("node %s: HTTP: %d HTTP process(es) drained and stopped in %.2f s", self.config.node_id, len(ids),
                 time.monotonic() - t0)

    def tree(self) -> dict:
        """This node's supervision tree, as ``<p>.nodes`` answers it (JSON-ready): ``node_id``, ``pid`` (the node's
        own process), ``uptime_s``, ``stopping``, and ``supervisors``: for each of the node's supervisors (the
        embedded nats-server's, the embedded Valkey's, the actors'), ``name``, ``state``, ``strategy``,
        ``intensity`` and ``period_s`` (s), ``restarts`` (counted against the intensity over its life) and
        ``children`` (start order: ``id``, ``pid`` or None, ``status`` not_started / running / restarting / stopped,
        ``restarts``, ``actors``: the ids its actors have on the bus, as health, metrics and logs name them (``ingress:0``
        → ``["n1-i0"]``, ``aggregator`` → ``["n1-agg"]``; ``[]`` for the servers and the region manager), ``restart`` type, ``last_exit``: why its last incarnation exited, on one line, "" if it never did; a failed
        start's holds its last output), as OTP's
        ``supervisor:which_children/1`` and ``count_children/1`` give them."""
        sups = []
        for sup in (self.servers, self.cache_servers, self.supervisor):
            if sup is None:
                continue
            sups.append({"name": sup.name, "state": sup.state, "strategy": sup.spec.strategy.value,
                         "intensity": sup.spec.intensity, "period_s": sup.spec.period_s,
                         "restarts": sup.count_restarts(),
                         "children": [{"id": ch.id, "actors": self._actor_ids.get(ch.id, []), "pid": ch.pid,
                                       "status": ch.status, "restarts": ch.restarts,
                                       "restart": ch.restart.value, "last_exit": " ".join(ch.last_exit.split())}
                                      for ch in sup.which_children()]})
        return {"node_id": self.config.node_id, "pid": os.getpid(),
                "uptime_s": round(time.monotonic() - self._t_start, 3), "stopping": self._stopping,
                "supervisors": sups}

    async def _on_nodes(self, msg) -> None:
        """``<p>.nodes``: answer :meth:`tree` as JSON."""
        if not msg.reply:
            return
        import json

        try:
            await self.nc.publish(msg.reply, json.dumps(self.tree()).encode(),
                                  headers={"Content-Type": "application/json"})
        except Exception as exc:  # a closed connection during the stop: nothing to answer
            log.debug("node %s: answering %s: %r", self.config.node_id, msg.subject, exc)

    async def kill(self) -> None:
        """Stop at once, without draining: every actor process and embedded server gets SIGKILL
        (:meth:`Supervisor.kill`), then what :meth:`stop` does after them. Requests in flight are lost (their
        clients time out or retry elsewhere). Joins a :meth:`stop` in progress and cuts it short (``inferbus
        up``'s second Ctrl-C)."""
        self._stopping = True
        self._killed = True
        if self.metrics is not None:
            self.metrics.cut()  # (a stop's wait for its HTTP requests ends now)
        for sup in (self.supervisor, self.cache_servers, self.servers):
            if sup is not None:
                await sup.kill()
        await self.stop()

    async def _stop_servers(self) -> None:
        self._stopping = True
        reservation, self._http_reservation = self._http_reservation, None
        if reservation is not None:
            reservation.close()
        await _stop_tree(self.cache_servers, self._cache_task)  # Valkey, then NATS
        self._cache_task = None
        await _stop_tree(self.servers, self._servers_task)
        self._servers_task = None
        detach, self._detach_log = self._detach_log, None
        if detach is not None:
            detach()
        self._release_run_dir()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _release_run_dir(self) -> None:
        """Give up the run dir's lock (:func:`_lock_run_dir`), if this node holds it. Idempotent."""
        fd, self._run_dir_lock = self._run_dir_lock, None
        if fd is not None:
            os.close(fd)  # (the lock goes with the last descriptor; the file stays, empty of meaning)

    async def __aenter__(self) -> "Node":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()


class NodeIdInUse(RuntimeError):
    """Another node with the same ``node_id`` serves on the same NATS and prefix (see :meth:`Node.start`)."""


class ModelsUnservable(RuntimeError):
    """At start, model versions that no worker of the node could load (see :meth:`Node.wait_ready`).

    Attributes:
        reasons: per ``name:version``, per worker id, why that worker did not load it (its load error).
    """

    def __init__(self, reasons: dict[str, dict[str, str]]) -> None:
        self.reasons = reasons
        super().__init__("; ".join(f"{k}: loaded by no worker" for k in sorted(reasons)))


def _unservable(reports) -> dict[str, dict[str, str]]:
    """Per ``name:version`` that some worker failed to load and none loaded: ``{worker_id: load error}``."""
    reports = list(reports)
    loaded = {k for r in reports for k in r.models}
    out: dict[str, dict[str, str]] = {}
    for r in reports:
        for k, why in r.load_errors.items():
            if k not in loaded:
                out.setdefault(k, {})[r.worker_id] = why
    return out


class RunDirInUse(RuntimeError):
    """Another live node holds the run dir (``NodeConfig.run_dir``, ``up --run-dir``): see :func:`_lock_run_dir`."""


RUN_DIR_LOCK = "node.lock"
"""The file in a node's run dir that it holds locked (``flock``) while it runs, with its pid in it."""


def _lock_run_dir(run_dir: Path, owner: str = "node") -> int:
    """Lock ``run_dir`` for this node (an exclusive ``flock`` on :data:`RUN_DIR_LOCK`, which holds this process's
    pid); return the descriptor that holds it. The kernel drops the lock when the process ends, however it ends (a
    SIGKILLed node leaves no stale lock), and the actor processes do not inherit it (PEP 446). ``cluster up`` locks
    its run dir the same way (``owner="cluster"``, :meth:`inferbus.cluster.Topology.start`), so a node and a
    cluster also keep out of each other's folder.

    Raises:
        RunDirInUse: another process holds it (a node or a cluster serving from that folder).
    """
    import fcntl

    path = run_dir / RUN_DIR_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: held
        try:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        except OSError:
            holder = ""
        os.close(fd)
        who = f"pid {holder}" if holder.isdigit() else f"it holds {RUN_DIR_LOCK}"
        if owner == "node":
            raise RunDirInUse(f"run dir {str(run_dir)!r} is in use by another node ({who}): its actors' configs, "
                              f"flight records and logs are there; give this node a --run-dir of its own") from None
        raise RunDirInUse(f"run dir {str(run_dir)!r} is in use by another cluster or node ({who}): its configs, "
                          f"cluster.json and logs are there; give this {owner} a --run-dir of its own") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class MetricsPortUnavailable(OSError):
    """The metrics endpoint's address (``NodeConfig.metrics_host``/``metrics_port``) cannot be bound (see
    :meth:`Node.start`)."""


def _auth_config(bus_options: dict) -> str:
    """nats-server ``authorization`` block for an embedded server from a token or user/password (else "")."""
    import json

    token, user = bus_options.get("token"), bus_options.get("user")
    if token:
        return f"authorization {{ token: {json.dumps(token)} }}"
    if user:
        return f"authorization {{ user: {json.dumps(user)}, password: {json.dumps(bus_options.get('password') or '')} }}"
    return ""


def _per_replica(ingress_options: dict, replicas: int) -> dict:
    """Ingress options with the node's rate limits (global and per client) split evenly across ``replicas``.

    Rates and bursts are divided by ``replicas`` (the queue group spreads requests evenly), so the node as a
    whole admits its configured limits; a divided burst is kept at >= 1 request (a bucket must hold one),
    so with a burst below ``replicas`` the node admits a burst of up to ``replicas`` at once.
    """
    out = dict(ingress_options)
    for rate_name, burst_name in RATE_FIELDS:
        rate, burst = out.get(rate_name) or 0.0, out.get(burst_name) or 0.0
        if rate:
            out[rate_name] = rate / replicas
            # burst 0 means "one second of the rate": make it explicit before splitting, then clamp
            out[burst_name] = max((burst or max(rate, 1.0)) / replicas, 1.0)
    return out


def _reserve_port(host: str, port: int):
    """A TCP socket bound to ``host:port`` (port 0: a free one) with ``SO_REUSEADDR`` and ``SO_REUSEPORT``, not
    listening: the node's HTTP processes listen on that port beside it (each with ``SO_REUSEPORT``), and no
    connection comes to it (Linux gives a connection to a listening socket of the group only). ``host`` is
    resolved as :meth:`HttpServer.start <inferbus.actors._http.HttpServer.start>` resolves it (its first address).

    Raises:
        OSError: the address cannot be bound: any program holds the port (one that set ``SO_REUSEPORT`` too: another
            node's HTTP processes would otherwise share it with this node's, each answering some of the other's
            connections), or there is no such address.
    """
    import socket

    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    if port:  # free for a socket without SO_REUSEPORT, so no other group listens there
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            probe.bind(address)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # (as waitress binds it)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


async def _stop_tree(supervisor, run_task) -> None:
    """Stop ``supervisor`` (its children in reverse start order), then cancel and reap the task running it."""
    if supervisor is not None:
        await supervisor.stop()
    if run_task is not None:
        run_task.cancel()
        try:
            await run_task
        except BaseException:
            pass
