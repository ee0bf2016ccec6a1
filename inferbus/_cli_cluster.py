"""``inferbus cluster``: a local multi-region topology (DESIGN §8) and faults for it.

``up`` runs it in the foreground (every process supervised, logs under the run
directory, ``cluster.json`` describing every port); ``config`` only renders the
nats-server configs; ``kill``/``restore``/``partition``/``isolate``/``heal`` act
on a running ``up`` through ``<p>._cluster.ctl`` (served via the witness).
"""

from __future__ import annotations

import json
import signal
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from ._limits import MAX_HTTP_CONNECTIONS, MAX_HTTP_PROCESSES, MAX_NODE_PROCESSES, MAX_TIMEOUT_MS, interval

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Local multi-region topology: regions of 3 nats-servers + Valkey + actors, a witness site.",
                  short_help="Run a local multi-region topology and inject faults.")


def _regions(command: str, n: int) -> tuple[str, ...]:
    """The names of ``--regions`` regions (A, B, ...); out of [2, 8] one line, ``error: cluster COMMAND: --regions
    must be in [2, 8], got N``, exit 2 (it went through Click's ``Invalid value: ...``, without the value)."""
    if not 2 <= n <= 8:
        from ._limits import interval
        from .cli import _usage

        _usage(f"cluster {command}: --regions must be in {interval(2, 8)}, got {n}")
    return tuple(string.ascii_uppercase[:n])


def _spec(command: str, regions: int, workers: int, base_port: int, prefix: str, models: Optional[Path],
          proxy: bool, actors: bool, witness_servers: int, metrics_port: Optional[int] = None, ingress: int = 1,
          audit: bool = False, metrics_host: str = "0.0.0.0", http_infer: bool = False,
          http_model_control: bool = False, http_idle_timeout_s: float = 30.0, http_max_connections: int = 100,
          http_processes: int = 0):
    """The topology's :class:`~inferbus.cluster.ClusterSpec` from the options of ``cluster COMMAND``.

    Raises:
        typer.Exit: (2) one line ``error: cluster COMMAND: ...`` for a value the spec or the bus refuses (a
            traceback before; ``--witness-servers`` and ``--workers`` named as options, not as the spec's fields), or
            a ``--base-port`` whose consecutive ports would pass 65535 (it wrote such ports into the configs).
    """
    from ._limits import MAX_NODE_PROCESSES, interval
    from .cli import _check_prefix, _usage
    from .cluster import ClusterSpec, Plan

    _check_prefix(prefix)
    # the options ClusterSpec checks too, named as given here (its message names its fields: witness_servers...)
    if witness_servers not in (3, 5):
        _usage(f"cluster {command}: --witness-servers must be 3 or 5 (the lease bucket's quorum; 1 cannot form a "
               f"JetStream cluster), got {witness_servers}")
    if not 1 <= workers <= MAX_NODE_PROCESSES:  # (a larger count was a traceback: each region's node refused it)
        _usage(f"cluster {command}: --workers must be in {interval(1, MAX_NODE_PROCESSES)}, got {workers}")
    if not 1 <= ingress <= 64:
        _usage(f"cluster {command}: --ingress must be in {interval(1, 64)}, got {ingress}")
    try:
        spec = ClusterSpec(regions=_regions(command, regions), workers=workers, ingress=ingress, base_port=base_port,
                           prefix=prefix,
                           models_dir=str(models.resolve()) if models else None, proxy_gateways=proxy, actors=actors,
                           witness_servers=witness_servers, metrics_port=metrics_port, audit=audit,
                           metrics_host=metrics_host, http_infer=http_infer,
                           http_model_control=http_model_control, http_idle_timeout_s=http_idle_timeout_s,
                           http_max_connections=http_max_connections, http_processes=http_processes)
        if base_port:
            Plan.make(spec)  # its ports fit below 65536 (with 0 the plan picks free ones later)
    except ValueError as exc:  # (ClusterSpec.base_port is Plan.make's: the option's name)
        _usage(f"cluster {command}: {str(exc).replace('ClusterSpec.base_port', '--base-port')}")
    return spec


_BASE_PORT_HELP = ("First of the topology's consecutive ports, in [1, 65536 - the ports it takes] (47 for the default "
                   "2 regions and 3 witness servers)")
"""The rule of ``--base-port`` (of ``cluster up`` and ``cluster config``): its top depends on the topology's size
(:meth:`inferbus.cluster.Plan.make`), so the help names it in words; the refusal names the interval of the topology
asked for."""


@app.command(short_help="Start the topology and serve until Ctrl-C or SIGTERM.")
def up(
    ctx: typer.Context,
    regions: int = typer.Option(2, help=f"Number of regions (A, B, ...), in {interval(2, 8)}; A starts as primary."),
    workers: int = typer.Option(1, help=f"Worker processes per region, in {interval(1, MAX_NODE_PROCESSES)}."),
    ingress: int = typer.Option(1, help=f"Ingress processes per region, in {interval(1, 64)} (2 keep a region "
                                "answering while one is frozen: docs/regions.md)."),
    base_port: int = typer.Option(0, help=_BASE_PORT_HELP + " (0 = free ports below the ephemeral range)."),
    run_dir: Optional[str] = typer.Option(None, help="Logs, configs, JetStream data, cluster.json (default: a temp dir; its logs are kept).", metavar="<path>"),
    models: Optional[str] = typer.Option(None, help="Model repository (default ./models).", metavar="<path>"),
    prefix: str = typer.Option("inferbus", help="Subject prefix of the cluster's actors (recorded in cluster.json, "
                               "which 'region ... --cluster' and 'cluster kill|...' talk on)."),
    proxy: bool = typer.Option(True, help="Route gateways through fault-injection proxies (partitions)."),
    actors: bool = typer.Option(True, help="Run the serving actors (off: servers and region managers only)."),
    witness_servers: int = typer.Option(3, help="Servers of the witness site: 3 or 5 (3 hold the lease's 3 replicas)."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", "--http-port",
                                               help="Serve each region's node's HTTP port, as up's: its Prometheus "
                                               "metrics (its actors and its region manager's inferbus_region_*) and "
                                               "the OIP v2 REST API (health, metadata; inference with --http-infer): "
                                               "region A on this port, B on the next, ... (address --metrics-host; "
                                               "default: none), in [1, 65536 - --regions]: all the regions' ports "
                                               "below 65536; 0 = a free port for each region, printed (docs/http.md)."),
    metrics_host: str = typer.Option("0.0.0.0", "--metrics-host", "--http-host",
                                     help="Address of each region's HTTP port (0.0.0.0: every interface, as up's; "
                                     "127.0.0.1: this host only); needs --metrics-port."),
    http_infer: bool = typer.Option(False, "--http-infer/--no-http-infer",
                                    help="Answer POST /v2/models/<name>/infer on each region's HTTP port, as up's "
                                    "--http-infer (needs --metrics-port; off: 403). The port has no authentication: "
                                    "whoever reaches it runs the models without NATS credentials (docs/http.md)."),
    http_model_control: bool = typer.Option(False, "--http-model-control/--no-http-model-control",
                                            help="Serve model load and unload on each region's HTTP port: "
                                            "POST .../models/<name>/load and .../unload under /v2/repository/, as "
                                            "up's --http-model-control (needs --metrics-port; off: 403; a standby "
                                            "region's answer 503 naming the "
                                            "primary). The port has no authentication (docs/http.md)."),
    http_idle_timeout_s: float = typer.Option(30.0, help="Seconds each region's HTTP port keeps a connection "
                                              "without a byte in or out before it closes it, as up's, in "
                                              f"{interval(0, 3600, lo_open=True)}; needs --metrics-port."),
    http_max_connections: int = typer.Option(100, help="Open connections at most on each region's HTTP port, and "
                                             "threads running their requests, as up's, in "
                                             f"{interval(1, MAX_HTTP_CONNECTIONS)}; needs --metrics-port."),
    http_processes: int = typer.Option(0, help="Serve each region's HTTP port from this many processes of their "
                                       f"own, as up's --http-processes, in {interval(0, MAX_HTTP_PROCESSES)}: each "
                                       "listens on it (SO_REUSEPORT) and runs the inferences over HTTP on its own "
                                       "NATS connection, the rest forwarded to the region's node; 0: the node "
                                       "process serves it. --http-max-connections is per process; needs "
                                       "--metrics-port."),
    audit: bool = typer.Option(False, "--audit", help="Workers publish the request ids they ran on <p>._audit, as "
                               "'up --audit' (for counting duplicate executions in your own drills)."),
    log_level: str = typer.Option("info", metavar="<level>", help="debug, info, warning, error: as up's, for each "
                                  "region's node (nodes/<R>/node.log) and its actors' logs."),
    log_format: str = typer.Option("text", metavar="<format>", help="text or json: as up's, for each region's node "
                                   "and its actors' logs."),
) -> None:
    """Start the topology, print where everything is, serve until Ctrl-C / SIGTERM."""
    import asyncio

    from ._wrap import wrap_items, wrap_words
    from .cli import (_LastLine, _check_models_repo, _check_run_dir, _folder_option, _http_address, _is_loopback,
                      _models_dir, _note_if_no_models, _oip_line, _open_inference_note, _run, _wrap_width)
    from .cluster import Topology

    from .cli import _check_log_options

    _check_log_options("cluster up", log_level, log_format)
    models_path = _folder_option("cluster up", "--models", models)  # '' was the current folder, as for --run-dir
    _regions("up", regions)  # (before --metrics-port, whose range it sets)
    from .cli import _given, _typed_name, _usage

    port_flag, host_flag = (_typed_name(f"--http-{o}", f"--metrics-{o}") for o in ("port", "host"))
    if metrics_port is not None and not 0 <= metrics_port <= 65536 - regions:
        _usage(f"cluster up: {port_flag} must be 0 (a free port for each region) or in {interval(1, 65536 - regions)} "
               f"(region A's port, its {regions} regions on consecutive ports), got {metrics_port}")
    idle_given, max_given = _given(ctx, "http_idle_timeout_s"), _given(ctx, "http_max_connections")
    processes_given = _given(ctx, "http_processes")
    if metrics_port is None and (http_infer or http_model_control or metrics_host != "0.0.0.0" or idle_given
                                 or max_given or processes_given):  # (else ignored without a word)
        option = ("--http-infer" if http_infer else "--http-model-control" if http_model_control else
                  "--http-idle-timeout-s" if idle_given else "--http-max-connections" if max_given else
                  "--http-processes" if processes_given else host_flag)
        what = ("serves inference on" if http_infer else "serves model load and unload on" if http_model_control
                else "is a setting of" if idle_given or max_given else "serves" if processes_given
                else "is the address of")
        _usage(f"cluster up: {option} {what} the regions' HTTP ports and needs {port_flag}; add it or leave "
               f"{option} out")
    if not 0 < http_idle_timeout_s <= 3600:  # (as up's; NaN too)
        from ._limits import number_as_typed

        _usage(f"cluster up: --http-idle-timeout-s must be in {interval(0, 3600, lo_open=True)}, got "
               f"{number_as_typed(http_idle_timeout_s)}")
    if not 1 <= http_max_connections <= MAX_HTTP_CONNECTIONS:
        _usage(f"cluster up: --http-max-connections must be in {interval(1, MAX_HTTP_CONNECTIONS)}, got "
               f"{http_max_connections}")
    if not 0 <= http_processes <= MAX_HTTP_PROCESSES:
        _usage(f"cluster up: --http-processes must be in {interval(0, MAX_HTTP_PROCESSES)}, got {http_processes}")
    spec = _spec("up", regions, workers, base_port, prefix, models_path, proxy, actors, witness_servers, metrics_port,
                 ingress, audit, metrics_host, http_infer, http_model_control, http_idle_timeout_s,
                 http_max_connections, http_processes)
    run_dir = _folder_option("cluster up", "--run-dir", run_dir)  # '' was the current folder (Path('') is '.')
    if run_dir is not None:
        _check_run_dir(run_dir, "cluster up")
    if actors:  # (without actors no model is read)
        models_dir = _models_dir(models_path)
        _note_if_no_models(models_dir, _check_models_repo("cluster up", models_dir))

    width = _wrap_width()

    def say(line: str, head: Optional[str] = None, items: Optional[list[str]] = None, indent: int = 4) -> None:
        """``line`` where it fits the terminal (or piped without COLUMNS: one line, grepped), else ``head`` and
        then ``items`` wrapped between them (its words where none are given), the lines after the first indented by
        ``indent``, as ``up``'s lines: the banner's lines ran past a narrow terminal, which broke them anywhere."""
        if width is None or len(line) <= width or head is None:
            lines = wrap_words(line, width)
        else:
            lines = wrap_items(head, items or [], width, indent)
        for out in lines:
            typer.echo(out)

    from .actors._node import RunDirInUse

    async def go() -> int:
        t0 = time.monotonic()
        # the handlers go in before anything starts: a SIGTERM during the start-up (5-10 s) killed this process
        # outright and left the nodes and servers it had started running without it (a fresh-user trial, 5 of 5)
        stop = asyncio.Event()
        got: list[str] = []
        loop = asyncio.get_running_loop()
        signal_at: list[float] = []  # (time.monotonic() of each signal: the stop's clock starts at the first)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda name=sig.name: (got.append(name), signal_at.append(time.monotonic()),
                                                                stop.set()))
        topo = Topology(spec, run_dir=run_dir, log_level=log_level, log_format=log_format)
        ctl = t_stop = None

        async def start() -> str:
            await topo.start()
            return await topo.wait_settled(60)

        starting = asyncio.ensure_future(start())
        interrupted = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({starting, interrupted}, return_when=asyncio.FIRST_COMPLETED)
            interrupted.cancel()
            if not starting.done():  # a signal during the start-up: what started is stopped (Topology.start's
                t_stop = signal_at[0]  # cancellation stops the children it had started, then the finally below)
                typer.echo(f"{got[0]} during start-up: stopping what started", err=True)
                starting.cancel()
                await asyncio.wait({starting})
                if not starting.cancelled() and starting.exception() is not None:
                    typer.echo(f"(the start-up had failed meanwhile: {starting.exception()!r})", err=True)
                return 128 + signal.Signals[got[0]].value
            try:
                primary = starting.result()
            except RunDirInUse as exc:  # a live cluster (or node) there: nothing started or written (it was a
                # traceback, exit 1, after this cluster had rewritten the other's cluster.json and configs)
                from .cli import EXIT_USAGE, err_console
                from rich.markup import escape

                err_console.print(f"[red]error[/]: cluster up: {escape(str(exc))}")
                return EXIT_USAGE
            ctl = await topo.serve_control()
            took = f"inferbus cluster up in {time.monotonic() - t0:.1f}s —"
            say(f"{took} primary {primary}; run dir {topo.run_dir}", took, [f"primary {primary};",
                                                                            f"run dir {topo.run_dir}"])
            for site in spec.sites:
                kind = "witness (JetStream, lease replicas)" if site == spec.witness else "region"
                urls = ",".join(topo.urls(site))  # (one item: pasted whole as a --nats-url)
                say(f"  {site:3s} {kind:36s} {urls}", f"  {site:3s} {kind}", [urls], 6)
                if site != spec.witness and topo.plan.valkey_url(site):
                    conf = topo.run_dir / "valkey" / site / "valkey.conf"
                    say(f"      valkey {topo.plan.valkey_url(site)} (its password: {conf})", "      valkey",
                        [topo.plan.valkey_url(site), "(its password:", f"{conf})"], 10)
                if site != spec.witness and topo.metrics_port(site) is not None:
                    # (a node on every interface is reached on this host's loopback)
                    address = _http_address("127.0.0.1" if spec.metrics_host in ("0.0.0.0", "::") else
                                            spec.metrics_host, topo.metrics_port(site))
                    metrics = f"http://{address}/metrics"
                    say(f"      metrics {metrics}", "      metrics", [metrics], 10)
                    oip = _oip_line(address, spec.http_infer, spec.http_model_control)
                    say(f"      {oip}", "      OIP v2 REST", oip.split()[3:], 10)
                    if (spec.http_infer or spec.http_model_control) and not _is_loopback(spec.metrics_host):
                        where = _http_address(spec.metrics_host, topo.metrics_port(site))
                        typer.echo(f"note: {_open_inference_note(where, spec.http_infer, spec.http_model_control)}",
                                   err=True)
            # the clients' URLs stay on one line, however narrow the terminal: the list a user copies into
            # --nats-url (the terminal folds a line too long for it, and a copy of it is still the one line)
            typer.echo(f"  clients: {','.join(topo.client_urls(spec.regions[0]))}")
            status = f"inferbus region status --cluster {topo.run_dir}"  # (one item: a command to paste whole)
            say(f"  status:  {status}", "  status:", [status])
            typer.echo("serving; Ctrl-C to stop")
            stopped = asyncio.ensure_future(stop.wait())
            failed = asyncio.ensure_future(topo.wait_failed())
            await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
            t_stop = signal_at[0] if signal_at else time.monotonic()
            if not stopped.done():  # the supervisor tree gave up by itself: nothing is served, say so and exit 1
                stopped.cancel()
                typer.echo(f"error: cluster up: the cluster's supervisor gave up ({failed.result()!r}); stopping what "
                           f"is left", err=True)
                return 1
            failed.cancel()
            say(f"{got[0]}: stopping the cluster (actors, region managers, servers)")
            return 0
        finally:
            if ctl is not None:
                await ctl.close()
            await topo.stop()
            if t_stop is not None:  # said once the loop has ended (_LastLine), from the signal to then
                last.set(t_stop, lambda took_s, served=ctl is not None: say(
                    f"inferbus cluster stopped in {took_s:.1f}s" + ("" if served else " (during start-up; nothing "
                                                                                     "served)")))

    last = _LastLine()
    rc = _run(go())
    last.say()
    raise typer.Exit(rc)


@app.command(short_help="Render the configs and cluster.json of a topology.")
def config(
    regions: int = typer.Option(2, help=f"Number of regions, in {interval(2, 8)}."),
    base_port: int = typer.Option(14000, help=_BASE_PORT_HELP + "."),
    out: str = typer.Option("deploy/local", help="Folder for <server>.conf, valkey-<region>.conf, cluster.json.",
                            metavar="<path>"),
    data_root: str = typer.Option("/tmp/inferbus-local", help="Where the servers keep their data (a relative "
                                  "path is taken from the folder each server runs in).", metavar="<path>"),
    proxy: bool = typer.Option(True, help="Advertise proxy ports for the gateways (as 'up' does)."),
    witness_servers: int = typer.Option(3, help="Servers of the witness site: 3 or 5."),
    prefix: str = typer.Option("inferbus", help="Subject prefix the actors you run on these servers use (recorded "
                               "in cluster.json, which 'region ... --cluster' talks on)."),
) -> None:
    """Render the nats-server and Valkey configs of a topology and its cluster.json (what 'up' writes into its run
    dir); print the path of each file written."""
    from .cli import _folder_option, _usage
    from .cluster import Plan

    # str options, not Path ones: Path('') is '.', and an empty --out wrote the configs into the current folder, an
    # empty --data-root made the servers keep their data in theirs ('store_dir: "js/W1"')
    out_dir = _folder_option("cluster config", "--out", out)
    data_dir = _folder_option("cluster config", "--data-root", data_root)
    plan = Plan.make(_spec("config", regions, 1, base_port, prefix, None, proxy, True, witness_servers))
    try:
        written = plan.write_configs(out_dir, data_dir)
    except OSError as exc:  # --out an existing file, a folder that cannot be made...: one line, not a traceback
        _usage(f"cluster config: --out {out}: {exc.strerror or exc}")
    # write_configs writes cluster.json too but lists only the configs: it went unsaid
    for p in written + [out_dir / "cluster.json"] * (out_dir / "cluster.json" not in written):
        typer.echo(str(p))


_CLUSTER_FILE_MAX_BYTES = 16 * 1024 * 1024
"""The largest cluster.json read (bytes); ``cluster up`` writes a few KiB."""

_GIVE = "give the run dir of 'inferbus cluster up' or its cluster.json"


@dataclass(frozen=True)
class ClusterFile:
    """The cluster.json of ``inferbus cluster up`` (or ``cluster config``), read and checked by
    :func:`read_cluster_file`: what the ``--cluster`` readers (``cluster kill|restore|partition|isolate|heal``,
    ``region status|promote|demote``) connect to and talk on."""

    path: Path
    """The file read (the run dir's ``cluster.json`` when a folder was given)."""
    client_urls: tuple[str, ...]
    """``client_urls``: the regions' NATS URLs, the first region's first; () when the file has none."""
    witness_urls: tuple[str, ...]
    """The NATS URLs of the witness site's servers (``servers`` whose ``site`` is ``spec.witness``); () when none."""
    regions: tuple[str, ...]
    """``spec.regions``; () when the file has no spec (a hand-written file of ``client_urls`` alone)."""
    witness: Optional[str]
    """``spec.witness``, the witness site's name; None without a spec."""
    prefix: Optional[str]
    """``spec.prefix``, checked as the bus takes it; None when the file records none."""

    @property
    def sites(self) -> tuple[str, ...]:
        """Every site: the regions, then the witness."""
        return self.regions + ((self.witness,) if self.witness else ())


def _json_kind(value: object) -> str:
    return {list: "an array", str: "a string", bool: "true or false", type(None): "null"}.get(type(value), "a number")


def read_cluster_file(command: str, cluster: Optional[str], need: str) -> ClusterFile:
    """``--cluster`` of ``command`` (e.g. ``"region status"``, ``"cluster kill"``): a run dir of ``inferbus cluster
    up`` (its ``cluster.json``) or the file itself, read and checked before anything connects. The one reader of a
    cluster.json for every ``--cluster`` option.

    Args:
        command: the command as typed, for the messages.
        cluster: the option's text (a str option: ``Path('')`` is ``.``, and ``--cluster ''`` read ./cluster.json).
        need: ``"client_urls"`` (the region commands connect to the regions) or ``"witness"`` (the cluster
            commands connect to the witness and name regions and sites: ``spec.regions``, ``spec.witness`` and the
            witness's ``servers`` must be there).

    Raises:
        typer.Exit: (2) one line ``error: COMMAND: --cluster PATH: ...``, nothing opened or connected: an empty
            path; a file that is missing, not a regular file (a FIFO: never opened, reading it blocked), unreadable,
            not JSON (binary data or text that does not parse: said plainly, no parser's internals), JSON that is
            not an object, not the cluster.json of ``inferbus cluster up`` (``need`` missing, a field of the wrong
            type), or an invalid ``spec.prefix``.
    """
    import os
    import stat

    from .cli import _usage

    if cluster is None:
        raise ValueError("read_cluster_file: no --cluster given")
    if not cluster:
        _usage(f"{command}: --cluster must name the run dir of 'inferbus cluster up' or its cluster.json, got ''")
    given = Path(cluster)
    said = f"{command}: --cluster {cluster}"
    p = given / "cluster.json" if given.is_dir() else given
    try:
        st = os.stat(p)
    except OSError as exc:
        _usage(f"{said}: cannot read {p}: {exc.strerror or exc} ({_GIVE})")
    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device: not opened (a FIFO with no writer blocks for ever)
        _usage(f"{said}: cannot read {p}: not a regular file ({_GIVE})")
    if st.st_size > _CLUSTER_FILE_MAX_BYTES:
        _usage(f"{said}: {p} is not a cluster.json ({st.st_size} bytes; 'cluster up' writes a few KiB)")
    try:
        data = p.read_bytes()
    except OSError as exc:
        _usage(f"{said}: cannot read {p}: {exc.strerror or exc}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:
        _usage(f"{said}: {p} is not JSON: it holds binary data, not text ({_GIVE})")
    if not text.strip():
        _usage(f"{said}: {p} is empty, not JSON ({_GIVE})")
    try:
        info = json.loads(text)
    except ValueError as exc:  # JSONDecodeError (or a number too long to convert): its position, not its wording
        at = f" at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        _usage(f"{said}: {p} is not JSON: its text does not parse{at} ({_GIVE})")
    if not isinstance(info, dict):
        _usage(f"{said}: {p} holds {_json_kind(info)}, not the JSON object of a cluster.json ({_GIVE})")

    def not_ours(why: str):
        _usage(f"{said}: {p} is not the cluster.json of 'inferbus cluster up': {why}")

    def urls_of(value: object) -> Optional[tuple[str, ...]]:
        ok = isinstance(value, list) and all(isinstance(u, str) and u.strip() for u in value)
        return tuple(value) if ok else None

    client_urls: tuple[str, ...] = ()
    if "client_urls" in info or need == "client_urls":
        client_urls = urls_of(info.get("client_urls")) or ()
        if not client_urls:
            not_ours("it has no client_urls (a list of NATS URLs)" if "client_urls" not in info else
                     "its client_urls is not a list of NATS URLs")
    spec = info.get("spec")
    if spec is not None and not isinstance(spec, dict):
        not_ours(f"its spec is {_json_kind(spec)}, not an object")
    regions: tuple[str, ...] = ()
    witness = None
    witness_urls: tuple[str, ...] = ()
    if need == "witness" or spec is not None:
        spec = spec or {}
        regions, witness = spec.get("regions"), spec.get("witness")
        if need == "witness" and not spec:
            not_ours("it has no spec (the regions, the witness site and the prefix)")
        if regions is not None or need == "witness":
            if not (isinstance(regions, list) and regions and all(isinstance(r, str) and r for r in regions)):
                not_ours("its spec.regions is not a list of region names")
            regions = tuple(regions)
        else:
            regions = ()
        if witness is not None or need == "witness":
            if not (isinstance(witness, str) and witness):
                not_ours("its spec.witness is not a site name")
        if need == "witness" and "prefix" not in spec:
            not_ours("its spec records no prefix")
    if need == "witness":
        servers = info.get("servers")
        if not (isinstance(servers, dict) and all(isinstance(s, dict) for s in servers.values())):
            not_ours("its servers is not an object of servers")
        witness_urls = urls_of([s.get("url") for s in servers.values() if s.get("site") == witness]) or ()
        if not witness_urls:
            not_ours(f"its servers name no server of the witness site {witness!r} with a NATS URL")
    return ClusterFile(path=p, client_urls=client_urls, witness_urls=witness_urls, regions=regions, witness=witness,
                       prefix=spec_prefix(info, said if p == given else f"{said}: {p}"))


def spec_prefix(info: object, said: str) -> Optional[str]:
    """The subject prefix a cluster.json records (``spec.prefix``, as ``cluster up|config`` write it), checked as the
    bus takes it; None when ``info`` (the file's parsed JSON) records none. What every ``--cluster`` reader
    (``cluster kill|...``, ``region status|promote|demote``) talks on.

    Raises:
        typer.Exit: (2) one line ``error: SAID: its spec's prefix ... must be ...``, naming the file (``said`` says
            the command and the file): the connection's check named ``--prefix``, an option not given.
    """
    from .bus._config import prefix_problem
    from .cli import _usage

    spec = info.get("spec") if isinstance(info, dict) else None
    prefix = spec.get("prefix") if isinstance(spec, dict) else None
    if prefix is None:
        return None
    problem = prefix_problem(prefix) if isinstance(prefix, str) else (
        f"must be dot-separated tokens of letters, digits, '_' or '-', got {prefix!r}")
    if problem is not None:
        _usage(f"{said}: its spec's prefix {problem}")
    return prefix


_CONTROL_TIMEOUT_S = 60.0
"""Default budget of ``cluster kill|restore|partition|isolate|heal`` (s): the connect and the answer together; a
``restore`` starts a region's servers, Valkey and actors before it answers."""


async def _send(urls: list[str], prefix: str, op: str, timeout_s: float = _CONTROL_TIMEOUT_S, **kw):
    import msgspec

    from .cli import _left_s, _one_shot_client
    from .cluster import ClusterCommand, ClusterReply

    t_end = time.monotonic() + timeout_s  # the connect counts within --timeout-s
    # unreachable (or not within the budget): one line naming the URLs, exit 3
    nc = (await _one_shot_client(urls, prefix, timeout_s=timeout_s)).nc
    try:
        msg = await nc.request(f"{prefix}._cluster.ctl",
                               msgspec.msgpack.encode(ClusterCommand(op=op, **kw)), timeout=_left_s(t_end))
        return msgspec.msgpack.decode(msg.data, type=ClusterReply)
    finally:
        from .bus import close_connection

        await close_connection(nc)


def _known(cf: ClusterFile, command: str, what: str, names: list[str], kind: str) -> None:
    """Each of ``names`` (``what``: the argument, e.g. ``REGION``) is one of the cluster's ``kind`` (``regions`` or
    ``sites``), else one line naming the known ones, exit 2, before connecting (``command``: e.g. ``cluster kill``,
    ``region promote``): the cluster answered an unknown region with a KeyError-like refusal after the connect, an
    unknown site of a partition cut nothing, and ``region promote`` said no manager of that region was running."""
    from .cli import _usage

    known = cf.regions if kind == "regions" else cf.sites
    if not names:
        _usage(f"{command}: {what} names no site; give one or more of the cluster's sites, comma-separated: "
               f"{', '.join(known)}")
    bad = [n for n in names if n not in known]
    if bad:
        note = f" ({cf.witness} is the witness site; {command.split()[-1]} acts on regions)" if cf.witness in bad else ""
        _usage(f"{command}: {what} {', '.join(repr(n) for n in bad)}: not a {kind[:-1]} of the cluster in "
               f"{cf.path}; its {kind}: {', '.join(known)}{note}")


def _control(cluster: Optional[str], op: str, timeout_s: float = _CONTROL_TIMEOUT_S, *, region: Optional[str] = None,
             site: Optional[str] = None, sides: Optional[tuple[str, str]] = None) -> None:
    """Send ``op`` to the running ``cluster up`` and print its answer: exit 0 done, 1 refused. ``timeout_s`` (its
    ``--timeout-s``) bounds the connect and the answer together. ``region`` (kill, restore) must be one of the
    cluster's regions, ``site`` (isolate) one of its sites, ``sides`` (partition: two comma-separated lists) its
    sites, as its cluster.json names them.

    Raises:
        typer.Exit: (3) NATS unreachable (or not within ``timeout_s``), one line (:func:`inferbus.cli._run`); (2) a
            ``timeout_s`` that is not a finite number in (0, 600], a cluster.json that cannot be read
            (:func:`read_cluster_file`), a region or site it does not name (before connecting), or no answer from
            the cluster (its control subject has no responder, or no answer within ``timeout_s``), one line
            ``error: cluster OP: ...``, as every command's usage error and refusal.
    """
    from .cli import _check_timeout_s, _run, _usage

    _check_timeout_s(f"cluster {op}", timeout_s)
    cf = read_cluster_file(f"cluster {op}", cluster, "witness")
    kw: dict = {}
    if region is not None:
        _known(cf, f"cluster {op}", "REGION", [region], "regions")
        kw["region"] = region
    if site is not None:
        _known(cf, f"cluster {op}", "SITE", [site], "sites")
        kw["region"] = site
    if sides is not None:
        a, b = ([n.strip() for n in side.split(",") if n.strip()] for side in sides)
        _known(cf, f"cluster {op}", "SIDE_A", a, "sites")
        _known(cf, f"cluster {op}", "SIDE_B", b, "sites")
        both = sorted(set(a) & set(b))
        if both or not a or not b:  # `partition A A` was accepted and cut nothing (a fresh-user trial)
            _usage(f"cluster {op}: " + (f"{', '.join(both)} on both sides: a site cannot be cut from itself" if both
                                         else "each side must name at least one site"))
        kw.update(side_a=a, side_b=b)
    try:
        reply = _run(_send(list(cf.witness_urls), cf.prefix, op, timeout_s, **kw))
    except typer.Exit:  # NATS unreachable: _run printed it
        raise
    except Exception as exc:
        _usage(f"cluster {op}: no answer from the cluster ({type(exc).__name__}: {' '.join(str(exc).split())})")
    typer.echo(f"{op}: {reply.detail} ({_took(reply)})", err=not reply.ok)  # a failure on stderr
    raise typer.Exit(0 if reply.ok else 1)


def _took(reply) -> str:
    """How long a :class:`~inferbus.cluster.ClusterReply` 's command took: ``107.8 ms``, and for a kill or restore
    that waited for those sent before it (they run one at a time) ``107.8 ms, after waiting 6.9 s for restore A to
    finish``: it said only the 107.8 ms where the command had taken 7.6 s."""
    took = f"{reply.ms:.1f} ms"
    if reply.waited_for:
        took += f", after waiting {reply.waited_ms / 1000:.1f} s for {', '.join(reply.waited_for)} to finish"
    return took


def timeout_s_option(default: float, what: str):
    """The ``--timeout-s`` option of the ``region`` and ``cluster`` commands: the command's whole budget in seconds
    (checked by :func:`inferbus.cli._check_timeout_s`); ``what`` says what it covers after the connect."""
    return typer.Option(default, "--timeout-s", help=f"Budget of the command in seconds, in "
                                                     f"{interval(0, MAX_TIMEOUT_MS / 1000, lo_open=True)}: "
                                                     f"connecting to NATS, {what}.")


_CLUSTER = typer.Option(..., "--cluster", metavar="<path>",
                        help="Run dir (or cluster.json) of a running 'inferbus cluster up'.")
_TIMEOUT = timeout_s_option(_CONTROL_TIMEOUT_S, "and the cluster's answer (a restore starts the region's processes "
                                                "before it answers)")


@app.command(short_help="SIGKILL every process of REGION; it stays down.")
def kill(region: str = typer.Argument(..., metavar="REGION", help="A region of the cluster (its cluster.json's "
                                      "spec.regions; another name is refused before connecting)."),
         cluster: str = _CLUSTER, timeout_s: float = _TIMEOUT) -> None:
    """SIGKILL every process of REGION at once (servers, Valkey, node and actors); it stays down."""
    _control(cluster, "kill", timeout_s, region=region)


@app.command(short_help="Start a killed REGION again, as a standby.")
def restore(region: str = typer.Argument(..., metavar="REGION", help="A killed region of the cluster (its "
                                         "cluster.json's spec.regions)."),
            cluster: str = _CLUSTER, timeout_s: float = _TIMEOUT) -> None:
    """Start a killed REGION again; its region manager rejoins as standby."""
    _control(cluster, "restore", timeout_s, region=region)


@app.command(short_help="Cut the gateways between SIDE_A and SIDE_B.")
def partition(side_a: str = typer.Argument(..., metavar="SIDE_A", help="Sites, comma-separated (regions or the "
                                           "witness, as the cluster.json names them)."),
              side_b: str = typer.Argument(..., metavar="SIDE_B", help="Sites, comma-separated."),
              cluster: str = _CLUSTER, timeout_s: float = _TIMEOUT) -> None:
    """Cut the gateways between the sites of SIDE_A and SIDE_B (comma-separated site names of the cluster)."""
    _control(cluster, "partition", timeout_s, sides=(side_a, side_b))


@app.command(short_help="Cut SITE's gateways to every other site.")
def isolate(site: str = typer.Argument(..., metavar="SITE", help="A site of the cluster: a region or the witness."),
            cluster: str = _CLUSTER, timeout_s: float = _TIMEOUT) -> None:
    """Cut SITE's gateways to every other site."""
    _control(cluster, "isolate", timeout_s, site=site)


@app.command(short_help="Remove every gateway fault.")
def heal(cluster: str = _CLUSTER, timeout_s: float = _TIMEOUT) -> None:
    """Remove every gateway fault."""
    _control(cluster, "heal", timeout_s)
