"""The soak loop shared by the node soak and the topology soak.

Steady checked load (a :class:`chaos.load.Driver` already running) while a fault is
injected every ``fault_every_s``, cycling through a list of fault names; each
fault is held for its hold time, healed, and recorded with its own window
figures. RSS of every process is sampled once a second by its own task (so a
long heal does not pause sampling) into a :class:`chaos.rss.RssSampler`.

A fault that cannot act on the target (:class:`chaos.faults.FaultUnavailable`,
e.g. ``model-swap``) is recorded once under ``unavailable`` with its reason and
skipped from then on; the cycle moves to the next name at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from hdrh.histogram import HdrHistogram

from .faults import Fault, FaultUnavailable
from .rss import RssSampler


async def sample_rss(sampler: RssSampler, pids: Callable[[], dict[str, int]], stop: asyncio.Event,
                     period_s: float = 1.0) -> None:
    """Sample ``pids()`` every ``period_s`` until ``stop`` is set (errors in ``pids`` skip a sample)."""
    while not stop.is_set():
        try:
            sampler.sample(pids())
        except Exception:
            pass
        try:
            await asyncio.wait_for(stop.wait(), period_s)
        except asyncio.TimeoutError:
            pass


QUIET_TAIL_S = 5.0
"""A soak injects no fault in its last this many seconds (the system is seen to settle)."""


def first_fault_s(fault_every_s: float) -> float:
    """When a soak's first fault comes, seconds after its load starts (half a period)."""
    return fault_every_s / 2


async def fault_cycle(load: asyncio.Task, cycle: list[str], inject: Callable[[str, int], Awaitable[Fault]],
                      hold_s: Callable[[str], float], *, fault_every_s: float, duration_s: float,
                      t_start: float, quiet_tail_s: float = QUIET_TAIL_S, on_healed=None,
                      stop_load: Callable[[], None] | None = None) -> tuple[list[dict], dict]:
    """Inject ``cycle[k % len]`` every ``fault_every_s`` (first at half a period) while ``load`` runs.

    Once every name of ``cycle`` has proved unavailable on the target, ``stop_load`` (the driver's ``stop``) ends
    the load at once: such a soak exits 3 (``inferbus chaos run``), and it ran its whole duration first (a fresh-user
    trial, 2026-12-05).

    Returns:
        ``(faults, unavailable)``: one dict per injected fault (``fault``, ``target``, ``t_s`` after
        ``t_start``, ``heal_s`` from injection until healed, ``t_inject`` / ``t_healed`` monotonic,
        ``info``), and ``{name: reason}`` for the names that could not act on the target.
    """
    faults: list[dict] = []
    unavailable: dict[str, str] = {}
    k = 0
    next_fault = t_start + first_fault_s(fault_every_s)
    while not load.done():
        now = time.monotonic()
        if now < next_fault:
            await asyncio.wait([load], timeout=min(next_fault - now, 1.0))
            continue
        if now - t_start >= duration_s - quiet_tail_s:
            await load
            break
        usable = [n for n in cycle if n not in unavailable]
        if not usable:
            if stop_load is not None:
                stop_load()
            await load
            break
        name = cycle[k % len(cycle)]
        k += 1
        if name in unavailable:
            continue
        try:
            fault = await inject(name, k)
        except FaultUnavailable as exc:
            unavailable[name] = str(exc)
            continue
        await asyncio.sleep(hold_s(name))
        err = None
        try:
            t_healed = await fault.heal()
        except Exception as exc:  # recorded; the soak goes on (the figures will show the damage)
            t_healed, err = time.monotonic(), f"{type(exc).__name__}: {exc}"
        rec = {"fault": name, "target": fault.target_id, "t_s": round(fault.t_inject - t_start, 1),
               "heal_s": round(t_healed - fault.t_inject, 2), "t_inject": fault.t_inject, "t_healed": t_healed,
               # the info's instants (``*_at``, monotonic) become seconds after the injection; its durations
               # (``swap_ms``...) stay as they are (a fresh-user trial: swap_ms -88741.0, the host's uptime)
               "info": {k_: (round(v - fault.t_inject, 3) if isinstance(v, float) and k_.endswith("_at") else v)
                        for k_, v in fault.info.items()}}
        if err:
            rec["heal_error"] = err
        if on_healed is not None:
            await on_healed(name, fault, rec)
        faults.append(rec)
        next_fault += fault_every_s
        while next_fault < time.monotonic():  # a heal that outlasted the period: skip, never bunch up
            next_fault += fault_every_s
    return faults, unavailable


def window_figures(records, faults: list[dict], settle_s: float = 2.0, executions=None) -> None:
    """Add per-fault load figures to each fault dict (in place): over requests scheduled from the
    injection until ``settle_s`` after the heal: ``requests``, ``failed``, ``wrong``, ``p99_ms``, and
    with ``executions`` (the driver's audit counter) ``duplicates``."""
    for f in faults:
        lo, hi = f["t_inject"], f["t_healed"] + settle_s
        rs = [r for r in records if lo <= r.t_sched <= hi]
        if executions is not None:
            f["duplicates"] = sum(1 for r in rs if executions.get(r.request_id, 0) > 1)
        h = HdrHistogram(1, 600_000_000, 3)
        for r in rs:
            h.record_value(max(int((r.t_done - r.t_sched) * 1e6), 1))
        f["requests"] = len(rs)
        f["failed"] = sum(1 for r in rs if r.outcome not in ("ok", "wrong"))
        f["wrong"] = sum(1 for r in rs if r.outcome == "wrong")
        f["p99_ms"] = h.get_value_at_percentile(99) / 1000 if rs else None


def p99_ms_in_windows(records, faults: list[dict], settle_s: float = 2.0) -> float | None:
    """p99 latency (ms) over the requests scheduled inside any fault's window (see :func:`window_figures`)."""
    h = HdrHistogram(1, 600_000_000, 3)
    for r in records:
        if any(f["t_inject"] <= r.t_sched <= f["t_healed"] + settle_s for f in faults):
            h.record_value(max(int((r.t_done - r.t_sched) * 1e6), 1))
    return h.get_value_at_percentile(99) / 1000 if h.get_total_count() else None


def strip_times(faults: list[dict]) -> list[dict]:
    """The fault dicts without their monotonic stamps (for JSON output)."""
    return [{k: v for k, v in f.items() if k not in ("t_inject", "t_healed")} for f in faults]
