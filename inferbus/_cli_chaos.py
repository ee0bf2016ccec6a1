"""``inferbus chaos``: run failover drills by name (see :mod:`chaos.drills`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Failover drills: inject a fault under checked load and print the figures.")


@app.command("list")
def list_drills() -> None:
    """List the registered drills."""
    from chaos.drills import DRILLS

    for name in sorted(DRILLS):
        typer.echo(f"{name:18s} {DRILLS[name].summary}")


@app.command("run")
def run(
    name: str = typer.Argument(..., help="Drill name (inferbus chaos list)."),
    duration_s: Optional[float] = typer.Option(None, "--duration", help="Seconds of load (drill default if omitted)."),
    rate_qps: Optional[float] = typer.Option(None, "--rate", help="Offered load, requests/s."),
    timeout_s: Optional[float] = typer.Option(None, "--timeout", help="Per-request budget, seconds."),
    run_dir: Optional[Path] = typer.Option(None, help="Logs of the deployment the drill starts (default: temp)."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as one JSON object."),
) -> None:
    """Run one drill: it starts its own deployment on free ports, injects the fault, prints the figures."""
    from chaos.drills import UnknownDrill, get_drill, run_drill

    from .cli import _run

    try:
        get_drill(name)
    except UnknownDrill as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    fig = _run(run_drill(name, duration_s=duration_s, rate_qps=rate_qps, timeout_s=timeout_s,
                         run_dir=str(run_dir) if run_dir else None))
    d = fig.to_dict()
    if json_out:
        print(json.dumps(d, default=str))
    else:
        for k, v in d.items():
            typer.echo(f"{k:22s} {v}")
    bad = d.get("wrong", 0) or (d.get("duplicates") or 0)
    raise typer.Exit(1 if bad else 0)
