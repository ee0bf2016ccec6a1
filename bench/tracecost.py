"""Serving-thread CPU of OpenTelemetry tracing per request (``inferbus up --trace-otlp-endpoint``), in one process.

    python -m bench.tracecost [--requests 20000]      # needs the otel extra: pip install -e '.[otel]'

Calls :class:`inferbus.actors._tracing.Tracing` as the actors do, with a no-op exporter behind the SDK's
BatchSpanProcessor (its thread runs, nothing is sent), and reports this thread's CPU (``time.thread_time``) per
request for: a sampled request before its answer (``begin``: the sampling decision and the span's ids, and
``forward_lines``: the forward's ``traceparent``), with and without a client ``traceparent``; the same request after
its answer (``worker_span`` and ``end``: both SDK spans made and queued); and an unsampled request (a ``-00``
``traceparent``; none at ratio 0). docs/performance.md, "OpenTelemetry tracing, off and on", has figures; the cost
of tracing off is counted by ``python -m bench.pathcost --bytecodes``.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace


def measure(n: int) -> dict[str, float]:
    """µs of this thread's CPU per request for each case above (``n`` requests each, after ``n // 10`` of warm-up)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from inferbus.actors._tracing import Tracing

    class Null(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    out: dict[str, float] = {}
    tr = Tracing("http://127.0.0.1:9/v1/traces", 1.0, "bench", exporter=Null())
    sampled = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    stages = {"decode": 10, "validate": 5, "cache": 3, "route": 7, "ingress_total": 25}

    def before(h):
        t = tr.begin(h, time.monotonic())
        tr.forward_lines(t, "Content-Type: application/msgpack\r\n")
        return t

    def after(t):
        job = SimpleNamespace(model_key="digits:1", t_recv=t.t0, inline=True, local=True, forward_hop_us=3, rid=None,
                              timings={"queue": 1, "worker_decode": 0, "compute": 30, "encode": 5,
                                       "worker_total": 40})
        tr.worker_span(t, job, SimpleNamespace(ok=True, code=""), "w0", time.monotonic())
        tr.end(t, time.monotonic(), "digits:1", "miss", "i0", worker_id="w0", stages=stages)

    for h, label in ((sampled, "sampled_traceparent"), ({}, "no_traceparent")):
        for _ in range(n // 10):
            after(before(h))
        c0 = time.thread_time()
        ts = [before(h) for _ in range(n)]
        c1 = time.thread_time()
        for t in ts:
            after(t)
        c2 = time.thread_time()
        out[f"{label}_before_answer_us"] = (c1 - c0) / n * 1e6
        out[f"{label}_after_answer_us"] = (c2 - c1) / n * 1e6
    tr.close(5.0)
    for ratio, h, label in ((1.0, {"traceparent": sampled["traceparent"][:-2] + "00"}, "unsampled_traceparent_us"),
                            (0.0, {}, "ratio_0_no_traceparent_us")):
        t2 = Tracing("http://127.0.0.1:9/v1/traces", ratio, "bench", exporter=Null())
        c0 = time.thread_time()
        for _ in range(n):
            t2.begin(h, 0.0)
        out[label] = (time.thread_time() - c0) / n * 1e6
        t2.close(5.0)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tracecost", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20000, help="requests per case (default 20000)")
    a = p.parse_args(argv)
    if a.requests < 10:
        p.error(f"--requests must be at least 10, got {a.requests}")
    for k, v in measure(a.requests).items():
        print(f"{k:40s} {v:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
