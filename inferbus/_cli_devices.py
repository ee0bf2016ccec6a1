"""``inferbus devices``: what accelerators are here and which backend would serve each (issue 4, item 3).

Discovery runs in a probe subprocess (:func:`inferbus.accelerators.discover_devices`),
so this command never holds a GPU context or GPU memory itself.
"""

from __future__ import annotations

import json
from typing import Optional

import typer


def devices(
    backends: Optional[str] = typer.Option(None, help="Only consider these backends (comma-separated), as "
                                           "`inferbus up --backends` would."),
    json_out: bool = typer.Option(False, "--json", help="Print the discovery and the worker plan as JSON."),
):
    """List GPUs, TPU chips and CPU slots found here, the backend that serves each and the worker plan.

    Exit status: 0 listed; 1 no plan for ``--backends``; 2 a ``--backends`` that names an unknown backend (one
    line, ``error: devices: --backends must each be one of onnxruntime, jax, tensorrt, got 'foo'``, as ``up``
    refuses it, before the probe), or the device probe failed or timed out: one line, ``error: devices: device probe
    failed (...): <its stderr on one line>``, as every command's usage error.
    """
    from rich.table import Table

    from ._limits import BACKENDS
    from .accelerators import BackendUnavailable, default_precision, discover_devices, plan_workers
    from ._wrap import FittedTable
    from .cli import _usage, console
    if backends and any(b.strip() not in BACKENDS for b in backends.split(",") if b.strip()):  # (it was a red
        # "plan for --backends foo: unknown backend 'foo'; ..." line on stdout after the probe, exit 1)
        _usage(f"devices: --backends must each be one of {', '.join(BACKENDS)}, got {backends!r}")
    try:
        disc = discover_devices()
    except BackendUnavailable as exc:  # its message ends with the probe's stderr (a traceback): one line of it
        _usage(f"devices: {' '.join(str(exc).split())}")
    chosen = tuple(b.strip() for b in backends.split(",") if b.strip()) if backends else None
    plan, plan_error = [], None
    if chosen:
        try:
            plan = plan_workers(chosen, disc)
        except BackendUnavailable as exc:
            plan_error = str(exc)
    if json_out:
        print(json.dumps({"discovery": disc.to_dict(), "plan": [
            {"backend": p.backend, "device_kind": p.device_kind, "device_index": p.device_index, "env": p.env}
            for p in plan], "plan_error": plan_error}, indent=2))
        raise typer.Exit(1 if plan_error else 0)
    t = Table()
    for col in ("kind", "device", "model", "memory", "served by", "default precision"):
        t.add_column(col)
    fitted = FittedTable(t, "devices", wrap_cells=True)  # a row's block: "gpu gpu0: model=... memory=..."
    for g in disc.gpus:
        mem = g.facts.get("memory_bytes")
        fitted.add_row("gpu", g.name, str(g.facts.get("model", "")), f"{mem / 2**30:.0f} GiB" if mem else "",
                       disc.serving("gpu", chosen), default_precision("gpu"), head_cells=2)
    for tp in disc.tpus:
        fitted.add_row("tpu", tp.name, str(tp.facts.get("model", "")), "", disc.serving("tpu", chosen),
                       default_precision("tpu"), head_cells=2)
    cpus = disc.cpus
    fitted.add_row("cpu", f"{len(cpus)} slots ({cpus[0]}..{cpus[-1]})" if cpus else "0 slots", "", "",
                   disc.serving("cpu", chosen), default_precision("cpu"), head_cells=2)
    console.print(fitted)
    jx = disc.jax
    console.print(f"jax: {jx['version'] + ' on ' + jx['platform'] if jx else disc.notes.get('jax', 'absent')}; "
                  f"tensorrt: {disc.tensorrt or disc.notes.get('tensorrt', 'absent')}; onnxruntime providers: "
                  f"{', '.join(disc.onnxruntime_providers)}")
    for k, v in disc.notes.items():
        if k not in ("jax", "tensorrt"):
            console.print(f"  {k}: {v}")
    if chosen:
        if plan_error:
            console.print(f"[red]plan for --backends {','.join(chosen)}[/]: {plan_error}")
            raise typer.Exit(1)
        console.print(f"worker plan for --backends {','.join(chosen)}: " +
                      ", ".join(f"{p.backend}:{p.device_kind}{p.device_index}" for p in plan))
