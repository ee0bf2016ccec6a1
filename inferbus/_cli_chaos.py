"""``inferbus chaos``: run failover drills by name (see :mod:`chaos.drills`).

Exit status of ``chaos run``: 0 the drill ran and answered nothing wrong and executed nothing twice (and, with
``--min-availability A``, answered at least that share of its requests right); 1 it ran but saw wrong answers or
duplicates, or answered less than ``--min-availability``; 2 a usage error (unknown drill or fault name, an option
the drill does not take, a value out of range), one line on stderr starting ``error: chaos run: ``, as every
command's (``error: chaos run: --rate must be in (0, 1,000,000] requests/s, got 0``); 3 the drill cannot run here
(its fault is unavailable on this target, or, for a soak, every fault it was given is; or its deployment did not
start), with the reason on stderr; 128 + the signal when SIGTERM or SIGINT stopped it (its deployment is stopped
first; nothing is printed for a run cut short).
"""

from __future__ import annotations

import json
from typing import Optional

import typer

from ._limits import (MAX_DRILL_PROCESSES, MAX_DRILL_RATE_QPS, MAX_GATEWAY_LATENCY_MS, MAX_PERIOD_S, MAX_TIMEOUT_MS,
                      interval)

_S = interval(0, MAX_PERIOD_S, lo_open=True)
"""The range of a drill's times in seconds, as chaos._options checks them (a day at most)."""
_S0 = interval(0, MAX_PERIOD_S)
"""The same, 0 allowed (``--hang-s``, ``--fault-at``, ``--down-s``)."""
_COUNT = interval(1, MAX_DRILL_PROCESSES)
"""The range of ``--workers`` and ``--ingress``."""

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Failover drills: inject a fault under checked load and print the figures.",
                  short_help="Run failover drills under checked load.")


@app.command("list", short_help="List the registered drills.")
def list_drills() -> None:
    """List the registered drills."""
    import textwrap

    from chaos.drills import DRILLS

    from .cli import console

    for name in sorted(DRILLS):  # each summary wrapped to the terminal (or COLUMNS), under the summaries' column
        typer.echo("\n".join(textwrap.wrap(f"{name:18s} {DRILLS[name].summary}", max(console.width, 40),
                                            subsequent_indent=" " * 19, break_on_hyphens=False)))


_FAULT_WITHIN_LOAD = ("region-failover", "region-partition", "nats-node-loss")
"""Drills whose fault comes ``--fault-at`` seconds into a load of ``--duration`` seconds (gateway-degrade lengthens its
load to cover its fault instead)."""
_FLAGS = {
    "fault_every_s": "--fault-every", "topology": "--topology", "workers": "--workers", "hang_s": "--hang-s",
    "gateway_latency_ms": "--latency-ms", "gateway_drop_pct": "--drop-pct", "gateway_links": "--links",
    "fault_s": "--fault-s", "node_down_s": "--down-s", "nats_server": "--server", "fault_at_s": "--fault-at",
    "faults": "--faults", "ingress": "--ingress",
}

_OPTION_FLAGS = {**_FLAGS, "duration_s": "--duration", "rate_qps": "--rate", "timeout_s": "--timeout-s"}
"""Every option field a drill's range check may name → the option as typed."""


def _as_typed(flag: str) -> str:
    """``flag``, or ``--timeout`` when the command line gave the budget by its older name (Click does not say which
    name of an option was used): a range error names the option as typed."""
    from .cli import _timeout_s_as_typed

    return _timeout_s_as_typed() if flag == "--timeout-s" else flag


@app.command("run", short_help="Run one drill on a deployment of its own.")
def run(
    name: str = typer.Argument(..., metavar="NAME", help="Drill name (inferbus chaos list)."),
    duration_s: Optional[float] = typer.Option(None, "--duration",
                                               help=f"Seconds of load, in {_S} (drill default if omitted)."),
    rate_qps: Optional[float] = typer.Option(None, "--rate", help=f"Offered load, requests/s, in "
                                                                  f"{interval(0, MAX_DRILL_RATE_QPS, lo_open=True)}."),
    timeout_s: Optional[float] = typer.Option(None, "--timeout-s", "--timeout",
                                              help=f"Per-request budget, seconds, in "
                                                   f"{interval(0, MAX_TIMEOUT_MS / 1000, lo_open=True)} (what an "
                                                   "ingress accepts; --timeout-s as every command names it; --timeout "
                                                   "is the older name of the same option)."),
    fault_every_s: Optional[float] = typer.Option(None, "--fault-every",
                                                  help=f"soak: seconds between faults, in {_S} (30)."),
    topology: Optional[bool] = typer.Option(None, "--topology/--node",
                                            help="soak: run on the two-region topology (cluster faults in the "
                                                 "cycle) or on one node (default)."),
    faults: Optional[str] = typer.Option(None, "--faults",
                                         help="soak: comma-separated fault names to cycle through (default: all)."),
    workers: Optional[int] = typer.Option(None, "--workers",
                                          help=f"Worker processes (per region on a topology), in {_COUNT}."),
    ingress: Optional[int] = typer.Option(None, "--ingress", help=f"Node drills: ingress replicas, in {_COUNT} (2)."),
    hang_s: Optional[float] = typer.Option(None, "--hang-s",
                                           help=f"How long hang/slow faults last, seconds, in {_S0}."),
    latency_ms: Optional[float] = typer.Option(None, "--latency-ms",
                                               help="Region drills: gateway latency, ms each way, in "
                                                    f"{interval(0, MAX_GATEWAY_LATENCY_MS)} (gateway-degrade: 50; others: whole "
                                                    "drill, 0)."),
    drop_pct: Optional[float] = typer.Option(None, "--drop-pct",
                                             help=f"Region drills: gateway packet loss, percent, in {interval(0, 100)} "
                                                  "(gateway-degrade: 5; others: whole drill, 0; 100 = blackhole)."),
    links: Optional[str] = typer.Option(None, "--links", help="Gateway faults act on 'regions' (A<->B) or 'all'."),
    fault_at_s: Optional[float] = typer.Option(None, "--fault-at",
                                               help=f"Region drills: seconds of load before the fault, in {_S0}."),
    fault_s: Optional[float] = typer.Option(None, "--fault-s",
                                            help=f"gateway-degrade: how long the fault lasts, seconds, in {_S}."),
    down_s: Optional[float] = typer.Option(None, "--down-s",
                                           help="nats-node-loss: seconds the server stays down before its restart, "
                                                f"in {_S0}."),
    server: Optional[str] = typer.Option(None, "--server", help="nats-node-loss: which server (e.g. A2)."),
    run_dir: Optional[str] = typer.Option(None, help="Logs of the deployment the drill starts (default: temp).",
                                          metavar="<path>"),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as one JSON object."),
    min_availability: Optional[float] = typer.Option(
        None, "--min-availability", metavar="<float>",
        help=f"Exit 1 when the drill answered less than this share of its requests right (in {interval(0, 1)}; "
             "default: failed requests are reported, only wrong answers and duplicates fail the drill)."),
) -> None:
    """Run one drill: it starts its own deployment on free ports, injects the fault, prints the figures."""
    from chaos.drills import UnknownDrill, get_drill, make_options, option_names
    from chaos.faults import FaultError, FaultUnavailable, UnknownFault

    from ._signals import StoppedBySignal, until_signal
    from ._limits import interval, number_as_typed
    from .cli import _check_timeout_s, _folder_option, _run, _usage  # _usage: one line on stderr, "error: ...",
    # exit 2, as every command's usage error

    try:
        get_drill(name)
        takes = option_names(name)
    except UnknownDrill as exc:
        _usage(f"chaos run: {exc}")
    values = dict(fault_every_s=fault_every_s, topology=topology, workers=workers, ingress=ingress, hang_s=hang_s,
                  gateway_latency_ms=latency_ms, gateway_drop_pct=drop_pct, gateway_links=links, fault_s=fault_s,
                  node_down_s=down_s, nats_server=server, fault_at_s=fault_at_s,
                  faults=tuple(x.strip() for x in faults.split(",") if x.strip()) if faults else None)
    if values["faults"] == ():  # "," or " ": a soak with no fault at all ran, and passed
        from chaos.faults import FAULTS

        _usage(f"chaos run: --faults names no fault; give one or more, comma-separated, of: "
               f"{', '.join(sorted(FAULTS))}")
    run_dir = _folder_option("chaos run", "--run-dir", run_dir)  # '' was the current folder (Path('') is '.')
    if run_dir is not None:
        from ._paths import folder_problem

        problem = folder_problem(run_dir)  # a file, or a folder that cannot be made: was a traceback, exit 1
        if problem:
            _usage(f"chaos run: --run-dir {run_dir}: {problem}")
    unused = [_FLAGS[k] for k, v in values.items() if v is not None and k not in takes]
    if unused:
        _usage(f"chaos run: drill {name} does not take {', '.join(unused)}")
    if min_availability is not None and not 0.0 <= min_availability <= 1.0:  # NaN too
        _usage(f"chaos run: --min-availability must be in {interval(0, 1)} (a share of the requests), "
               f"got {number_as_typed(min_availability)}")
    if timeout_s is not None:  # in the words of every other command's --timeout-s
        _check_timeout_s("chaos run", timeout_s, _as_typed("--timeout-s"))
    fn, opts_cls = get_drill(name).load()
    try:
        opts = make_options(opts_cls, duration_s=duration_s, rate_qps=rate_qps, timeout_s=timeout_s,
                            run_dir=str(run_dir) if run_dir else None, **values)
    except ValueError as exc:  # the options' checks name their field: say the option as typed, in the words of every
        # other command's refusal ("chaos run: --rate must be ..., got ..."; it was "drill NAME: bad option: ...")
        msg = str(exc)
        field_name = msg.split(" ", 1)[0].rstrip(":")
        flag = _OPTION_FLAGS.get(field_name)
        flag = _as_typed(flag) if flag else flag
        _usage(f"chaos run: {flag + msg[len(field_name):] if flag else msg}")
    if name in _FAULT_WITHIN_LOAD and opts.fault_at_s >= opts.duration_s:
        # the fault came after the load had ended and the drill passed with nothing to measure (a fresh-user trial:
        # --fault-at 100 --duration 5 idled 95 s, then killed region A with no load, "availability 1.0", exit 0)
        _usage(f"chaos run: drill {name}: --fault-at {opts.fault_at_s:g} is not within the load's --duration "
               f"{opts.duration_s:g}: the fault would hit no request; give a --fault-at below --duration")
    if name == "soak":
        from chaos.faults import get_fault
        from chaos.soak import QUIET_TAIL_S, first_fault_s

        for fault in values["faults"] or ():  # an unknown name is said first, as the drill would say it
            try:
                get_fault(fault)
            except UnknownFault as exc:
                _usage(f"chaos run: --faults: {exc.args[0] if exc.args else exc}")

        first = first_fault_s(opts.fault_every_s)
        if opts.duration_s - QUIET_TAIL_S <= first:  # it ran, injected nothing and passed (a fresh-user trial)
            _usage(f"chaos run: drill soak: --duration {opts.duration_s:g} leaves no time for a fault: the first "
                   f"comes {first:g} s in (half --fault-every) and none in the last {QUIET_TAIL_S:g} s; give a --duration "
                   f"over {first + QUIET_TAIL_S:g} s or a shorter --fault-every")
    try:
        fig = _run(until_signal(fn(opts)))
    except StoppedBySignal as exc:
        typer.echo(f"drill {name}: stopped by {exc.args[0].name} (its deployment is stopped; no figures for a run "
                   f"cut short)", err=True)
        raise typer.Exit(128 + exc.args[0]) from None
    except UnknownFault as exc:
        _usage(f"chaos run: --faults: {exc.args[0] if exc.args else exc}")
    except FaultUnavailable as exc:
        msg = str(exc)
        msg = msg[len(name) + 2:] if msg.startswith(f"{name}: ") else msg
        typer.echo(f"drill {name}: unavailable: {msg}", err=True)
        raise typer.Exit(3)
    except FaultError as exc:
        typer.echo(f"drill {name}: fault error: {exc}", err=True)
        raise typer.Exit(3)
    except Exception as exc:
        from inferbus.cluster import TopologyError
        from inferbus.supervisor import ChildStartError

        if isinstance(exc, (TopologyError, ChildStartError, TimeoutError)):
            typer.echo(f"drill {name}: the deployment did not start: {exc}", err=True)
            raise typer.Exit(3)
        raise
    d = fig.to_dict()
    extra = d.get("extra") or {}
    unavailable = {k: v[len(k) + 2:] if v.startswith(f"{k}: ") else v
                   for k, v in (extra.get("faults_unavailable") or {}).items()}
    if unavailable and not extra.get("faults"):  # a soak given only faults this target cannot inject: nothing ran
        # (it reported a clean pass, availability 1.0 and exit 0, with the reason only in its JSON; a fresh-user trial)
        typer.echo(f"drill {name}: unavailable: no fault it was given can run here: "
                   + "; ".join(f"{k}: {v}" for k, v in sorted(unavailable.items())), err=True)
        raise typer.Exit(3)
    if unavailable:
        typer.echo(f"drill {name}: not injected (unavailable here): "
                   + "; ".join(f"{k}: {v}" for k, v in sorted(unavailable.items())), err=True)
    if json_out:
        print(json.dumps(d, default=str))
    else:  # (None was printed as Python's "None" and a mapping as its repr on one line: a fresh-user trial)
        for k, v in d.items():
            shown = "-" if v is None else json.dumps(v, default=str) if isinstance(v, (dict, list, tuple)) else v
            typer.echo(f"{k:22s} {shown}")
    missed = name == "nats-node-loss" and not extra.get("connections_on_killed_server")
    if missed:  # a kill that no connection was on measured no reconnect, and passed (a fresh-user trial, --server A2)
        typer.echo(f"drill {name}: no connection was on {extra.get('killed_server')} when it was killed, so no "
                   f"reconnect was measured; leave --server out to kill the server the load client is on", err=True)
    bad = missed or d.get("wrong", 0) or (d.get("duplicates") or 0)
    availability = d.get("availability")
    short = min_availability is not None and isinstance(availability, (int, float)) and availability < min_availability
    if short:
        typer.echo(f"drill {name}: availability {availability} is under --min-availability {min_availability:g}",
                   err=True)
    # no request answered right measures no fault (a fresh-user trial: --timeout-s 1e-9 failed 2,000 of 2,000 and
    # exited 0); as bench fails a step that answered nothing
    nothing = not short and availability == 0 and (d.get("requests") or 0) > 0
    if nothing:
        typer.echo(f"drill {name}: no request was answered right ({d.get('requests')} sent), so nothing was measured: "
                   f"a --timeout-s too short for any answer, or a deployment that never served (see errors)", err=True)
    raise typer.Exit(1 if bad or short or nothing else 0)
