"""Typed configuration of each actor process, validated once and passed explicitly.

Each record round-trips through JSON (``to_json`` / ``from_json``) because the
node supervisor hands it to a child process on its command line.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from .._limits import (MAX_BACKLOG_BYTES, MAX_BACKLOG_MSGS, MAX_BYTES_ELEMENTS, MAX_CHUNK_ROWS, MAX_COUNT,
                       MAX_HEALTH_WINDOW_S, MAX_INLINE_COMPUTE_US, MAX_L2_POOL_SIZE, MAX_MAILBOX_SIZE,
                       MAX_MAX_PAYLOAD_BYTES, MAX_PERIOD_S, MAX_TENSOR_BYTES, interval)
from ..bus import BusConfig
from ..bus import headers as H
from ..bus._busypoll import check_busy_poll_us


_INF = float("inf")
MIN_HEALTH_TIMEOUT_S = 0.5
"""The shortest ``health_timeout_s``: five of the workers' load-report periods (``WorkerConfig.report_interval_ms``,
100 ms). Shorter, the workers read as silent between two reports and every request is refused or waits (a
fresh-user trial: ``up --health-timeout-s 1e-9`` hung 60 s in its start and said only "not ready")."""
MAX_HEALTH_TIMEOUT_S = 86_400.0
"""The longest ``health_timeout_s`` (a day): a worker silent longer is gone for any purpose."""
RATE_FIELDS = (("rate_limit_per_s", "rate_burst"), ("client_rate_limit_per_s", "client_rate_burst"))
"""(rate, burst) option pairs of :class:`IngressConfig`: the global and the per-client token bucket."""


def _require(ok: bool, field: str, rule: str, value) -> None:
    """Raise ``ValueError("<field> must be <rule>, got <value>")`` unless ``ok`` (one field per message, the
    value as given: ``inferbus up`` shows it with the field's option name; a range with two ends names both, as
    :func:`inferbus._limits.interval` writes it)."""
    if not ok:
        raise ValueError(f"{field} must be {rule}, got {value}")


def check_trace(endpoint: str | None, ratio: float, owner: str) -> None:
    """Validate the tracing fields of ``owner`` (``trace_otlp_endpoint``, ``trace_ratio``).

    Raises:
        ValueError: an endpoint that is not an ``http://`` or ``https://`` URL with a host (OTLP/HTTP, the
            OpenTelemetry protocol specification's "OTLP/HTTP"), or a ratio that is not a number in [0, 1].
    """
    if endpoint is not None:
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(endpoint)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:
            ok = False
        _require(ok, f"{owner}.trace_otlp_endpoint", "an http:// or https:// URL (OTLP/HTTP, e.g. "
                 "http://127.0.0.1:4318/v1/traces)", endpoint)
    _require(not isinstance(ratio, bool) and isinstance(ratio, (int, float)) and 0.0 <= ratio <= 1.0,
             f"{owner}.trace_ratio", "in [0, 1]", ratio)


def check_rate_limits(owner: str, options: dict) -> None:
    """Validate the rate-limit options in ``options`` (any subset of :data:`RATE_FIELDS`' names).

    A rate is requests per second, a burst a bucket capacity in requests; 0 means off (rate) or one
    second of the rate (burst).

    Raises:
        ValueError: a rate not in [0, :data:`~inferbus._limits.MAX_COUNT`] requests/s, a burst neither 0 nor in
            [1, ``MAX_COUNT``] requests (a bucket must hold one request), or a burst given without its rate. The
            message names ``owner`` and the field.
    """
    for rate_name, burst_name in RATE_FIELDS:
        for name, rule in ((rate_name, f"in {interval(0, MAX_COUNT)} requests/s (0 = off)"),
                           (burst_name, f"0 (one second of the rate) or in {interval(1, MAX_COUNT)} requests")):
            v = options.get(name, 0.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= MAX_COUNT \
                    or (name == burst_name and 0.0 < v < 1.0):  # (NaN fails the comparison)
                raise ValueError(f"{owner}.{name} must be {rule}, got {v!r}")
        rate, burst = options.get(rate_name, 0.0), options.get(burst_name, 0.0)
        if burst and not rate:
            raise ValueError(f"{owner}.{burst_name} is set but {rate_name} is 0 (no limit): set the rate too")


def _from_dict(cls, d: dict):
    d = dict(d)
    for key in ("bus", "lease_bus"):
        if key in d and isinstance(d[key], dict):
            d[key] = BusConfig.from_dict(d[key])
    names = {f.name for f in fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {', '.join(sorted(unknown))}; allowed: "
                         f"{', '.join(sorted(names))}")
    for f in fields(cls):
        if f.name in d and isinstance(d[f.name], list) and f.type.startswith("tuple"):
            d[f.name] = tuple(d[f.name])
    return cls(**d)


class _JsonMixin:
    def to_json(self) -> str:
        d = asdict(self)  # type: ignore[call-overload]
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str):
        return _from_dict(cls, json.loads(text))


@dataclass(frozen=True)
class WorkerConfig(_JsonMixin):
    """One worker process: one device slot, its models, its mailbox."""

    worker_id: str
    bus: BusConfig
    models_dir: str
    models: tuple[str, ...] = ()
    """Model names to load (empty = every model in the repository)."""
    pins: dict[str, str] = field(default_factory=dict)
    """``"name:version"`` → ``"sha256:<hex>"``: the digests of the versions' files when the node first loaded them
    (:mod:`inferbus.actors._pinning`). A version pinned here is served only if its files still have that digest; a
    version on disk not pinned here (added after start) is not loaded at start. Empty = nothing pinned (every version
    on disk is loaded, as read)."""
    configs: dict[str, dict] = field(default_factory=dict)
    """Model name → its ``config.json`` keys as the node read them at start (:func:`~inferbus.actors._repository.
    read_configs`): a model named here takes them, not its ``config.json`` as it is now (an actor restarted after an
    edit serves what its peers serve; the edit is applied by ``inferbus models load``). Empty = read from disk."""
    backend: str = "onnxruntime"
    device_kind: str = "cpu"
    device_index: int = 0
    precision: str = "fp32"
    mailbox_size: int = 1024
    """Bound of the request mailbox; beyond it requests are shed with RESOURCE_EXHAUSTED."""
    report_interval_ms: int = 100
    """Load/health report period in ms."""
    cpu_affinity: tuple[int, ...] = ()
    """CPU cores to pin this process to (empty = no pinning)."""
    busy_poll_us: float = 0.0
    """Busy polling: after each request, keep this process's event loop polling for this many µs instead of
    blocking, so the next request finds a running process with warm caches (:class:`inferbus.bus.BusyPoll`;
    the idea of Linux ``SO_BUSY_POLL``). Costs a full core while requests keep coming; for processes pinned
    to dedicated cores. 0 = off (default)."""
    max_batch_size: int | None = None
    """Override of the models' ``max_batch_size`` for zero-wait batching (None = per model config)."""
    region: str = ""
    stall_fence_s: float = 4.0
    """If this process was frozen (SIGSTOP, swap, a stalled VM) for longer than this, requests forwarded
    before the freeze ended are refused UNAVAILABLE instead of computed: by then the ingress has taken
    the worker out of routing and failed them, and the client may have retried them elsewhere, so
    computing them would execute a request twice. Keep it below the ingresses' suspicion age minus one
    report period (an ingress sends a retry elsewhere and cancels the old copy once the worker holding it
    has been silent for ``max(0.5 s, 0.5 × health_timeout_s)``; the node sets 0.3 × health_timeout_s);
    0 disables the fence."""
    audit: bool = False
    """Publish the request id of every execution on ``<p>._audit`` (chaos drills count duplicates with it)."""
    drain_timeout_s: float = 3.0
    """Graceful stop (SIGTERM): how long the worker keeps answering the requests it already received
    (queued, computing, buffered in its subscription) after it stopped taking new ones, seconds. Keep it
    below the supervisor's shutdown timeout (5 s), after which the process is killed."""
    compute_delay_ms: float = 0.0
    """Fault injection only: extra sleep before each batch (chaos 'slow-worker')."""
    health_window_s: float = 10.0
    """Sliding window of the error rate in the load reports, seconds (>= 1)."""
    dedupe_ttl_s: float = 30.0
    """How long a computed result is kept to answer a retried/hedged duplicate of its request id, seconds."""
    dedupe_max_entries: int = 4096
    """Results kept for deduplication at most (0 = answer duplicates only by joining in-progress work)."""
    dedupe_max_bytes: int = 64 * 1024 * 1024
    """Bytes of encoded results kept for deduplication at most."""
    fault_control: bool = False
    """Fault injection only: obey ``FaultSet`` messages on ``<p>._ctl.<worker_id>`` (tests, chaos drills)."""
    inject_error_rate: float = 0.0
    """Fault injection only: fraction (0..1) of computed requests answered INTERNAL from the start."""
    inline_max_compute_us: float = 250.0
    """Run a model version's batches on the worker's event loop instead of the inference thread while its
    EWMA compute time per request (thread CPU time, so preemption on a busy host does not count) is at most
    this many µs (CPU ONNX Runtime sessions only; GPU/TPU/JAX
    sessions always use the thread). Decided per batch, so a model that becomes slower goes back to the
    thread. 0 disables inline execution. Default: the models here take 20-110 µs per request on a loaded
    2-core box, the thread hand-off ~30-55 µs (docs/performance.md, "Inline execution of small models"). At most
    1,000,000 µs (:data:`~inferbus._limits.MAX_INLINE_COMPUTE_US`): a model that slow holds the loop for a second."""
    chunk_rows: int = 1024
    """A request of more rows than this (and than the model's ``max_batch_size``) to a model that batches
    (``max_batch_size`` > 0: its first dimension is the batch, rows are independent) is run on the inference
    thread in chunks of this many rows, and between two chunks the small requests waiting meanwhile (a body within
    the model version's inline bound) are computed and answered: a large batch no longer holds every small request
    behind it for its whole compute. 0: never split; at most 2**31 - 1 (:data:`~inferbus._limits.MAX_CHUNK_ROWS`)."""
    trace_otlp_endpoint: str | None = None
    """OpenTelemetry: export spans of sampled requests to this OTLP/HTTP traces URL
    (``http://127.0.0.1:4318/v1/traces``; needs the ``otel`` extra); None (default): no span is made and nothing of
    OpenTelemetry is imported (:mod:`inferbus.actors._tracing`, docs/observability.md, "Tracing")."""
    trace_ratio: float = 1.0
    """With ``trace_otlp_endpoint``: the probability, in [0, 1], that a request without a ``traceparent`` is traced
    (head sampling); a request with one follows its ``sampled`` flag (W3C Trace Context, section 3.2.2.5)."""
    flight_record_path: str = ""
    """A file this worker maps and writes, before each model run, which forwarded requests the run holds
    (:mod:`inferbus.actors._flight`); its node reads it after a crash, so that the ingresses count the crash
    against those requests only. Set by the node; empty = none (every request the worker held is counted)."""

    def __post_init__(self) -> None:
        check_trace(self.trace_otlp_endpoint, self.trace_ratio, "WorkerConfig")
        _require(isinstance(self.chunk_rows, int) and not isinstance(self.chunk_rows, bool)
                 and 0 <= self.chunk_rows <= MAX_CHUNK_ROWS, "WorkerConfig.chunk_rows",
                 f"an integer in {interval(0, MAX_CHUNK_ROWS)} rows (0: never split)", self.chunk_rows)
        if not 1 <= self.mailbox_size <= MAX_MAILBOX_SIZE:
            raise ValueError(f"WorkerConfig.mailbox_size must be in {interval(1, MAX_MAILBOX_SIZE)} requests, got "
                             f"{self.mailbox_size}")
        _require(self.report_interval_ms >= 10, "WorkerConfig.report_interval_ms", ">= 10 ms", self.report_interval_ms)
        # each check is written so that NaN fails it (every comparison with NaN is false), and infinity where a
        # finite time is meant
        if not 1 <= self.health_window_s <= MAX_HEALTH_WINDOW_S:
            raise ValueError(f"WorkerConfig.health_window_s must be in {interval(1, MAX_HEALTH_WINDOW_S)} seconds, "
                             f"got {self.health_window_s}")
        _require(0 < self.dedupe_ttl_s < _INF, "WorkerConfig.dedupe_ttl_s", "a finite number > 0 seconds",
                 self.dedupe_ttl_s)
        _require(self.dedupe_max_entries >= 0, "WorkerConfig.dedupe_max_entries", ">= 0", self.dedupe_max_entries)
        _require(self.dedupe_max_bytes >= 0, "WorkerConfig.dedupe_max_bytes", ">= 0 bytes", self.dedupe_max_bytes)
        _require(0.0 <= self.inject_error_rate <= 1.0, "WorkerConfig.inject_error_rate", "in [0, 1]",
                 self.inject_error_rate)
        _require(0 <= self.compute_delay_ms < _INF, "WorkerConfig.compute_delay_ms", "a finite number >= 0 ms",
                 self.compute_delay_ms)
        _require(0 <= self.inline_max_compute_us <= MAX_INLINE_COMPUTE_US, "WorkerConfig.inline_max_compute_us",
                 f"in {interval(0, MAX_INLINE_COMPUTE_US)} µs (0 = never inline)", self.inline_max_compute_us)
        check_busy_poll_us(self.busy_poll_us, "WorkerConfig.busy_poll_us")


@dataclass(frozen=True)
class IngressConfig(_JsonMixin):
    """One ingress process (request actor + its in-process router)."""

    ingress_id: str
    bus: BusConfig
    models_dir: str
    models: tuple[str, ...] = ()
    pins: dict[str, str] = field(default_factory=dict)
    """``"name:version"`` → ``"sha256:<hex>"``, as :attr:`WorkerConfig.pins`: carried in the serving state this
    ingress starts from (revision 0), so that model-management writes keep them."""
    configs: dict[str, dict] = field(default_factory=dict)
    """Model name → its ``config.json`` keys as the node read them at start, as :attr:`WorkerConfig.configs`."""
    redis_url: str | None = None
    """L2 cache (Valkey/Redis URL); None disables L2 lookups."""
    l2_lookup: bool = False
    """Look up the L2 cache on an L1 miss (costs one Redis round trip per miss; fills happen either way)."""
    l1_entries: int = 10_000
    """L1 cache capacity in entries (LRU)."""
    l1_max_bytes: int = 256 * 1024 * 1024
    """L1 cache capacity in bytes of encoded answers (LRU; an answer larger than this is not kept in L1)."""
    l2_timeout_ms: float = 2.0
    """An L2 lookup slower than this counts as a miss."""
    l2_breaker_failures: int = 20
    """L2 lookups failed in a row (timed out or errored) that turn lookups off for ``l2_breaker_open_s`` (a circuit
    breaker, :class:`inferbus.actors._breaker.CircuitBreaker`): a frozen or unreachable Valkey then costs the misses
    nothing instead of ``l2_timeout_ms`` each."""
    l2_breaker_open_s: float = 1.0
    """Seconds L2 lookups stay off once the breaker opens; then one lookup is let through as its probe (it answers:
    lookups resume; it fails: off again for this long)."""
    default_timeout_ms: float = 1000.0
    """Budget when a request has no Inferbus-Timeout-Ms header."""
    health_timeout_s: float = 5.0
    """A worker with no load report for this long is taken out of routing (s, :data:`MIN_HEALTH_TIMEOUT_S` to
    :data:`MAX_HEALTH_TIMEOUT_S`)."""
    forget_after_s: float | None = None
    """A worker with no load report for this long (s) is forgotten: dropped from the router's table and the health
    reply's ``workers``, counted in ``counts.workers_forgotten``, learned again if it reports again. None (default):
    ``max(60 s, 12 × health_timeout_s)`` (:func:`inferbus.actors._router.forget_after_s`, where the choice is
    explained); ``inf``: never. Must be more than ``health_timeout_s``: a worker is judged silent (its requests
    failed) before it is forgotten."""
    max_pending: int = 100_000
    """Bound of requests forwarded and not yet completed; beyond it: RESOURCE_EXHAUSTED (1..10**9,
    :data:`~inferbus._limits.MAX_COUNT`)."""
    region: str = ""
    cpu_affinity: tuple[int, ...] = ()
    busy_poll_us: float = 0.0
    """Busy polling, as :attr:`WorkerConfig.busy_poll_us` (colocated: one poller, the worker's, for both)."""
    run_to_completion: bool = True
    """Colocated only: a miss routed to the worker in this process, with nothing waiting to be batched with it
    or queued before it, is computed and answered in the call that received it (no inline queue, no task
    switch, no completion item); misses that arrive together (waiting in the subscription) are held back until
    the last of them and computed as batches in one call (bursts); see docs/architecture.md, "Run to
    completion" and "Bursts". False: always through the worker's queue."""
    max_error_rate: float = 0.01
    """A worker reporting a higher error rate (server-side failures / requests in its window) is unhealthy."""
    min_window_requests: int = 100
    """The error rate is judged only once the worker's window holds this many requests."""
    breaker_failures: int = 5
    """Consecutive failures that open a worker's circuit breaker."""
    breaker_open_s: float = 30.0
    """Seconds an open breaker refuses work before letting a probe through (half-open); (0, 86400]."""
    breaker_probes: int = 1
    """Requests let through at once while half-open."""
    rate_limit_per_s: float = 0.0
    """Sustained requests/s this ingress admits (token bucket; 0 = no global limit); at most 10**9 (as every rate and
    burst here: :data:`~inferbus._limits.MAX_COUNT`)."""
    rate_burst: float = 0.0
    """Global bucket capacity in requests (0 = one second of ``rate_limit_per_s``)."""
    client_rate_limit_per_s: float = 0.0
    """Sustained requests/s per ``Inferbus-Client-Id`` (0 = no per-client limit)."""
    client_rate_burst: float = 0.0
    """Per-client bucket capacity (0 = one second of ``client_rate_limit_per_s``)."""
    max_clients: int = 100_000
    """Per-client buckets kept (LRU)."""
    hedge_budget_ratio: float = 0.1
    """Hedges allowed per forwarded request (0..1; 0.1 = at most ~10 % extra work from hedging)."""
    l2_pool_size: int = 64
    """Redis connections for L2 lookups; a lookup waits for a free one within ``l2_timeout_ms``. 1..10,000 (Valkey's
    default ``maxclients``)."""
    max_request_bytes: int = 0
    """Largest request body accepted, bytes (0 = the NATS server's max_payload); beyond: PAYLOAD_TOO_LARGE. At most
    64 MiB (nats-server's ceiling of max_payload)."""
    max_tensor_bytes: int = 0
    """Largest input tensor accepted, bytes of its values (0 = no limit beyond the body); beyond: PAYLOAD_TOO_LARGE.
    At most 512 MiB (:data:`~inferbus._limits.MAX_TENSOR_BYTES`)."""
    max_bytes_elements: int = 65_536
    """Most elements of one BYTES input (0 = no limit); beyond: PAYLOAD_TOO_LARGE, checked from the shape before the
    elements of the ``raw`` form are read (a ``data`` list, JSON or MessagePack, is parsed with the body, before any
    check). Reading a BYTES tensor makes one Python object per element on the ingress's loop (~0.45 µs each on the
    2-core box): a fresh-user trial's 2,000,000-element request held the ingress for 0.9 s, every other request
    waiting behind it. The default costs at most ~30 ms there."""
    pending_grace_s: float = 1.0
    """A forwarded request with no completion this long after its deadline is counted lost (breaker failure)."""
    max_backlog_msgs: int = 10_000
    """Requests received but not yet handled (waiting in the ``infer`` subscription's buffer) at most: a
    request that finds more waiting behind it is refused RESOURCE_EXHAUSTED at once (1..``MAX_BACKLOG_MSGS``)."""
    max_backlog_bytes: int = 64 * 1024 * 1024
    """Bytes of such waiting requests at most, same rule (1..``MAX_BACKLOG_BYTES``)."""
    peer_query_timeout_ms: float = 5.0
    """How long a retry (``Inferbus-Attempt`` ≥ 2) that no local copy matches waits for a peer ingress to name
    the worker holding its first copy (ms, > 0); no answer = no peer holds one (or it is gone): route as usual.
    Every such retry pays it when the first copy's ingress is gone, so keep it near one bus round trip."""

    recent_rid_ttl_s: float = 30.0
    """How long the ingress remembers which worker computed a request id it forwarded (s, > 0; the workers'
    ``dedupe_ttl_s`` by default): a retry of it sent later (a lost reply, a client retry), here or through a
    peer ingress (``<p>._rid``), goes to that worker, whose recent results answer it without running the model."""
    recent_rid_entries: int = 65_536
    """Request ids remembered that way at most (LRU, >= 0; 0 turns it off)."""
    trace_otlp_endpoint: str | None = None
    """OpenTelemetry: export spans of sampled requests to this OTLP/HTTP traces URL
    (``http://127.0.0.1:4318/v1/traces``; needs the ``otel`` extra); None (default): no span is made and nothing of
    OpenTelemetry is imported (:mod:`inferbus.actors._tracing`, docs/observability.md, "Tracing")."""
    trace_ratio: float = 1.0
    """With ``trace_otlp_endpoint``: the probability, in [0, 1], that a request without a ``traceparent`` is traced
    (head sampling); a request with one follows its ``sampled`` flag (W3C Trace Context, section 3.2.2.5)."""

    def __post_init__(self) -> None:
        check_trace(self.trace_otlp_endpoint, self.trace_ratio, "IngressConfig")
        _require(0 < self.recent_rid_ttl_s < _INF, "IngressConfig.recent_rid_ttl_s", "a finite number > 0 seconds",
                 self.recent_rid_ttl_s)
        _require(self.recent_rid_entries >= 0, "IngressConfig.recent_rid_entries", ">= 0", self.recent_rid_entries)
        if not MIN_HEALTH_TIMEOUT_S <= self.health_timeout_s <= MAX_HEALTH_TIMEOUT_S:
            raise ValueError(f"IngressConfig.health_timeout_s must be in "
                             f"{interval(MIN_HEALTH_TIMEOUT_S, MAX_HEALTH_TIMEOUT_S)} seconds (at least five of the "
                             f"workers' 100 ms load-report periods: under it every worker reads as silent), got "
                             f"{self.health_timeout_s!r}")
        if self.forget_after_s is not None:
            _require(isinstance(self.forget_after_s, (int, float)) and not isinstance(self.forget_after_s, bool)
                     and (self.health_timeout_s < self.forget_after_s <= MAX_PERIOD_S
                          or self.forget_after_s == _INF),
                     "IngressConfig.forget_after_s", f"in {interval(self.health_timeout_s, MAX_PERIOD_S, lo_open=True)} "
                     f"seconds (more than health_timeout_s), or inf (never)", self.forget_after_s)
        _require(0.0 <= self.max_error_rate <= 1.0, "IngressConfig.max_error_rate", "in [0, 1]", self.max_error_rate)
        _require(1 <= self.min_window_requests <= MAX_COUNT, "IngressConfig.min_window_requests",
                 f"in {interval(1, MAX_COUNT)} requests", self.min_window_requests)
        _require(1 <= self.breaker_failures <= MAX_COUNT, "IngressConfig.breaker_failures",
                 f"in {interval(1, MAX_COUNT)} failures", self.breaker_failures)
        _require(0 < self.breaker_open_s <= MAX_PERIOD_S, "IngressConfig.breaker_open_s",
                 f"in {interval(0, MAX_PERIOD_S, lo_open=True)} seconds", self.breaker_open_s)
        _require(self.breaker_probes >= 1, "IngressConfig.breaker_probes", ">= 1", self.breaker_probes)
        check_rate_limits("IngressConfig", {n: getattr(self, n) for pair in RATE_FIELDS for n in pair})
        _require(0.0 <= self.hedge_budget_ratio <= 1.0, "IngressConfig.hedge_budget_ratio", "in [0, 1]",
                 self.hedge_budget_ratio)
        _require(1 <= self.l2_pool_size <= MAX_L2_POOL_SIZE, "IngressConfig.l2_pool_size",
                 f"in {interval(1, MAX_L2_POOL_SIZE)} connections (Valkey's default maxclients)", self.l2_pool_size)
        _require(0 <= self.max_request_bytes <= MAX_MAX_PAYLOAD_BYTES, "IngressConfig.max_request_bytes",
                 f"in {interval(0, MAX_MAX_PAYLOAD_BYTES)} bytes (0 = the bus's max_payload; nats-server's ceiling)",
                 self.max_request_bytes)
        _require(0 <= self.max_tensor_bytes <= MAX_TENSOR_BYTES, "IngressConfig.max_tensor_bytes",
                 f"in {interval(0, MAX_TENSOR_BYTES)} bytes (0 = no limit; the most values a request carries)",
                 self.max_tensor_bytes)
        _require(0 <= self.max_bytes_elements <= MAX_BYTES_ELEMENTS, "IngressConfig.max_bytes_elements",
                 f"in {interval(0, MAX_BYTES_ELEMENTS)} elements (0 = no limit)", self.max_bytes_elements)
        _require(0 < self.peer_query_timeout_ms <= H.MAX_TIMEOUT_MS, "IngressConfig.peer_query_timeout_ms",
                 f"in {interval(0, H.MAX_TIMEOUT_MS, lo_open=True)} ms", self.peer_query_timeout_ms)
        _require(1 <= self.l2_breaker_failures <= MAX_COUNT, "IngressConfig.l2_breaker_failures",
                 f"in {interval(1, MAX_COUNT)} failures", self.l2_breaker_failures)
        _require(0 < self.l2_breaker_open_s <= MAX_PERIOD_S, "IngressConfig.l2_breaker_open_s",
                 f"in {interval(0, MAX_PERIOD_S, lo_open=True)} seconds", self.l2_breaker_open_s)
        _require(0 < self.l2_timeout_ms <= H.MAX_TIMEOUT_MS, "IngressConfig.l2_timeout_ms",
                 f"in {interval(0, H.MAX_TIMEOUT_MS, lo_open=True)} ms (a request's longest budget)", self.l2_timeout_ms)
        check_busy_poll_us(self.busy_poll_us, "IngressConfig.busy_poll_us")
        if not 0 <= self.pending_grace_s < _INF:
            raise ValueError(f"IngressConfig.pending_grace_s must be a finite number >= 0 seconds, got "
                             f"{self.pending_grace_s}")
        if not 0 < self.default_timeout_ms <= H.MAX_TIMEOUT_MS:
            raise ValueError(f"IngressConfig.default_timeout_ms must be in "
                             f"{interval(0, H.MAX_TIMEOUT_MS, lo_open=True)} ms (the header's own bound), got "
                             f"{self.default_timeout_ms}")
        _require(1 <= self.max_pending <= MAX_COUNT, "IngressConfig.max_pending", f"in {interval(1, MAX_COUNT)} requests",
                 self.max_pending)
        _require(self.l1_max_bytes >= 0, "IngressConfig.l1_max_bytes", ">= 0 bytes (0: no byte bound)",
                 self.l1_max_bytes)
        _require(1 <= self.max_backlog_msgs <= MAX_BACKLOG_MSGS, "IngressConfig.max_backlog_msgs",
                 f"in {interval(1, MAX_BACKLOG_MSGS)} requests (below nats-py's own pending limit)", self.max_backlog_msgs)
        _require(1 <= self.max_backlog_bytes <= MAX_BACKLOG_BYTES, "IngressConfig.max_backlog_bytes",
                 f"in {interval(1, MAX_BACKLOG_BYTES)} bytes (below nats-py's own pending limit)", self.max_backlog_bytes)


@dataclass(frozen=True)
class AggregatorConfig(_JsonMixin):
    """The aggregator process: L2 cache fills."""

    aggregator_id: str
    bus: BusConfig
    redis_url: str | None = None
    cpu_affinity: tuple[int, ...] = ()


@dataclass(frozen=True)
class HttpProcessConfig(_JsonMixin):
    """One HTTP process of a node (``up --http-processes``; :mod:`inferbus.actors._httpproc`, docs/http.md).

    Attributes:
        http_id: its id (``<node>-h<k>``), its NATS connection's name ``http-<http_id>``.
        bus: the NATS it sends inference requests on (the node's).
        node_id: the node's id (as its error messages name it).
        host, port: the node's HTTP address and port, listened on with ``SO_REUSEPORT`` (``port`` > 0: the node
            picked it when ``--http-port 0`` was asked).
        upstream_port: the node's own HTTP server's port on ``127.0.0.1``, where every request but an inference is
            forwarded.
        models_dir: the node's model repository (an error message names a path under it relative to it).
        ingress_options: the ingresses' options (``default_timeout_ms``: an inference's budget without
            ``Inferbus-Timeout-Ms``; ``max_request_bytes``: the largest body).
        http_infer: ``POST .../infer`` served (``--http-infer``); off: 403.
        http_model_control: (forwarded to the node, which gates it; kept so the gateway reads as the node's).
        idle_timeout_s: a connection idle this long is closed, seconds (``--http-idle-timeout-s``).
        max_connections: open connections of this process at most, and threads running its requests
            (``--http-max-connections``, per process).
        drain_timeout_s: at a graceful stop, the longest wait for the requests received before it, seconds (the
            workers' ``drain_timeout_s``).
        cpu_affinity: the cores it runs on (``--pin-cpus``), empty: any.
    """

    http_id: str
    bus: BusConfig
    node_id: str
    host: str
    port: int
    upstream_port: int
    models_dir: str = ""
    ingress_options: dict = field(default_factory=dict)
    http_infer: bool = False
    http_model_control: bool = False
    idle_timeout_s: float = 30.0
    max_connections: int = 100
    drain_timeout_s: float = 3.0
    cpu_affinity: tuple[int, ...] = ()

    @property
    def prefix(self) -> str:
        """The subject prefix (the bus's)."""
        return self.bus.prefix


@dataclass(frozen=True)
class ColocatedConfig:
    """One colocated process: an ingress and a worker sharing one event loop and one NATS connection.

    The ingress hands the requests its router sends to this worker over in-process (no forward publish)
    and gets the worker's completion notices in-process; both actors are otherwise unchanged
    (docs/architecture.md, "Colocated workers").
    """

    ingress: IngressConfig
    worker: WorkerConfig

    def __post_init__(self) -> None:
        if self.ingress.bus != self.worker.bus:
            raise ValueError("ColocatedConfig: ingress and worker must use the same bus (one shared connection)")

    def to_json(self) -> str:
        return json.dumps({"ingress": asdict(self.ingress), "worker": asdict(self.worker)})

    @classmethod
    def from_json(cls, text: str) -> "ColocatedConfig":
        d = json.loads(text)
        unknown = set(d) - {"ingress", "worker"}
        if unknown:
            raise ValueError(f"ColocatedConfig: unknown fields {', '.join(sorted(unknown))}; allowed: ingress, worker")
        return cls(ingress=_from_dict(IngressConfig, d["ingress"]), worker=_from_dict(WorkerConfig, d["worker"]))
