"""Messages between inferbus's own actors: a closed, version-tagged union.

Every struct carries a ``type`` tag (``inferbus.v1.*``); :func:`decode_internal`
accepts only the tags below and raises :class:`InternalDecodeError` (naming the
field) for an unknown tag or a field of the wrong type, never returning a dict.

The request forwarded from an ingress to a worker is *not* re-encoded: the
client's original OIP body travels unchanged (no copy of tensor bytes), and the
routing facts travel in headers, tagged ``Inferbus-Msg: inferbus.v1.forward``.
"""

from __future__ import annotations

import msgspec

FORWARD_TAG = "inferbus.v1.forward"
"""``Inferbus-Msg`` header value of a request forwarded by an ingress to a worker."""


class InternalDecodeError(ValueError):
    """An internal message could not be decoded: unknown tag or wrong field type."""


class _Base(msgspec.Struct, tag_field="type", omit_defaults=True, frozen=False):
    pass


class LoadReport(_Base, tag="inferbus.v1.load"):
    """A worker's load and health, published every ``report_interval_ms`` on ``<p>._load``."""

    worker_id: str
    pid: int
    device_kind: str
    device_name: str
    backend: str
    precision: str
    models: list[str]
    """``name:version`` of every model version loaded."""
    queue_depth: int
    """Requests waiting in the mailbox."""
    in_flight: int
    """Requests received and not yet answered (queued + computing)."""
    capacity: int
    """Mailbox bound."""
    ewma_service_us: float
    """Exponentially weighted mean compute time per request, µs (alpha 0.2)."""
    completed: int
    errors: int
    """Server-side failures (not client errors) since start."""
    region: str = ""
    server: str = ""
    """The NATS server the worker is connected to (``host:port`` of its connected URL; empty when not
    known): ingresses prefer workers on their own server (``Router.server_hop_us``)."""
    interval_ms: int = 100
    draining: bool = False
    window_s: float = 0.0
    """Length of the sliding window behind ``window_requests``/``window_errors``, seconds (0 = not reported)."""
    window_requests: int = 0
    """Requests the worker computed (or failed by its own fault) within the window; client errors,
    expired and shed requests are not counted."""
    window_errors: int = 0
    """Server-side failures within the window (INTERNAL); never client errors."""
    error_rate: float = 0.0
    """``window_errors / window_requests`` (0 when the window is empty)."""
    computed: int = 0
    """Requests run through a model since start (a deduplicated request counts once)."""
    expired: int = 0
    """Requests dropped with DEADLINE_EXCEEDED before compute since start."""
    shed: int = 0
    """Requests shed with RESOURCE_EXHAUSTED (mailbox full) since start."""
    backlog_msgs: int = 0
    """Requests received from the bus and not yet taken by the worker's handler (its ``infer`` subscription's
    pending messages in nats-py) when the report was made: > 0 means the worker is behind its own input."""
    dedup_hits: int = 0
    """Duplicates (same request id and body) answered from the recent-results cache."""
    dedup_joins: int = 0
    """Duplicates that joined a computation already queued or running."""
    cancelled: int = 0
    """Hedge losers dropped before compute since start."""
    device_index: int = 0
    """The device's number on its host (CPU slot, CUDA ordinal, TPU chip)."""
    device_model: str = ""
    """What the runtime calls the device (``NVIDIA H200``, ``TPU v5 lite``); empty for CPU slots."""
    computing_ms: float = 0.0
    """How long the inference thread has been computing its current batch, ms (0 when idle)."""
    computing_overdue: bool = False
    """The current batch is still computing past the latest deadline among its requests (a hung or far too
    slow model): the ingress blames such a worker for requests it lost, not one computing within its budget."""
    precisions: dict[str, str] = msgspec.field(default_factory=dict)
    """Served precision per ``name:version`` after the load-time check (``precision`` is ``mixed`` when they differ)."""
    load_errors: dict[str, str] = msgspec.field(default_factory=dict)
    """Per ``name:version`` this worker failed to load (at start or on a model-management ``load``): why."""
    model_revisions: dict[str, int] = msgspec.field(default_factory=dict)
    """Per model: revision of the serving state (``ModelState``) whose loads and drains this worker finished."""
    decoded: int = 0
    """Request bodies this worker decoded for compute since start; a request a colocated ingress handed over
    in-process arrives decoded and validated and is not counted (docs/architecture.md, colocated workers)."""
    cpu_ratio: float = -1.0
    """CPU time the worker's process used (all its threads, ``time.process_time``) since its previous report,
    divided by the wall time between the two reports (the worker's monotonic clock): about 1.0 for a process that
    kept one core busy, 0 for one stopped or idle; -1 when not measured (a first report, a scrape, an older
    worker). A report after a gap from a process that was busy through it (a colocated process working off its
    ingress's backlog) is an overload, not a freeze (``Router.on_report``, ``GAP_BUSY_CPU_RATIO``)."""
    model_writers: dict[str, str] = msgspec.field(default_factory=dict)
    """Per model: the writer (ingress id) of the state of ``model_revisions``. Two ingresses can write the same
    revision at once; the revision alone does not say whose state a worker applied (absent: an older worker)."""


class DoneItem(msgspec.Struct, array_like=True):
    seq: int
    ok: bool
    """True when the reply was a result (not an error)."""
    server_error: bool = False
    """True when the failure was the worker's fault (counts against its health)."""
    service_us: int = 0
    response: bytes | None = None
    """The encoded InferResponse (msgpack), only when the ingress asked for a cache fill."""
    code: str = ""
    """Error code of a failed request ("" when ok); ``CANCELLED`` for a hedge loser dropped before compute."""
    held: bool = False
    """The worker did not reply to the client: a copy marked ``Inferbus-Hedge: primary``/``copy`` it shed
    (RESOURCE_EXHAUSTED) or refused (UNAVAILABLE) before compute; the ingress hedges it or answers the client."""


class DoneNotice(_Base, tag="inferbus.v1.done"):
    """Completions a worker sends to one ingress after replying to the clients (off the hot path)."""

    worker_id: str
    items: list[DoneItem]


class CacheFill(_Base, tag="inferbus.v1.cache_fill"):
    """A result for the aggregator to write to the L2 cache (``SET key value PXAT expires_unix_ms``).

    ``expires_unix_ms``: when the entry expires, ms since the Unix epoch on the ingress's clock (the moment the answer
    reached it plus ``ttl_ms``); 0 from a sender older than it (the aggregator then counts ``ttl_ms`` from the fill's
    arrival). A fill carried no time before 2026-12-05, and one that waited in the bus while the aggregator was
    stopped was written with its whole TTL when it woke: answers lived in L2 6 s after they were computed with a
    100 ms TTL (a fresh-user trial)."""

    key: str
    ttl_ms: int
    response: bytes
    expires_unix_ms: int = 0


class ProcessEvent(_Base, tag="inferbus.v1.event"):
    """A lifecycle event from a node supervisor: ``kind`` is ``down`` or ``up``."""

    kind: str
    child_id: str
    worker_id: str | None = None
    pid: int | None = None
    reason: str = ""
    running: list[tuple[str, int]] | None = None
    """For a worker's crash: ``(ingress id, forward seq)`` of each request a model run held when it died, as its
    flight record says (:mod:`inferbus.actors._flight`; empty: it was running none); None when not known."""
    fault: bool = False
    """Killed by a signal its own code raised (SIGFPE, SIGSEGV, SIGBUS, SIGILL, SIGABRT), not sent from outside
    (SIGKILL, SIGTERM) nor an exit."""
    running_local: list[tuple[str, str, bytes]] | None = None
    """For a colocated process's crash (``inferbus up --colocate``): ``(model version key, request id or "",
    request digest)`` of each request its own ingress had handed to its worker in-process that a model run held when
    it died (the digest: :func:`inferbus.actors._crashes.request_digest`). That ingress died with the process; the
    others remember these requests as a crash's (docs/failure-semantics.md). None when not known or not colocated."""


class Cancel(_Base, tag="inferbus.v1.cancel"):
    """An ingress withdraws requests it forwarded (hedge losers), on ``<p>._ctl.<worker_id>``.

    A worker drops a cancelled request that has not started compute (no reply; a
    ``CANCELLED`` completion goes back to the ingress); one already computing finishes.
    """

    ingress: str
    seqs: list[int]


class FaultSet(_Base, tag="inferbus.v1.fault"):
    """Fault injection for tests and chaos drills, on ``<p>._ctl.<worker_id>``.

    Honoured only by workers started with ``WorkerConfig.fault_control``; others ignore it.
    """

    error_rate: float = 0.0
    """Fraction (0..1) of computed requests answered INTERNAL instead of their result."""
    compute_delay_ms: float = 0.0
    """Extra sleep before each batch, ms."""
    silent: bool = False
    """Stop publishing load reports (a hung or partitioned worker, as the routers see it)."""
    shed: bool = False
    """Shed every request as if the mailbox were full (RESOURCE_EXHAUSTED), while reporting an empty queue."""
    loop_busy_ms: float = 0.0
    """Once, right after the ack: keep the worker's event loop busy on the CPU for this long, ms (a process busy
    with other work, as a colocated process working off its own ingress's backlog is): it reads nothing and sends
    no load report meanwhile, then carries on. Not kept: a later ``FaultSet`` need not clear it."""


class ModelState(msgspec.Struct, omit_defaults=True):
    """The serving state of one model, as model-management writes set it (docs/models.md)."""

    model: str
    revision: int
    """+1 per write to this model; the higher ``(revision, writer)`` wins (0 = as the repository says)."""
    writer: str
    """Ingress id that made the write (tie-break between two writes of the same revision)."""
    versions: list[str]
    """Versions to serve: workers hold a session for each, ingresses accept requests naming them. Empty: the
    model is not served at all (a failed load of a model that was not served, undone): workers drop its
    sessions, ingresses forget it (NOT_FOUND, not listed, not waited for by readiness)."""
    default_version: str
    """Version that serves requests naming none (``""`` when ``versions`` is empty)."""
    digests: dict[str, str] = {}
    """Version → ``"sha256:<hex>"`` of its files when it was first loaded (its pin, docs/models.md): a worker serves
    a version only from files with this digest. A version missing here is not pinned (not compared)."""
    config: dict = {}
    """The model's ``config.json`` keys that inferbus reads (:data:`inferbus.actors._repository.CONFIG_FIELDS`), as
    the node read them at start or the ingress that took the last ``load`` read them then: every actor serves these
    (``cache_ttl_ms``, ``hedge_after_ms``, ``max_batch_size``, ...), not its own disk's. Empty: each actor's own read
    (a state from an older actor)."""


class ModelStates(_Base, tag="inferbus.v1.model_states"):
    """Model serving states, on ``<p>._models.state`` (after each write and every few seconds) and as the
    answer to ``<p>._models.get`` (an actor starting up asks its peers for the current states)."""

    items: list[ModelState]


class DeathMemory(_Base, tag="inferbus.v1.deaths"):
    """Requests an ingress remembers as held by workers that died (its query-of-death memory,
    docs/failure-semantics.md), shared with the other ingresses: on ``<p>._deaths`` the entries a crash changed, as
    a reply on ``<p>._deaths.get`` all of them. A receiver keeps, per key, the most deaths and the later expiry.

    ``entries``: ``(key, deaths, ttl_s, reason, refusal)``: ``key`` a list, ``["body", model version key, BLAKE2b-16
    digest]``, ``["rid", model version key, request id]`` or ``["key", cache key]``; ``deaths`` the crashes counted
    against it; ``ttl_s`` seconds it is still remembered; ``reason`` the last crash's; ``refusal`` the INTERNAL
    answer's message once it is taken for a query of death, else None (a suspect)."""

    ingress: str
    entries: list[tuple[list, int, float, str, str | None]]


InternalMessage = LoadReport | DoneNotice | CacheFill | ProcessEvent | Cancel | FaultSet | ModelStates | DeathMemory

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(InternalMessage)


def encode_internal(msg: InternalMessage) -> bytes:
    """MessagePack bytes of an internal message (tag included)."""
    return _encoder.encode(msg)


def decode_internal(body: bytes) -> InternalMessage:
    """Decode one internal message.

    Raises:
        InternalDecodeError: unknown ``type`` tag, missing or mistyped field (the
            message names the field's path).
    """
    try:
        return _decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InternalDecodeError(str(exc)) from exc
