"""OpenTelemetry spans of sampled requests (``inferbus up --trace-otlp-endpoint URL``), exported over OTLP/HTTP.

Imported only by an actor whose config names an endpoint (``IngressConfig.trace_otlp_endpoint``,
``WorkerConfig.trace_otlp_endpoint``): without one no module of OpenTelemetry is loaded and the request path runs no
line of this file (the actors test ``self._tracing is not None`` once per request; docs/observability.md, "Tracing").

What is made (docs/observability.md has the attributes):

* the ingress: one SERVER span ``inferbus.infer <model>`` per sampled request, from its handler's start to the
  first completion of its forward (its worker's completion notice, or the colocated worker's return; of a hedged
  request, the copy that answered first, whose worker it names), a cache hit's reply or the error it answered; also for a request it shed (a full backlog, its stop), dropped unanswered or whose
  forward its sweeper gave up on, with ``inferbus.outcome`` (:data:`OUTCOMES`). Its parent is the client's
  ``traceparent`` (W3C Trace Context), else it starts a trace. The forward to the worker carries this span's id in its ``traceparent`` (the client's ``tracestate``
  kept);
* the worker: one CONSUMER span ``inferbus.worker <model>`` per sampled forward, child of that ingress span, from
  the worker's receipt to its reply's write (the colocated run-to-completion path builds it at the ingress, from
  the same stamps).

Spans are built after the fact, once the request's answer is written: the SDK span is made then, with the
``start_time`` of a stamp the actor took anyway (monotonic, turned into Unix ns), the stages it measured anyway
(``parameters.timings_us``) as attributes, and an ``end_time``. Before the answer, a sampled request costs only its
sampling decision and its ingress span's ids (random numbers, chosen before the span exists: the forward carries the
span id, and the provider's id generator, :class:`_ChosenIds`, hands the same ids to the SDK when the span is made).
The SDK's :class:`~opentelemetry.sdk.trace.export.BatchSpanProcessor` queues ended spans (at most
2,048; more are dropped, never waited for) and exports them from its own thread every
:data:`EXPORT_DELAY_MS` ms.

Sampling (W3C Trace Context, section 3.2.2.5, ``sampled`` flag; OpenTelemetry's ``ParentBased`` sampler): a request
with a valid ``traceparent`` follows its ``sampled`` flag (``-01`` traced, ``-00`` not, whatever the ratio); one
without is traced with probability ``ratio`` (``TraceIdRatioBased``: decided from the new trace id). An unsampled
request costs one header read and its ``traceparent`` is forwarded as it came, as without tracing.
"""

from __future__ import annotations

import atexit
import logging
import random
import threading
import time

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import (NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState,
                                 set_span_in_context)

from .._logs import OncePerPeriod
from .._version import __version__
from ..bus import headers as H
from ._common import log

INGRESS_SPAN = "inferbus.infer"
"""The ingress span's name, followed by a space and the model's name (``inferbus.infer digits``); alone for a
request whose subject names no model this ingress serves (span names stay of low cardinality)."""
WORKER_SPAN = "inferbus.worker"
"""The worker span's name, followed by a space and the model's name."""
EXPORT_DELAY_MS = 1000
"""The BatchSpanProcessor's export period (ms; the SDK's default is 5,000): a span reaches the collector within
about this long after its request ended, or earlier once 512 wait."""
EXIT_FLUSH_S = 0.5
"""At the process's exit, the spans still queued are exported for at most this long (s), then dropped: a collector
that is down or slow would otherwise hold the exit for the exporter's retries (the SDK's own exit hook waits up to
30 s; a node's stop kills an actor 5 s after SIGTERM)."""
INGRESS_STAGES = ("decode", "validate", "cache", "route")
"""The ingress's stages (``parameters.timings_us``) set on its span; they tile its time up to the forward
(``ingress_total``), so their sum is at most the span's duration."""
WORKER_STAGES = ("queue", "worker_decode", "compute", "between_chunks", "encode")
"""The worker's stages set on its span (those present); with ``publish`` (the reply's encode and write, measured for
the span) they tile the span."""
OUTCOMES = ("backlog_shed", "expired_unanswered", "attempt_abandoned", "stopping", "lost", "lost_in_reconnect",
            "lost_while_behind", "lost_while_busy", "lost_while_worker_behind")
"""The values of an ingress span's ``inferbus.outcome``, set only on a request the ingress shed before handling it
(``backlog_shed``: its backlog over ``--max-backlog-msgs``; ``stopping``: refused during the ingress's stop), dropped
without an answer (``expired_unanswered``: past its client's deadline, ``attempt_abandoned``: an SDK attempt given up,
both behind a backlog of 64 or more), or whose forward's completion never came and the sweeper gave it up (``lost``,
or the neutral causes of ``lost_*``, the ingress's counters of the same names). Every other span has none."""
_TRACE_NAMES = frozenset((H.TRACEPARENT, H.TRACESTATE))
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_EMPTY = Context()


OFFSET_REFRESH_S = 10.0
"""How often (s) the offset between the wall clock and the monotonic one is measured again (a wall clock stepped or
slewed by NTP is followed within this long)."""
_offset = [0, float("-inf")]  # [Unix ns − monotonic ns, when measured (monotonic s)]


def _measure_offset() -> int:
    """Unix ns − monotonic ns, read between two monotonic reads, the best of 5 (the closest pair): one read pair
    preempted between its two clocks would shift every span of the next :data:`OFFSET_REFRESH_S` by the delay (a
    worker span started before its ingress span's start on a busy 2-core box)."""
    best = None
    for _ in range(5):
        m1 = time.monotonic_ns()
        w = time.time_ns()
        m2 = time.monotonic_ns()
        if best is None or m2 - m1 < best[0]:
            best = (m2 - m1, w - (m1 + m2) // 2)
    return best[1]


def _clock_offset_ns() -> int:
    """Unix-epoch ns − ``time.monotonic()`` ns, measured at most :data:`OFFSET_REFRESH_S` ago: a span's monotonic
    stamps plus this are its OTLP timestamps. One value serves both ends of a span, so that its duration is the
    monotonic clock's, whatever the wall clock did meanwhile."""
    now = time.monotonic()
    if now - _offset[1] > OFFSET_REFRESH_S:
        _offset[0], _offset[1] = _measure_offset(), now
    return _offset[0]


def _ns(t_monotonic: float) -> int:
    return int(t_monotonic * 1e9)


class _ChosenIds(IdGenerator):
    """The provider's id generator: the ids set in :attr:`trace_id` / :attr:`span_id` just before a span is made
    (each used once), random ones otherwise (:class:`RandomIdGenerator`, the SDK's default). The event loop makes
    every span of the process, so nothing comes between the setting and the SDK's call."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_id = 0
        self._random = RandomIdGenerator()

    def generate_trace_id(self) -> int:
        v, self.trace_id = self.trace_id, 0
        return v or self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        v, self.span_id = self.span_id, 0
        return v or self._random.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return True  # (chosen ones are random too: _new_id)


def _new_id(bits: int) -> int:
    v = random.getrandbits(bits)
    while not v:
        v = random.getrandbits(bits)
    return v


class Traced:
    """A sampled request at its ingress before its span is made: the span's ids, its parent and its start.

    ``trace_id`` and ``span_id`` (ints, W3C Trace Context's 16 and 8 bytes) are those the span will have;
    ``parent`` is the client's span (a remote ``SpanContext``) or None for a new trace; ``tracestate`` the client's
    (forwarded as it came); ``t0`` the handler's start (monotonic s)."""

    __slots__ = ("trace_id", "span_id", "parent", "tracestate", "t0")

    def __init__(self, trace_id: int, span_id: int, parent, tracestate: str | None, t0: float) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent = parent
        self.tracestate = tracestate
        self.t0 = t0

    def traceparent(self) -> str:
        """The ``traceparent`` naming this span as the parent (version 00, sampled)."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"

    def context(self) -> Context:
        """A context whose span is this one (the parent of its worker span)."""
        return set_span_in_context(NonRecordingSpan(SpanContext(
            self.trace_id, self.span_id, is_remote=False, trace_flags=_SAMPLED,
            trace_state=TraceState.from_header([self.tracestate]) if self.tracestate else None)))


def _remote(traceparent: str, tracestate: str | None) -> SpanContext:
    """The client's span as a remote ``SpanContext`` from a valid, sampled ``traceparent`` (and its ``tracestate``)."""
    return SpanContext(int(traceparent[3:35], 16), int(traceparent[36:52], 16), is_remote=True, trace_flags=_SAMPLED,
                       trace_state=TraceState.from_header([tracestate]) if tracestate else None)


EXPORT_LOG_PERIOD_S = 30.0
"""While exports keep failing (the collector down), the OpenTelemetry SDK's loggers write one record per this many
seconds per logger; the next one says how many were left out."""
_EXPORT_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.sdk.trace.export",
                   "opentelemetry.exporter.otlp.common.http",
                   "opentelemetry.exporter.otlp.proto.http._common", "opentelemetry.sdk._shared_internal")
"""The SDK's and the OTLP/HTTP exporter's loggers: an export that fails logs a warning at every retry (about once a
second per actor with the collector down, a line per second in every actor's log of a node left running)."""


_OncePerPeriod = OncePerPeriod  # (moved to inferbus._logs: the node's waitress records use it too)


def _quiet_export_logs(period_s: float = EXPORT_LOG_PERIOD_S) -> None:
    """Put :class:`_OncePerPeriod` on each of :data:`_EXPORT_LOGGERS` (once per process)."""
    for name in _EXPORT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OncePerPeriod) for f in logger.filters):
            logger.addFilter(_OncePerPeriod(period_s))


class Tracing:
    """One process's tracer: an SDK :class:`TracerProvider` (sampler ``ParentBased(TraceIdRatioBased(ratio))``,
    resource ``service.name`` ``inferbus``, ``service.version``, ``service.instance.id`` the actor id) exporting to
    ``endpoint`` through a BatchSpanProcessor. Every method is called on the actor's event loop; none blocks (export
    is the processor's thread's).

    Args:
        endpoint: the OTLP/HTTP traces URL (``http://127.0.0.1:4318/v1/traces``), used as given.
        ratio: the head-sampling probability of a request without a ``traceparent``, in [0, 1].
        instance_id: the process's actor id (``service.instance.id``).
        exporter: another SpanExporter instead of OTLP/HTTP (tests, benchmarks); None: OTLP/HTTP.

    Raises:
        ValueError: ``ratio`` outside [0, 1].
    """

    def __init__(self, endpoint: str, ratio: float, instance_id: str, exporter: SpanExporter | None = None) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"trace ratio must be in [0, 1], got {ratio}")
        _quiet_export_logs()
        self.ratio = ratio
        root = TraceIdRatioBased(ratio)
        self._bound = root.bound  # the root sampler's rule, decided here before the span (the SDK decides the same)
        self._ids = _ChosenIds()
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": "inferbus", "service.version": __version__,
                                      "service.instance.id": instance_id}),
            sampler=ParentBased(root), id_generator=self._ids, shutdown_on_exit=False)
        self.processor = BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=endpoint),
                                            schedule_delay_millis=EXPORT_DELAY_MS)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("inferbus", __version__)
        atexit.register(self.close, EXIT_FLUSH_S)

    # ---- ingress ------------------------------------------------------------------------------
    def begin(self, headers: dict | None, t0: float) -> Traced | None:
        """The sampling decision of a request taken at ``t0`` (monotonic s): its :class:`Traced` (the ids of its
        ingress span-to-be) when sampled, else None (nothing else is done for it).

        A valid ``traceparent`` (names in any case, :func:`inferbus.bus.headers.trace_context`) decides by its
        ``sampled`` flag (W3C Trace Context, section 3.2.2.5); without one, a new trace id decides by the ratio
        (``TraceIdRatioBased``: its low 64 bits below ``ratio`` × 2^64)."""
        tp, ts = H.trace_context(headers) if headers else (None, None)
        if tp is None:
            trace_id = _new_id(128)
            if trace_id & TraceIdRatioBased.TRACE_ID_LIMIT >= self._bound:
                return None
            return Traced(trace_id, _new_id(64), None, None, t0)
        if not int(tp[53:55], 16) & 1:
            return None
        return Traced(int(tp[3:35], 16), _new_id(64), tp, ts, t0)

    @staticmethod
    def forward_lines(t: Traced, extra: str) -> str:
        """The forward's extra header lines ``extra`` (:func:`inferbus.actors._ingress._fwd_fields`) with their trace
        context replaced by ``t``'s: ``traceparent`` naming the ingress span as the parent, the client's
        ``tracestate`` kept (W3C Trace Context, section 3.3: a participant passes ``tracestate`` on)."""
        kept = "".join(line for line in extra.splitlines(keepends=True)
                       if line.split(":", 1)[0] not in _TRACE_NAMES)
        kept += f"{H.TRACEPARENT}: {t.traceparent()}\r\n"
        return kept + f"{H.TRACESTATE}: {t.tracestate}\r\n" if t.tracestate else kept

    def _start(self, name: str, parent: Context, kind: SpanKind, start_ns: int, trace_id: int, span_id: int):
        ids = self._ids
        ids.trace_id, ids.span_id = trace_id, span_id
        try:
            return self.tracer.start_span(name, parent, kind, start_time=start_ns)
        finally:
            ids.trace_id = ids.span_id = 0

    def end(self, t: Traced, t_end: float, model_key: str | None, cache: str, ingress_id: str, *,
            worker_id: str | None = None, stages: dict | None = None, code: str | None = None,
            message: str | None = None, request_id: str | None = None, outcome: str | None = None) -> None:
        """Make and end the ingress span of ``t``, from its ``t0`` to ``t_end`` (monotonic s), with its attributes:
        the model version (``model_key`` ``name:version``; None: no served model), the cache result ``cache``
        (``l1``, ``l2``, ``miss``), the worker that answered, the ingress's stages (µs, :data:`INGRESS_STAGES`), the
        request id, for an error answer its code (status ERROR, ``error.type``, the message as the status's
        description), and ``outcome`` (``inferbus.outcome``: why a request was shed or given up without a worker's
        answer, :data:`OUTCOMES`). Never raises: a span that cannot be made is logged and not made (the caller is
        settling the request)."""
        try:
            self._end(t, t_end, model_key, cache, ingress_id, worker_id, stages, code, message, request_id, outcome)
        except Exception as exc:
            log(f"tracing: the span of {model_key or 'a request'} not made: {exc!r}")

    def _end(self, t: Traced, t_end: float, model_key: str | None, cache: str, ingress_id: str,
             worker_id: str | None, stages: dict | None, code: str | None, message: str | None,
             request_id: str | None, outcome: str | None) -> None:
        name = model_key.partition(":")[0] if model_key else None
        parent = set_span_in_context(NonRecordingSpan(_remote(t.parent, t.tracestate))) if t.parent else _EMPTY
        off = _clock_offset_ns()
        span = self._start(f"{INGRESS_SPAN} {name}" if name else INGRESS_SPAN, parent, SpanKind.SERVER,
                           off + _ns(t.t0), t.trace_id, t.span_id)
        if not span.is_recording():
            return
        attrs = {"inferbus.ingress.id": ingress_id, "inferbus.cache.result": cache}
        if model_key:
            attrs["inferbus.model.name"] = name
            attrs["inferbus.model.version"] = model_key.partition(":")[2]
        if worker_id:
            attrs["inferbus.worker.id"] = worker_id
        if request_id:
            attrs["inferbus.request.id"] = request_id
        if stages:
            for k in INGRESS_STAGES:
                v = stages.get(k)
                if v is not None:
                    attrs[f"inferbus.timings_us.{k}"] = v
        if outcome:
            attrs["inferbus.outcome"] = outcome
        if code:
            attrs["error.type"] = code
            span.set_status(Status(StatusCode.ERROR, message or code))
        span.set_attributes(attrs)
        span.end(end_time=off + _ns(t_end))

    def error(self, headers: dict | None, t0: float, model_key: str | None, ingress_id: str, err,
              outcome: str | None = None) -> None:
        """The span of a request the ingress answered with the error ``err`` (an InferbusError) itself, or shed
        without an answer (``outcome`` says which, :data:`OUTCOMES`; ``err`` the error it would have had), from
        ``t0`` to now, if the request is sampled."""
        t = self.begin(headers, t0)
        if t is not None:
            self.end(t, time.monotonic(), model_key, "miss", ingress_id, code=err.code.value, message=err.message,
                     outcome=outcome)

    def failed(self, t: Traced, err, model_key: str, ingress_id: str, *, worker_id: str | None = None,
               stages: dict | None = None, request_id: str | None = None, outcome: str | None = None) -> None:
        """End the ingress span ``t`` of a forwarded request now, with the error ``err`` (an InferbusError) it was
        answered (or, with ``outcome`` ``lost``..., given up: the error its client sees by its own timeout)."""
        self.end(t, time.monotonic(), model_key, "miss", ingress_id, worker_id=worker_id, stages=stages,
                 code=err.code.value, message=err.message, request_id=request_id, outcome=outcome)

    def cached(self, headers: dict | None, t0: float, model_key: str, level: str, ingress_id: str) -> None:
        """The span of a request the ingress answered from its cache (``level`` ``l1``/``l2``), from ``t0`` to now,
        if the request is sampled."""
        t = self.begin(headers, t0)
        if t is not None:
            self.end(t, time.monotonic(), model_key, level, ingress_id)

    # ---- worker -------------------------------------------------------------------------------
    @staticmethod
    def worker_parent(headers: dict | None) -> tuple[str, str | None] | None:
        """The parent of a forwarded request's worker span: ``(traceparent, tracestate)`` of the forward (the
        ingress span's id) when it is valid and sampled, else None (nothing is traced: workers start no traces).
        Only read here; the SDK sees it when the span is made, after the answer."""
        tp, ts = H.trace_context(headers) if headers else (None, None)
        if tp is None or not int(tp[53:55], 16) & 1:
            return None
        return tp, ts

    def worker_span(self, parent, job, outcome, worker_id: str, t_end: float) -> None:
        """Make the worker span of ``job`` (:class:`~inferbus.actors._worker.Job`) answered with ``outcome``, child of
        ``parent`` (:meth:`worker_parent`'s pair, or the colocated ingress's :class:`Traced`), from its receipt
        (``job.t_recv``) to ``t_end`` (monotonic s, after the reply's write): the worker's stages
        (:data:`WORKER_STAGES`, µs), ``publish`` (the rest of the span after ``worker_total``: the reply's encode and
        write), ``forward_hop``, the execution (``inline``/``thread``) and forward kind (``local``/``bus``), and for
        an error answer its code (status ERROR; a copy cancelled before compute, a hedge's loser, has ``error.type``
        CANCELLED and no error status). Never raises: a span that cannot be made is logged and not made."""
        try:
            self._worker_span(parent, job, outcome, worker_id, t_end)
        except Exception as exc:
            log(f"tracing: the worker span of {job.model_key} not made: {exc!r}")

    def _worker_span(self, parent, job, outcome, worker_id: str, t_end: float) -> None:
        if type(parent) is Traced:
            ctx = parent.context()
        else:
            ctx = set_span_in_context(NonRecordingSpan(_remote(*parent)))
        name, _, version = job.model_key.partition(":")
        off = _clock_offset_ns()
        span = self._start(f"{WORKER_SPAN} {name}", ctx, SpanKind.CONSUMER, off + _ns(job.t_recv), 0, 0)
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
        span.end(end_time=off + _ns(t_end))

    def close(self, timeout_s: float) -> None:
        """Export what waits and stop the processor's thread, waiting at most ``timeout_s`` seconds (what is not
        exported by then is dropped: the export thread is a daemon). Called at the process's exit; once is enough
        (a second call returns at once)."""
        t = threading.Thread(target=self.provider.shutdown, name="inferbus-tracing-close", daemon=True)
        t.start()
        t.join(timeout_s)


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
