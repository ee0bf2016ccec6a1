"""CPU lists: the Linux ``cpuset``/``taskset -c`` notation (``11-15``, ``0,2,8-11``) for the options that place
processes on cores (``inferbus up --nats-cpus``, ``bench.suite --nats-cpus``)."""

from __future__ import annotations

import os
import re

_PART = re.compile(r"([0-9]+)(?:-([0-9]+))?", re.ASCII)
"""One part of a CPU list: a core or an inclusive range, ASCII digits only, no spaces or signs (as ``taskset -c``)."""


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The cores a CPU list names, sorted, each once: comma-separated cores and inclusive ranges, as
    ``cpuset(7)`` writes them (``11-15``, ``0,2,8-11``).

    Raises:
        ValueError: a part that is not a core number or a ``low-high`` range with ``low <= high``, an empty list,
            or a core this process may not run on (:func:`usable_cores`); the message says which.
    """
    usable = usable_cores()
    cores: set[int] = set()
    for part in str(text).split(","):
        m = _PART.fullmatch(part)
        if m is None:
            raise ValueError(f"must be a CPU list (e.g. 11-15 or 0,2,8-11), got {text!r}")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        if b < a:
            raise ValueError(f"must be a CPU list whose ranges run from a core to a later one, got {part!r}")
        if b > usable[-1] or a < usable[0]:  # before the range is made: 0-99999999999 is refused at once
            raise ValueError(f"must be cores this process may run on ({cores_text(usable)}), got {text!r}")
        cores.update(range(a, b + 1))
    if not cores <= set(usable):
        raise ValueError(f"must be cores this process may run on ({cores_text(usable)}), got {text!r}")
    return tuple(sorted(cores))


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (its CPU affinity, which a cgroup cpuset or ``taskset`` may narrow from
    the host's), sorted; every core of ``os.cpu_count()`` where affinity is not available."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return tuple(range(os.cpu_count() or 1))


def cores_text(cores) -> str:
    """Cores in CPU-list notation, ranges folded: ``(0, 1, 2, 5)`` → ``"0-2,5"``; ``""`` for none."""
    runs: list[list[int]] = []
    for c in sorted(set(cores)):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def cores_phrase(cores) -> str:
    """``core 1`` or ``cores 0-2,5``: :func:`cores_text` after the right noun."""
    text = cores_text(cores)
    return f"core {text}" if text.isdigit() else f"cores {text}"
