"""``inferbus region``: status, promote and demote of the regions' primary role (DESIGN §8).

Regions are discovered from their managers' heartbeats (``<p>._region.hb.*``,
every 100 ms), workers and models per region from the workers' load reports;
each manager answers ``status``, ``promote`` and ``demote`` requests on
``<p>._region.ctl.<region>`` with the steps it took and their timings.
"""

from __future__ import annotations

import json
import re
import time
from typing import Optional

import typer

from ._limits import MAX_REGION_HEARTBEAT_MS, MAX_REGION_MS, MAX_TIMEOUT_MS, interval

from ._cli_cluster import timeout_s_option

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Regions: which one is primary (lease, fencing term, cache master), promote, demote.",
                  short_help="Show and change which region is primary.")

_LISTEN_S = 0.35
"""How long to listen for heartbeats and load reports (3+ heartbeat periods)."""


def target_option(command: str, nats_url: Optional[str], cluster: Optional[str],
                  prefix: Optional[str], regions: tuple[tuple[str, Optional[str]], ...] = ()) -> tuple[list[str], str]:
    """The servers and the subject prefix of ``command`` (e.g. ``"region status"``), before it connects.

    Servers: ``--nats-url`` (comma-separated), else ``--cluster`` (a run dir or its cluster.json: its
    ``client_urls``, read and checked by :func:`inferbus._cli_cluster.read_cluster_file`, as ``cluster kill|...``
    read it), else ``nats://127.0.0.1:4222``. Prefix: ``--prefix``, else the one the ``--cluster`` file records
    (``spec.prefix``), else ``inferbus``. (The file's prefix was ignored: against a cluster started with ``cluster
    up --prefix P`` the commands talked on ``inferbus.*`` and heard no manager.)

    Raises:
        typer.Exit: (2, one line ``error: COMMAND: ...``) both ``--nats-url`` and ``--cluster`` given (the URLs of
            ``--cluster`` were ignored without a word); a ``--nats-url`` that names no server (``''``: it was the
            default URL); a ``--cluster`` that :func:`~inferbus._cli_cluster.read_cluster_file` refuses (empty, a
            file missing, not a regular file, unreadable, not JSON, not a JSON object, with no ``client_urls``, or
            an invalid prefix); ``--prefix`` given and not the prefix the ``--cluster`` file records; a region of
            ``regions`` (``(argument, name)`` pairs, e.g. ``("REGION", "Z")``; None = not given) that the
            ``--cluster`` file's ``spec.regions`` does not name (a file without a spec is not checked).
    """
    from ._cli_cluster import read_cluster_file
    from .cli import _nats_urls_given, _usage

    if nats_url is not None and cluster is not None:
        _usage(f"{command}: --nats-url and --cluster both say which NATS to reach (--cluster: the client URLs in its "
               f"cluster.json); give one of them")
    if nats_url is not None:
        return _nats_urls_given(command, nats_url), prefix or "inferbus"
    if cluster is not None:
        cf = read_cluster_file(command, cluster, "client_urls")
        if cf.prefix is not None and prefix is not None and prefix != cf.prefix:
            _usage(f"{command}: --prefix {prefix!r} is not the prefix of the cluster in {cf.path} ({cf.prefix!r}); "
                   f"leave --prefix out or give {cf.prefix!r}")
        if cf.regions:
            from ._cli_cluster import _known

            for what, name in regions:
                if name is not None:
                    _known(cf, command, what, [name], "regions")
        return list(cf.client_urls), prefix or cf.prefix or "inferbus"
    return ["nats://127.0.0.1:4222"], prefix or "inferbus"


async def _connect(servers: list[str], prefix: str, timeout_s: float):
    """A NATS connection for one command, made within ``timeout_s`` (its ``--timeout-s``; raises
    :class:`inferbus.cli.NatsUnreachable`: one line, exit 3)."""
    from .cli import _one_shot_client

    return (await _one_shot_client(servers, prefix, timeout_s=timeout_s)).nc


async def discover(nc, prefix: str, listen_s: float = _LISTEN_S) -> tuple[dict, dict]:
    """``({region: (age_ms, RegionHeartbeat)}, {region: {worker_id: LoadReport}})`` heard within ``listen_s``."""
    import asyncio

    from .bus import Subjects
    from .schemas._internal import InternalDecodeError, LoadReport, decode_internal
    from .schemas._region import RegionDecodeError, RegionHeartbeat, decode_region

    s = Subjects(prefix)
    hbs: dict = {}
    loads: dict = {}

    async def on_hb(msg):
        try:
            hb = decode_region(msg.data)
        except RegionDecodeError:
            return
        if isinstance(hb, RegionHeartbeat):
            hbs[hb.region] = (time.monotonic(), hb)

    async def on_load(msg):
        try:
            r = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if isinstance(r, LoadReport):
            loads.setdefault(r.region or "-", {})[r.worker_id] = r

    subs = [await nc.subscribe(s.region_heartbeats, cb=on_hb), await nc.subscribe(s.load, cb=on_load)]
    await asyncio.sleep(listen_s)
    for sub in subs:
        await sub.unsubscribe()
    now = time.monotonic()
    return {r: ((now - t) * 1000, hb) for r, (t, hb) in hbs.items()}, loads


_PREFIX = typer.Option(None, help="Subject prefix (default: the one the --cluster file records, else inferbus).")
_CLUSTER = typer.Option(None, metavar="<path>", help="Run dir (or cluster.json) of 'inferbus cluster up' (its "
                        "client_urls and prefix).")
_STATUS_TIMEOUT_S = 2.5
"""``region status``'s default budget (s): the connect, 0.35 s of listening and ~2 s for the managers' answers."""
_CONTROL_TIMEOUT_S = 10.0
"""``region promote|demote``'s default budget (s), the connect and the manager's answer included."""


def _report(head: str, reply, t0: float) -> None:
    """Print a promote/demote reply: ``head:`` and the manager's steps on stdout, then ``done in ...``; or, when it
    failed, ``error: region <head>: failed: <why>`` on stderr after the steps it took, and exit 1. A refusal that took
    no step (a non-forced promote while another region holds the lease) is one stderr line, ``error: region <head>:
    refused: <why>``: no header with nothing under it on stdout. (The stderr line started ``<head>: ``, with no
    ``error: `` as every other error line of the CLI has.)"""
    if reply.steps or reply.ok:
        typer.echo(f"{head}:")
        for i, st in enumerate(reply.steps, 1):
            typer.echo(f"  {i:2d}. {st.name:34s} {st.ms:9.1f} ms  {st.detail}".rstrip())  # (no detail: no blanks)
    if not reply.ok:
        typer.echo(f"error: region {head}: {'failed' if reply.steps else 'refused'}: {reply.error}", err=True)
        raise typer.Exit(1)
    typer.echo(f"done in {(time.monotonic() - t0) * 1000:.1f} ms (round trip)")


@app.command(short_help="Show each region's role, term, lease and heartbeats.")
def status(
    nats_url: Optional[str] = typer.Option(None, help="NATS URL(s), comma-separated (any region)."),
    cluster: Optional[str] = _CLUSTER,
    prefix: Optional[str] = _PREFIX,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    timeout_s: float = timeout_s_option(_STATUS_TIMEOUT_S, "listening 0.35 s for heartbeats and the managers' answers "
                                                          "(a manager that has not answered by then: 'no answer')"),
) -> None:
    """Regions, primary, term, lease age, heartbeat ages, workers and models per region, cache role."""
    import asyncio

    from rich.table import Table

    import msgspec

    from ._wrap import FittedTable
    from .actors._region import ask_region
    from .cli import _check_prefix, _check_timeout_s, _json_error, _left_s, _run, console

    if prefix is not None:
        _check_prefix(prefix)
    _check_timeout_s("region status", timeout_s)
    servers, prefix = target_option("region status", nats_url, cluster, prefix)
    known: tuple[str, ...] = ()
    if cluster is not None:  # every region the cluster.json names is shown, a dead one as no answer (a killed
        from ._cli_cluster import read_cluster_file  # region was left out: only those heard in the listen were)

        known = read_cluster_file("region status", cluster, "client_urls").regions

    async def go():
        t_end = time.monotonic() + timeout_s  # the connect counts within --timeout-s
        nc = await _connect(servers, prefix, timeout_s)
        try:
            hbs, loads = await discover(nc, prefix, listen_s=min(_LISTEN_S, _left_s(t_end)))

            async def one(region):
                try:
                    return (await ask_region(nc, prefix, region, "status", timeout_s=_left_s(t_end))).status
                except Exception as exc:
                    return exc

            regions = sorted(set(hbs) | set(known))  # asked at once: one that does not answer costs the budget once
            return hbs, loads, dict(zip(regions, await asyncio.gather(*(one(r) for r in regions))))
        finally:
            from .bus import close_connection

            await close_connection(nc)

    hbs, loads, sts = _run(go(), as_json=json_out)
    if not hbs:
        text = ("no region manager heard: is a region up (`inferbus cluster up`, or `inferbus region manager` "
                "beside a node; a plain `inferbus up` runs none: docs/regions.md), and the prefix right?")
        if json_out:
            _json_error("UNAVAILABLE", text)
        typer.echo(f"UNAVAILABLE: {text}", err=True)  # as health and infer print a typed UNAVAILABLE; the JSON's code
        raise typer.Exit(1)
    primaries = [r for r, st in sts.items() if not isinstance(st, Exception) and st.role == "primary"]
    # the regions asked that did not answer, and those an answering region knows of but this CLI did not hear (its
    # peer_roles; a partition hides their heartbeats too): across a partition the primary is often among them (a
    # fresh-user trial read "primary: none" as an outage while B held the lease all along). Not the lease holder as
    # a cut-off region read it: that reading is as old as the cut (a trial: "the lease names A", A standby and stale)
    answered = [st for st in sts.values() if not isinstance(st, Exception)]
    unanswered = sorted({r for r, st in sts.items() if isinstance(st, Exception)}
                        | {peer for st in answered for peer in (st.peer_roles or {}) if peer not in sts})
    if json_out:
        # "primary": the region's name when exactly one is primary, else the list (none, or two for a moment after a
        # forced takeover); "primaries" is always the list, for a script that wants one type
        doc = {"primary": primaries[0] if len(primaries) == 1 else primaries, "primaries": sorted(primaries),
               "unanswered": unanswered, "regions": {}}
        for region, st in sts.items():
            ws = loads.get(region, {})
            d = {"error": str(st)} if isinstance(st, Exception) else msgspec.to_builtins(st)
            d["workers"] = sorted(ws)
            d["models"] = sorted({m for w in ws.values() for m in w.models})
            d.pop("transitions", None)
            doc["regions"][region] = d
        print(json.dumps(doc, default=str))
        raise typer.Exit(0 if len(primaries) == 1 else 1)
    if primaries or not unanswered:
        title = ", ".join(primaries) or "none"
    else:  # no primary among those that answered: say who did not, and whom the lease names
        title = (f"none among the regions that answered; no answer from {', '.join(unanswered)}, which may be "
                 f"primary beyond a partition")
    t = Table()
    cols = ("region", "role", "term", "lease rev", "holder", "lease age ms", "heartbeat age ms", "cache",
            "model writes", "workers", "models")
    for col in cols:
        t.add_column(col)
    # the terminal's width (COLUMNS where piped), name=value blocks where the table does not fit (a fresh-user
    # trial: it was printed 200 columns wide whatever the terminal)
    fitted = FittedTable(t, f"regions — primary: {title}", wrap_cells=True, title_justify="left")
    for region, st in sts.items():
        ws = loads.get(region, {})
        models = sorted({m for w in ws.values() for m in w.models})
        if isinstance(st, Exception):
            row = [region, f"no answer: {type(st).__name__}", *[""] * 7, str(len(ws)), ", ".join(models)]
        else:
            # each other region's heartbeat age, ms (B:70): one item in a name=value block (it read "B 70")
            peers = ",".join(f"{r}:{age:.0f}" for r, age in sorted(st.heartbeat_age_ms.items()) if r != region)
            row = [region, st.role, str(st.term), str(st.lease_rev), st.lease_holder or "-",
                   f"{st.lease_age_ms:.0f}", peers, st.cache_role, "on" if st.model_writes else "off", str(len(ws)),
                   ", ".join(models)]
        fitted.add_row(*row)
    console.print(fitted)
    raise typer.Exit(0 if len(primaries) == 1 else 1)


def _check_region(command: str, name: str, what: str) -> None:
    """A region name is one subject token (1-64 letters, digits, '_' or '-', as ``up --region`` takes it), else one
    line and exit 2 before anything is sent (``a b`` used to reach nats-py and come back as ``BadSubjectError``, exit
    1; a name of thousands of characters made a subject the NATS server closed the connection for)."""
    from .bus._config import _TOKEN_RE
    from .cli import _usage

    if len(name) > 64:
        _usage(f"region {command}: {what} must be a region name of at most 64 characters, got {len(name)}: "
               f"{name[:40]!r}...")
    if not _TOKEN_RE.match(name):
        _usage(f"region {command}: {what} must be a region name (letters, digits, '_' or '-'), got {name!r}")


@app.command(short_help="Make REGION the primary region.")
def promote(
    region: str = typer.Argument(..., metavar="REGION", help="Region to make primary."),
    force: bool = typer.Option(False, help="Take over even while another region holds a live lease."),
    nats_url: Optional[str] = typer.Option(None, help="NATS URL(s), comma-separated (any region)."),
    cluster: Optional[str] = _CLUSTER,
    prefix: Optional[str] = _PREFIX,
    timeout_s: float = timeout_s_option(_CONTROL_TIMEOUT_S, "and the region manager's answer (the steps it took)"),
) -> None:
    """Make REGION primary: lease CAS, Valkey master, model-management writes on, new term published.

    Refused while another region holds a live lease unless --force (the holder is asked to step
    down first; if it cannot be reached its next renewal fails and it steps down at once).
    """
    from .actors._region import ask_region
    from .cli import _check_prefix, _check_timeout_s, _left_s, _run

    if prefix is not None:
        _check_prefix(prefix)
    _check_timeout_s("region promote", timeout_s)
    _check_region("promote", region, "REGION")
    servers, prefix = target_option("region promote", nats_url, cluster, prefix, (("REGION", region),))

    async def go():
        t_end = time.monotonic() + timeout_s  # the connect counts within --timeout-s
        nc = await _connect(servers, prefix, timeout_s)
        try:
            return await ask_region(nc, prefix, region, "promote", force=force, timeout_s=_left_s(t_end))
        finally:
            from .bus import close_connection

            await close_connection(nc)

    t0 = time.monotonic()
    try:
        reply = _run(go())
    except typer.Exit:
        raise
    except Exception as exc:  # no responders / timeout: the operation ran and found no manager to do it
        typer.echo(f"error: region promote {region}: {_no_manager(exc, timeout_s)}", err=True)
        raise typer.Exit(1)
    _report(f"promote {region}{' (forced)' if force else ''}", reply, t0)


def _no_manager(exc: BaseException, timeout_s: float) -> str:
    """One line for a region command nobody answered (exit 1: the command ran, no manager could act on it)."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    if isinstance(exc, NoRespondersError):
        return ("no region manager of that region answers from here (no responders on its control subject: it is not "
                "running, or a partition cuts it off from this side)")
    if isinstance(exc, NatsTimeout):
        return f"its region manager did not answer within the command's --timeout-s ({timeout_s:g} s)"
    return f"no answer from its region manager ({type(exc).__name__}: {exc})"


@app.command(short_help="Hand the primary role over to another region.")
def demote(
    region: Optional[str] = typer.Argument(None, metavar="REGION", help="Region to demote (default: the current primary)."),
    to: str = typer.Option("", help="Region to hand over to (default: the live standby heard last)."),
    force: bool = typer.Option(False, help="Release the lease even when no other region's manager is live "
                                           "(no primary until one is); does not wait for a new primary."),
    nats_url: Optional[str] = typer.Option(None, help="NATS URL(s), comma-separated (any region)."),
    cluster: Optional[str] = _CLUSTER,
    prefix: Optional[str] = _PREFIX,
    timeout_s: float = timeout_s_option(_CONTROL_TIMEOUT_S, "listening 0.35 s for the primary's heartbeat (without "
                                                            "REGION) and the region manager's answer"),
) -> None:
    """Hand the primary role over: release the lease (naming the successor), step down, report the new primary.

    Refused (exit 1, nothing changed, the lease kept) when no other region's manager is live (its
    heartbeat older than the suspect time), or when --to names one that is not, unless --force.
    """
    from .actors._region import ask_region
    from .cli import _check_prefix, _check_timeout_s, _left_s, _run, _usage

    if prefix is not None:
        _check_prefix(prefix)
    _check_timeout_s("region demote", timeout_s)
    if region is not None:
        _check_region("demote", region, "REGION")
    if to:
        _check_region("demote", to, "--to")
    if to and region is not None and to == region:
        _usage(f"region demote: --to names {to}, the region being demoted: name another region, or leave --to out "
               f"for the live standby heard last")
    servers, prefix = target_option("region demote", nats_url, cluster, prefix,
                                    (("REGION", region), ("--to", to or None)))

    async def go():
        t_end = time.monotonic() + timeout_s  # the connect counts within --timeout-s
        nc = await _connect(servers, prefix, timeout_s)
        try:
            target = region
            if target is None:
                hbs, _ = await discover(nc, prefix, listen_s=min(_LISTEN_S, _left_s(t_end)))
                prim = [r for r, (_, hb) in hbs.items() if hb.role == "primary"]
                if len(prim) != 1:
                    return None, (f"cannot tell the primary from the heartbeats (primaries heard: "
                                  f"{', '.join(sorted(prim)) or 'none'})")
                target = prim[0]
            return target, await ask_region(nc, prefix, target, "demote", successor=to, force=force,
                                            timeout_s=_left_s(t_end))
        finally:
            from .bus import close_connection

            await close_connection(nc)

    t0 = time.monotonic()
    try:
        target, reply = _run(go())
    except typer.Exit:
        raise
    except Exception as exc:
        typer.echo(f"error: region demote: {_no_manager(exc, timeout_s)}", err=True)
        raise typer.Exit(1)
    if target is None:
        typer.echo(f"error: region demote: {reply}", err=True)
        raise typer.Exit(1)
    _report(f"demote {target}{' (forced)' if force else ''}", reply, t0)


@app.command("manager", short_help="Run one region manager in the foreground.")
def manager(
    region: str = typer.Argument(..., metavar="REGION", help="This region's name (a subject token)."),
    nats_url: str = typer.Option(..., help="This region's NATS servers, comma-separated."),
    valkey_url: Optional[str] = typer.Option(None, help="This region's Valkey/Redis (redis://host:port/0)."),
    lease_cluster: Optional[str] = typer.Option(None, help="JetStream cluster that holds the lease (the witness)."),
    lease_nats_url: Optional[str] = typer.Option(
        None, help="The witness cluster's NATS servers, comma-separated: lease reads, writes and the watch go "
                   "there directly, so losing one server of this region cannot blind them (recommended)."),
    replicas: int = typer.Option(3, help=f"Replicas of the lease stream, in {interval(1, 5)}."),
    prefix: str = typer.Option("inferbus", help="Subject prefix."),
    heartbeat_ms: int = typer.Option(100, help=f"Heartbeat and lease renewal period, ms, in {interval(10, MAX_REGION_HEARTBEAT_MS)}."),
    lease_ms: int = typer.Option(400, help="A standby takes over once the lease has not been renewed for this long, "
                                           f"ms, in {interval(20, MAX_REGION_MS)} and at least 2 × --heartbeat-ms."),
    suspect_ms: int = typer.Option(400, help="No primary heartbeat for this long: the primary is suspected gone, ms "
                                             "in (0, --lease-ms]."),
    initial_primary: bool = typer.Option(False, help="Campaign at once when no lease exists yet."),
    initial_wait_ms: int = typer.Option(5000, help="Without --initial-primary: when no lease exists yet, "
                                                   f"campaign only after running this long (ms), in {interval(0, MAX_REGION_MS)}."),
    auto_failover: bool = typer.Option(True, help="Take over automatically when the primary is gone."),
) -> None:
    """Run one region manager in the foreground (for regions whose actors run with 'inferbus up').

    'inferbus cluster up' starts one per region itself; use this against real clusters by URL.
    """
    from nats.errors import NoServersError

    from .actors._common import run_actor
    from .actors._region import RegionConfig, RegionManager
    from .bus import BusConfig, shown_servers, shown_url, split_servers
    from .cli import NatsUnreachable, _check_prefix, _exit_unreachable, _nats_urls_given, _usage, _with_flags

    _check_region("manager", region, "REGION")  # it becomes a subject token (<p>._region.hb.<region>)
    _check_prefix(prefix)
    _nats_urls_given("region manager", nats_url)  # '' was a ValueError traceback from the connection's config
    if lease_nats_url is not None:
        _nats_urls_given("region manager", lease_nats_url, "--lease-nats-url")  # '' was taken as not given
    if valkey_url is not None and not re.match(r"(redis|rediss|unix)://", valkey_url):
        _usage(f"region manager: --valkey-url must start with redis://, rediss:// or unix://, "
               f"got {shown_url(valkey_url)!r}")
    if valkey_url is not None:
        from urllib.parse import urlparse

        try:  # a port out of range or not a number, a broken IPv6 host: a ValueError traceback from the manager
            urlparse(valkey_url).port
        except ValueError as exc:
            _usage(f"region manager: --valkey-url {shown_url(valkey_url)!r}: {exc}")
    try:
        cfg = RegionConfig(region=region, bus=BusConfig(servers=split_servers(nats_url),
                                                       prefix=prefix, no_randomize=True, ping_interval_s=0.5),
                           lease_bus=BusConfig(servers=split_servers(lease_nats_url), prefix=prefix,
                                               no_randomize=True, ping_interval_s=0.5) if lease_nats_url else None,
                           valkey_url=valkey_url, placement_cluster=lease_cluster, replicas=replicas,
                           heartbeat_ms=heartbeat_ms, lease_ms=lease_ms, suspect_ms=suspect_ms,
                           initial_primary=initial_primary, initial_wait_ms=initial_wait_ms,
                           auto_failover=auto_failover)
    except ValueError as exc:  # a value the config refuses (e.g. --lease-ms 0): one line, not a traceback, naming
        # the options (it named the config's fields: "RegionConfig.replicas must be in 1..5", without the value)
        _usage(f"region manager: {_with_flags(' '.join(str(exc).split()), manager)}")
    try:
        run_actor(RegionManager(cfg).run)
    except NatsUnreachable as exc:  # one line, exit 3 (a 78-line traceback before)
        raise _exit_unreachable(exc) from None
    except (NoServersError, OSError) as exc:
        where = shown_servers(nats_url) + (f" (or the lease's {shown_servers(lease_nats_url)})" if lease_nats_url else "")
        raise _exit_unreachable(NatsUnreachable(f"cannot reach NATS at {where}: {exc}", nats_url)) from None
