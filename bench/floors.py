"""The compute floor and CPU accounting for the suite.

* :func:`model_floor`: the model's in-process time with the worker's session
  options (ONNX Runtime via :class:`inferbus.accelerators.OnnxRuntimeBackend`),
  batch 1, HDR percentiles; plus the in-process cost of the same request's wire
  work (decode + tensor view + model + encode) for comparison with the hops.
* :class:`CpuSampler`: CPU time (user + system, from ``/proc/<pid>/stat``) of named
  groups of processes, so a step can report CPU µs per request for each actor kind.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hdrh.histogram import HdrHistogram

from inferbus.accelerators import OnnxRuntimeBackend
from inferbus.schemas import (
    InferRequest, InferResponse, decode_request, encode_request, encode_response, input_from_numpy, input_to_numpy,
    output_from_numpy,
)

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _summary(h: HdrHistogram) -> dict:
    return {"n": h.get_total_count(), "p50_us": h.get_value_at_percentile(50) / 10,
            "p99_us": h.get_value_at_percentile(99) / 10, "p99_9_us": h.get_value_at_percentile(99.9) / 10,
            "mean_us": round(h.get_mean_value() / 10, 2)}


def model_floor(path: Path, feeds: list[dict], *, seconds: float = 2.0) -> dict:
    """Time the model alone, and decode→model→encode in-process, batch 1, cycling through ``feeds``.

    Returns:
        ``{"model": {n, p50_us, p99_us, p99_9_us, mean_us}, "inproc_pipeline": {...}}``;
        values at 0.1 µs resolution.
    """
    sess = OnnxRuntimeBackend().load(path)
    for f in feeds[:50]:
        sess.infer(f)
    h = HdrHistogram(1, 600_000_000, 3)  # 0.1 µs units
    end = time.monotonic() + seconds / 2
    i = 0
    while time.monotonic() < end:
        f = feeds[i % len(feeds)]
        t0 = time.perf_counter()
        sess.infer(f)
        h.record_value(max(int((time.perf_counter() - t0) * 1e7), 1))
        i += 1
    bodies = [encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in f.items()])) for f in feeds[:512]]
    p = HdrHistogram(1, 600_000_000, 3)
    end = time.monotonic() + seconds / 2
    i = 0
    while time.monotonic() < end:
        body = bodies[i % len(bodies)]
        t0 = time.perf_counter()
        req = decode_request(body)
        arrays = {t.name: input_to_numpy(t, field="inputs") for t in req.inputs}
        out = sess.infer(arrays)
        encode_response(InferResponse(model_name="m", model_version="1",
                                      outputs=[output_from_numpy(k, v, raw=True) for k, v in out.items()]))
        p.record_value(max(int((time.perf_counter() - t0) * 1e7), 1))
        i += 1
    return {"model": _summary(h), "inproc_pipeline": _summary(p)}


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process in seconds; None when it is gone or /proc is absent."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


class CpuSampler:
    """CPU seconds used by named groups of processes between :meth:`mark` and :meth:`since`."""

    def __init__(self) -> None:
        self.groups: dict[str, list[int]] = {}
        self._mark: dict[str, float] = {}

    def add(self, group: str, pid: int | None) -> None:
        if pid:
            self.groups.setdefault(group, []).append(pid)

    def _now(self) -> dict[str, float]:
        out = {}
        for g, pids in self.groups.items():
            out[g] = sum(c for c in (cpu_seconds(p) for p in pids) if c is not None)
        return out

    def mark(self) -> None:
        self._mark = self._now()

    def since(self) -> dict[str, float]:
        """CPU seconds per group since the last :meth:`mark`."""
        now = self._now()
        return {g: round(now[g] - self._mark.get(g, 0.0), 3) for g in now}
