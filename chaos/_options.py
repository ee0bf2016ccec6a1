"""Range checks of the drills' options (:class:`~chaos.node_drills.DrillOptions`,
:class:`~chaos.region_drills.RegionDrillOptions`): ``inferbus chaos run`` turns the ``ValueError`` into a one-line
usage error (exit 2) before anything starts."""

from __future__ import annotations

import math

from inferbus._limits import (MAX_DRILL_PROCESSES, MAX_DRILL_RATE_QPS, MAX_GATEWAY_LATENCY_MS, MAX_PERIOD_S, interval,
                              number_as_typed)
from inferbus.bus._headers import MAX_TIMEOUT_MS

MAX_DURATION_S = float(MAX_PERIOD_S)
"""The longest drill or soak, seconds (a day)."""
MAX_TIMEOUT_S = MAX_TIMEOUT_MS / 1000.0
"""The longest per-request budget, seconds: what the ingress accepts (``Inferbus-Timeout-Ms`` up to
:data:`inferbus.bus._headers.MAX_TIMEOUT_MS`); a drill given more sent every request with a budget each ingress
refused (INVALID_ARGUMENT), after starting its deployment."""
MAX_RATE_QPS = MAX_DRILL_RATE_QPS
"""The highest offered load, requests/s."""
MAX_PROCESSES = MAX_DRILL_PROCESSES
"""The most worker or ingress processes a drill starts."""
MAX_LATENCY_MS = MAX_GATEWAY_LATENCY_MS
"""The most gateway latency or jitter a region drill injects, ms each way."""


def check_seconds(name: str, value: float, *, zero_ok: bool = False, max_s: float = MAX_DURATION_S) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a finite number of seconds in (0, ``max_s``]
    ([0, ``max_s``] with ``zero_ok``)."""
    check_number(name, value, 0.0, max_s, zero_ok, "seconds")


def check_rate(name: str, value: float) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite rate in (0, :data:`MAX_RATE_QPS`] requests/s."""
    check_number(name, value, 0.0, MAX_RATE_QPS, False, "requests/s")


def check_count(name: str, value: int, *, minimum: int = 1) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer in [``minimum``, :data:`MAX_PROCESSES`]."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_PROCESSES:
        raise ValueError(f"{name} must be an integer in {interval(minimum, MAX_PROCESSES)}, got {value!r}")


def check_number(name: str, value: float, lo: float, hi: float, lo_ok: bool, unit: str) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a finite number in (``lo``, ``hi``] ([``lo``, ``hi``]
    with ``lo_ok``), in ``unit``; the message names both ends as every refusal of the CLI does
    (:func:`~inferbus._limits.interval`: ``in (0, 86400] seconds``) and gives ``value`` as
    :func:`~inferbus._limits.number_as_typed` writes it (``got 0``, as typed, not ``got 0.0``)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value >= lo if lo_ok else value > lo) and value <= hi
    if not ok:
        raise ValueError(f"{name} must be in {interval(lo, hi, lo_open=not lo_ok)} {unit}, "
                         f"got {number_as_typed(value)}")
