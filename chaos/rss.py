"""Resident-memory sampling for soaks: every process, every incarnation, and whether growth plateaued.

A soak calls :meth:`RssSampler.sample` with ``{name: pid}`` once a second (names are
stable across restarts: ``worker:n1-w0``, ``A/nats:A1``...). A restarted process
is a new *incarnation* (new pid) of the same name; growth is judged on the last
incarnation only, so a restart never reads as a leak or as a cure.

Plateau rule (:meth:`RssSampler.summary`): over the last incarnation's samples,
the growth from the mean of its third quarter to the mean of its last quarter
must stay under ``max(plateau_pct % of the mean of its third quarter, plateau_kib)``
(defaults 2 % and 2048 KiB). A leak grows linearly, so its last quarter sits a
quarter of the run's growth above its third; a warm-up that levelled off does not.
Incarnations shorter than ``min_samples`` samples are reported but not judged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def rss_kib(pid: int) -> int | None:
    """Resident set size of ``pid`` in KiB (Linux /proc), None if gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class RssSampler:
    """RSS samples ``(t_mono, pid, kib)`` per process name."""

    plateau_pct: float = 2.0
    plateau_kib: int = 2048
    min_samples: int = 20
    samples: dict[str, list[tuple[float, int, int]]] = field(default_factory=dict)

    def sample(self, pids: dict[str, int]) -> None:
        """Record the RSS of every ``{name: pid}`` now (gone processes are skipped)."""
        now = time.monotonic()
        for name, pid in pids.items():
            kib = rss_kib(pid)
            if kib:
                self.samples.setdefault(name, []).append((now, pid, kib))

    def summary(self) -> dict[str, dict]:
        """Per name: ``first_kib``, ``last_kib``, ``max_kib``, ``incarnations``, ``samples`` (of the last
        incarnation), ``second_half_growth_kib`` (last incarnation: last minus first sample of its second
        half), ``last_quarter_growth_kib`` (mean of the last quarter minus mean of the third) and
        ``plateau`` (True / False by the module's rule, None when too few samples)."""
        out = {}
        for name, xs in self.samples.items():
            last_pid = xs[-1][1]
            inc = [k for _, pid, k in xs if pid == last_pid]
            half = inc[len(inc) // 2:]
            d = {"first_kib": xs[0][2], "last_kib": xs[-1][2], "max_kib": max(k for _, _, k in xs),
                 "incarnations": len({pid for _, pid, _ in xs}), "samples": len(inc),
                 "second_half_growth_kib": (half[-1] - half[0]) if len(half) > 1 else 0,
                 "last_quarter_growth_kib": None, "plateau": None}
            if len(inc) >= self.min_samples:
                q = len(inc) // 4
                third = sum(inc[2 * q:3 * q]) / q
                last = sum(inc[3 * q:]) / len(inc[3 * q:])
                growth = last - third
                d["last_quarter_growth_kib"] = round(growth)
                d["plateau"] = growth < max(third * self.plateau_pct / 100, self.plateau_kib)
            out[name] = d
        return out

    def verdict(self) -> dict:
        """``{"judged": n, "plateaued": n, "growing": [names]}`` over :meth:`summary`."""
        s = self.summary()
        judged = {n: d for n, d in s.items() if d["plateau"] is not None}
        return {"judged": len(judged), "plateaued": sum(1 for d in judged.values() if d["plateau"]),
                "growing": sorted(n for n, d in judged.items() if not d["plateau"])}
