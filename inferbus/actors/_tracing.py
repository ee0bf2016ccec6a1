"""OpenTelemetry spans of sampled requests (``inferbus up --trace-otlp-endpoint URL``), exported over OTLP/HTTP.

Imported only by an actor whose config names an endpoint (``IngressConfig.trace_otlp_endpoint``,
``WorkerConfig.trace_otlp_endpoint``): without one no module of OpenTelemetry is loaded and the request path runs no
line of this file (the actors test ``self._tracing is not None`` once per request; docs/observability.md, "Tracing").

What is made (docs/observability.md has the attributes):

* the ingress: one SERVER span ``inferbus.infer <model>`` per sampled request, from its handler's start to the
  first completion of its forward (its worker's completion notice, or the colocated worker's return), a cache hit's
  reply or the error it answered. Its parent is the client's ``traceparent`` (W3C Trace Context), else it starts a
  trace. The forward to the worker carries this span's id in its ``traceparent`` (the client's ``tracestate``
  kept);
* the worker: one CONSUMER span ``inferbus.worker <model>`` per sampled forward, child of that ingress span, from
  the worker's receipt to its reply's write (the colocated run-to-completion path builds it at the ingress, from
  the same stamps).

Spans are built after the fact: started with the ``start_time`` of a stamp the actor took anyway (monotonic, turned
into Unix ns), given the stages it measured anyway (``parameters.timings_us``) as attributes, and ended with an
``end_time``. The SDK's :class:`~opentelemetry.sdk.trace.export.BatchSpanProcessor` queues ended spans (at most
2,048; more are dropped, never waited for) and exports them from its own thread every
:data:`EXPORT_DELAY_MS` ms.

Sampling (W3C Trace Context, section 3.2.2.5, ``sampled`` flag; OpenTelemetry's ``ParentBased`` sampler): a request
with a valid ``traceparent`` follows its ``sampled`` flag (``-01`` traced, ``-00`` not, whatever the ratio); one
without is traced with probability ``ratio`` (``TraceIdRatioBased``: decided from the new trace id). An unsampled
request costs one header read and its ``traceparent`` is forwarded as it came, as without tracing.
"""

from __future__ import annotations

import time

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .._version import __version__
from ..bus import headers as H

INGRESS_SPAN = "inferbus.infer"
"""The ingress span's name, followed by a space and the model's name (``inferbus.infer digits``); alone for a
request whose subject names no model this ingress serves (span names stay of low cardinality)."""
WORKER_SPAN = "inferbus.worker"
"""The worker span's name, followed by a space and the model's name."""
EXPORT_DELAY_MS = 1000
"""The BatchSpanProcessor's export period (ms; the SDK's default is 5,000): a span reaches the collector within
about this long after its request ended, or earlier once 512 wait."""
INGRESS_STAGES = ("decode", "validate", "cache", "route")
"""The ingress's stages (``parameters.timings_us``) set on its span; they tile its time up to the forward
(``ingress_total``), so their sum is at most the span's duration."""
WORKER_STAGES = ("queue", "worker_decode", "compute", "between_chunks", "encode")
"""The worker's stages set on its span (those present); with ``publish`` (the reply's encode and write, measured for
the span) they tile the span."""
_TRACE_NAMES = frozenset((H.TRACEPARENT, H.TRACESTATE))
_EMPTY = Context()


def _unix_ns(t_monotonic: float) -> int:
    """``time.monotonic()`` seconds as Unix-epoch nanoseconds (the OTLP timestamps), by the offset between the two
    clocks now."""
    return time.time_ns() - time.monotonic_ns() + int(t_monotonic * 1e9)


def _sampled(traceparent: str) -> bool:
    """The ``sampled`` bit of a valid ``traceparent``'s flags (W3C Trace Context, section 3.2.2.5)."""
    return bool(int(traceparent[53:55], 16) & 1)


class Tracing:
    """One process's tracer: an SDK :class:`TracerProvider` (sampler ``ParentBased(TraceIdRatioBased(ratio))``,
    resource ``service.name`` ``inferbus``, ``service.instance.id`` the actor id) exporting to ``endpoint`` through
    a BatchSpanProcessor. Every method is called on the actor's event loop and never raises for a request's sake
    (a span that cannot be made is not made); none blocks (export is the processor's thread's).

    Args:
        endpoint: the OTLP/HTTP traces URL (``http://127.0.0.1:4318/v1/traces``), used as given.
        ratio: the head-sampling probability of a request without a ``traceparent``, in [0, 1].
        instance_id: the process's actor id (``service.instance.id``).
        exporter: another SpanExporter instead of OTLP/HTTP (tests of this module); None: OTLP/HTTP.

    Raises:
        ValueError: ``ratio`` outside [0, 1].
    """

    def __init__(self, endpoint: str, ratio: float, instance_id: str, exporter: SpanExporter | None = None) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"trace ratio must be in [0, 1], got {ratio}")
        self.ratio = ratio
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": "inferbus", "service.version": __version__,
                                      "service.instance.id": instance_id}),
            sampler=ParentBased(TraceIdRatioBased(ratio)))
        self.processor = BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=endpoint),
                                            schedule_delay_millis=EXPORT_DELAY_MS)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("inferbus", __version__)
        self._prop = TraceContextTextMapPropagator()

    # ---- reading a request's trace context -----------------------------------------------------
    def _parent(self, headers: dict | None) -> Context | None:
        """The parent context of a request from its ``traceparent``/``tracestate`` (names in any case, as
        :func:`inferbus.bus.headers.trace_lines` reads them): an empty context (a new trace) when it has no valid
        ``traceparent``, None when its ``traceparent`` is not sampled (nothing is traced)."""
        tp, ts = H.trace_context(headers) if headers else (None, None)
        if tp is None:
            return _EMPTY
        if not _sampled(tp):
            return None
        return self._prop.extract({H.TRACEPARENT: tp, H.TRACESTATE: ts} if ts else {H.TRACEPARENT: tp})

    # ---- ingress ------------------------------------------------------------------------------
    def start(self, headers: dict | None, t0: float, model: str | None):
        """The ingress span of a request taken at ``t0`` (monotonic s) for ``model`` (None: no served model), started
        at ``t0`` when the request is sampled; None when it is not (nothing else to do for it)."""
        parent = self._parent(headers)
        if parent is None or (parent is _EMPTY and self.ratio <= 0.0):
            return None
        span = self.tracer.start_span(f"{INGRESS_SPAN} {model}" if model else INGRESS_SPAN, parent, SpanKind.SERVER,
                                      start_time=_unix_ns(t0))
        return span if span.is_recording() else None

    def forward_lines(self, span, extra: str) -> str:
        """The forward's extra header lines ``extra`` (:func:`inferbus.actors._ingress._fwd_fields`) with their trace
        context replaced by ``span``'s: ``traceparent`` naming the ingress span as the parent, the client's
        ``tracestate`` kept (W3C Trace Context, section 3.5: a participant forwards ``tracestate``)."""
        carrier: dict[str, str] = {}
        self._prop.inject(carrier, set_span_in_context(span))
        kept = "".join(line for line in extra.splitlines(keepends=True)
                       if line.split(":", 1)[0] not in _TRACE_NAMES)
        return kept + "".join(f"{k}: {v}\r\n" for k, v in carrier.items())

    def end(self, span, t_end: float, model_key: str | None, cache: str, ingress_id: str, *,
            worker_id: str | None = None, stages: dict | None = None, code: str | None = None,
            message: str | None = None, request_id: str | None = None) -> None:
        """End the ingress span ``span`` at ``t_end`` (monotonic s) with its attributes: the model version
        (``model_key`` ``name:version``), the cache result ``cache`` (``l1``, ``l2``, ``miss``), the worker that
        answered, the ingress's stages (µs, :data:`INGRESS_STAGES`), and for an error answer its code (status
        ERROR, ``error.type``, the message as the status's description)."""
        attrs = {"inferbus.ingress.id": ingress_id, "inferbus.cache.result": cache}
        if model_key:
            name, _, version = model_key.partition(":")
            attrs["inferbus.model.name"] = name
            attrs["inferbus.model.version"] = version
        if worker_id:
            attrs["inferbus.worker.id"] = worker_id
        if request_id:
            attrs["inferbus.request.id"] = request_id
        if stages:
            for k in INGRESS_STAGES:
                v = stages.get(k)
                if v is not None:
                    attrs[f"inferbus.timings_us.{k}"] = v
        if code:
            attrs["error.type"] = code
            span.set_status(Status(StatusCode.ERROR, message or code))
        span.set_attributes(attrs)
        span.end(end_time=_unix_ns(t_end))

    def error(self, headers: dict | None, t0: float, model_key: str | None, ingress_id: str, err) -> None:
        """The span of a request the ingress answered with the error ``err`` (an InferbusError) itself, from ``t0``
        to now, if the request is sampled."""
        span = self.start(headers, t0, model_key.partition(":")[0] if model_key else None)
        if span is not None:
            self.end(span, time.monotonic(), model_key, "miss", ingress_id, code=err.code.value, message=err.message)

    def cached(self, headers: dict | None, t0: float, model_key: str, level: str, ingress_id: str) -> None:
        """The span of a request the ingress answered from its cache (``level`` ``l1``/``l2``), from ``t0`` to now,
        if the request is sampled."""
        span = self.start(headers, t0, model_key.partition(":")[0])
        if span is not None:
            self.end(span, time.monotonic(), model_key, level, ingress_id)

    # ---- worker -------------------------------------------------------------------------------
    def worker_parent(self, headers: dict | None) -> Context | None:
        """The parent of a forwarded request's worker span (its ``traceparent``, the ingress span's id), None when the
        forward carries no sampled ``traceparent`` (nothing is traced: workers start no traces)."""
        parent = self._parent(headers)
        return None if parent is _EMPTY else parent

    @staticmethod
    def local_parent(span) -> Context:
        """The parent context of the worker span of a request its colocated ingress (span ``span``) handed over."""
        return set_span_in_context(span)

    def worker_span(self, parent, job, outcome, worker_id: str, t_end: float) -> None:
        """Make the worker span of ``job`` (:class:`~inferbus.actors._worker.Job`) answered with ``outcome``, child of
        ``parent`` (a ``Context``, or the colocated ingress's span), from its receipt (``job.t_recv``) to ``t_end`` (monotonic s, after the reply's write): the
        worker's stages (:data:`WORKER_STAGES`, µs), ``publish`` (the rest of the span after ``worker_total``: the
        reply's encode and write), ``forward_hop``, the execution (``inline``/``thread``) and forward kind
        (``local``/``bus``), and for an error answer its code (status ERROR; a copy cancelled before compute, a
        hedge's loser, has ``error.type`` CANCELLED and no error status)."""
        if not isinstance(parent, Context):  # the colocated ingress's span
            parent = set_span_in_context(parent)
        name, _, version = job.model_key.partition(":")
        span = self.tracer.start_span(f"{WORKER_SPAN} {name}", parent, SpanKind.CONSUMER,
                                      start_time=_unix_ns(job.t_recv))
        if not span.is_recording():
            return
        attrs = {"inferbus.worker.id": worker_id, "inferbus.model.name": name, "inferbus.model.version": version,
                 "inferbus.exec": "inline" if job.inline else "thread",
                 "inferbus.forward": "local" if job.local else "bus"}
        timings = job.timings
        if type(timings) is dict and "worker_total" in timings:
            for k in WORKER_STAGES:
                v = timings.get(k)
                if v is not None:
                    attrs[f"inferbus.timings_us.{k}"] = v
            total = timings["worker_total"]
            attrs["inferbus.timings_us.worker_total"] = total
            attrs["inferbus.timings_us.publish"] = max(int((t_end - job.t_recv) * 1e6) - total, 0)
        if job.forward_hop_us >= 0:
            attrs["inferbus.timings_us.forward_hop"] = job.forward_hop_us
        if job.rid:
            attrs["inferbus.request.id"] = job.rid
        if not outcome.ok:
            attrs["error.type"] = outcome.code or "INTERNAL"
            if outcome.code != "CANCELLED":
                span.set_status(Status(StatusCode.ERROR, outcome.code or "error"))
        span.set_attributes(attrs)
        span.end(end_time=_unix_ns(t_end))

    def shutdown(self) -> None:
        """Export what waits and stop the processor's thread (blocks up to its export timeout)."""
        self.provider.shutdown()


_SHARED: dict[tuple[str, float], Tracing] = {}


def tracing_for(endpoint: str, ratio: float, instance_id: str) -> Tracing:
    """The process's :class:`Tracing` for ``endpoint`` and ``ratio``, made by the first actor that asks (its id is the
    resource's ``service.instance.id``): a colocated ingress and worker share one provider and one export thread.

    Raises:
        ValueError: ``ratio`` outside [0, 1].
    """
    key = (endpoint, ratio)
    t = _SHARED.get(key)
    if t is None:
        t = _SHARED[key] = Tracing(endpoint, ratio, instance_id)
    return t
