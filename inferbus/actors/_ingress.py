"""The ingress (request) actor: the public entry point, one queue group of replicas.

For each request on ``<p>.infer.<model>[.<version>]`` it, in order:
applies the time budget, resolves the model, applies the body size limit and
the rate limits (all before decoding, so refused traffic costs little), decodes
(msgpack, or JSON with ``Content-Type: application/json``), validates against
the model's metadata, looks up the L1 then (optionally) L2 cache, asks its
in-process router for the least-loaded healthy worker and forwards the
*original* body to that worker with the client's reply subject, so the worker
answers the client directly (3 one-way hops on a miss, 2 on a hit; DESIGN §4).

Every failure is a typed error reply sent at once (docs/failure-semantics.md):
spent budget → DEADLINE_EXCEEDED; unknown model → NOT_FOUND; over a rate limit
or too many outstanding requests → RESOURCE_EXHAUSTED with ``retry_after_ms``;
body or tensor over a size limit → PAYLOAD_TOO_LARGE; bad body or tensor →
INVALID_ARGUMENT naming the field; no routable worker → UNAVAILABLE. No request
kills the actor: an unexpected exception becomes INTERNAL for that request alone.

Routing facts (:mod:`inferbus.actors._router`): workers are routable while
live, healthy (error rate) and their circuit breaker allows. A request whose id
is still pending at a worker (a retry) is sent to that same worker, which joins
it to the running computation (per-worker dedupe), so a retry after a client
timeout does not run the model again.

Hedging (:mod:`inferbus.actors._hedge`): with a hedge policy (model config
``hedge_after_ms`` or the ``Inferbus-Hedge`` header) a request not completed
after the delay is forwarded once more to another worker, with the same reply
subject and request id. The first completion wins; the ingress then cancels
the other copy (dropped by its worker if not started). The model runs at most
twice. When both run, the client's reply subject gets two replies; a NATS
request (any client library) takes the first and drops the second, because
each request has its own reply subject. A copy of a hedge-eligible request
(``Inferbus-Hedge: primary`` / ``copy`` on the forward) that its worker sheds
or refuses UNAVAILABLE before compute is not answered by the worker: its
completion notice says so (``held``) and this ingress hedges at once, or, when
no other copy can run, answers the client with that error itself, once.

In-flight accounting: each forwarded request is kept in a pending table until
the worker's completion notice arrives; when the node reports the worker's
process dead, or the worker stops reporting, every pending request it held is
sent again or answered UNAVAILABLE at once (unless a hedge copy is still running
elsewhere; a hedge's loser, whose other copy answered already, is dropped);
an entry older than its deadline plus ``pending_grace_s`` is dropped (a breaker
failure) so counts return to zero even when a worker loses requests.
"""

from __future__ import annotations

import asyncio
import logging
import functools
import itertools
import math
import os
import time
from collections import OrderedDict, defaultdict

import msgspec

from ..bus import (BusyPoll, Subjects, close_connection, connected_server, publish_raw, reply_block, send_pending,
                   version_problem)
from ..bus._subjects import MAX_REPLY_BYTES, name_problem
from ..bus import headers as H
from ..bus._connect import _can_drain_apart, drain_subscription, end_drain
from ..bus._connect import _round_trip as _server_round_trip
from ..schemas import (
    MAX_REQUEST_ID_CHARS, DeadlineExceeded, Health, InferResponse, InferbusError, Internal, InvalidArgument, ModelList,
    ModelMetadata, ModelReady, NotFound, ServerMetadata,
    PayloadTooLarge, ResourceExhausted, TensorMetadata, Unavailable, decode_request, decode_response, encode,
    JSON, answers_raw, encode_response, input_to_numpy, is_json,
)
from ..schemas._codec import looks_like_json
from ..schemas._errors import fmt_ms
from ..schemas._tensors import datatype_mismatch, preload_datatypes
from ..schemas._internal import (
    CacheFill, Cancel, DeathMemory, DoneNotice, InternalDecodeError, LoadReport, ProcessEvent, decode_internal,
    encode_internal,
)
from ._breaker import BreakerState, CircuitBreaker
from ._cache import L1Cache, cache_key
from .._version import __version__
from ._common import (StopSignal, announce_ready, connect_logged, drain_endpoint, endpoint_error_counter,
                      endpoint_subscription, error_message, log, run_actor, serving_gc, set_affinity, supervise_loops)
from ._fencing import Fencing
from ._crashes import (QUERY_OF_DEATH_DEATHS, QUERY_OF_DEATH_TTL_S, answer_ask, commit_crash, count_crash,  # noqa: F401
                       death_keys, memory_entries, merge_memory, share_memory)
from ._config import IngressConfig
from ._layout import RequestLayouts
from ._hedge import MIN_DELAY_MS, HedgeBudget, HedgePolicyError, parse_policy
from ._modelstats import ForwardStats
from ._models import IngressModels
from ._ratelimit import RateLimiter
from ._pinning import pinned_versions
from ._repository import Model, ModelRepository, ModelVersion
from ._router import CLIENT_ERROR, NEUTRAL, OK, SERVER_ERROR, Router, forget_after_s
from ._worker import INLINE_MAX_JOBS, INLINE_SLICE_US, control_subject

_SWEEP_PERIOD_S = 0.05
_FORGET_CHECK_PERIOD_S = 1.0
"""How often the sweep looks for workers to forget (:meth:`Ingress._forget`): their silence is counted in minutes."""
_STICKY_REPORT_AGE_S = 0.5
"""A retry sticks to the worker still holding its request id only if that worker reported this recently."""
_CLIENT_CODES = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "PAYLOAD_TOO_LARGE"})
_NEUTRAL_CODES = frozenset({"DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED"})
_MAX_POLICY_CACHE = 256

_REPLY_CHARS_UNCHECKED = MAX_REPLY_BYTES // 4
"""A reply subject of this many characters or fewer is within :data:`MAX_REPLY_BYTES` whatever they are (4 bytes
of UTF-8 at most each): the request path measures its bytes only past it."""


HEDGE_PRIMARY = "primary"
HEDGE_COPY = "copy"
_HEDGE_LINES = {"": "", HEDGE_PRIMARY: f"{H.HEDGE}: {HEDGE_PRIMARY}\r\n", HEDGE_COPY: f"{H.HEDGE}: {HEDGE_COPY}\r\n"}
"""``Inferbus-Hedge`` on a forward: ``primary`` (the first copy of a request that may be hedged) or ``copy``
(the hedge). A worker that sheds or refuses (retryable) a copy so marked tells this ingress instead of the
client (``DoneItem.held``); the ingress then hedges at once or answers the client itself."""
_HELD_RETRY_AFTER_MS = {"RESOURCE_EXHAUSTED": 10, "UNAVAILABLE": 0}


START_WORKERS_WAIT_S = 1.0
"""At start, how long an ingress waits at most for the load reports that show a live worker of each served model's
default version before it takes requests (s): a worker reports every ``report_interval_ms`` (100 ms), so a restarted
ingress next to live workers waits about that long; one whose workers are not up takes requests after this, refusing
them UNAVAILABLE until they are."""
STOP_DRAIN_S = 2.0
"""Graceful stop, first phase: the ``infer`` subscription takes nothing new (UNSUB) and the requests it had
received are handled as usual for at most this long (s)."""
STOP_REFUSE_S = 1.0
"""Second phase, when the drain did not finish: every request still waiting in the subscription, or still on its
way from the server, is answered UNAVAILABLE at once (``retry_after_ms: 0``, the SDK retries it elsewhere), for at
most this long (s); what is left after it is dropped (its client's attempt times out)."""
STOP_CLOSE_S = 1.0
"""Last phase: the loops' stop, the micro service's stop (colocated) and the connection's flush and close get at
most this long (s) together."""
STOP_BOUND_S = STOP_DRAIN_S + STOP_REFUSE_S + STOP_CLOSE_S
"""An ingress's graceful stop takes at most this long (s) whatever its backlog (4 s; the node's supervisor kills
it 5 s after SIGTERM)."""


RAW_INDEX_MAX_BODY_BYTES = 4096
"""Request bodies up to this size that have no request layout (:mod:`inferbus.actors._layout`) are remembered by
their bytes (the raw index): a repeat of the same bytes for the same model version is answered from L1 without
being decoded, validated or hashed into a cache key again.
Bounded by ``l1_entries`` entries, so the index holds at most ``l1_entries`` × 4 KiB of bodies."""


def _fwd_fields(dl_ms: float, ingress_id: str, mv, term: int, key: str | None, stages: dict, ct: str | None,
                hdrs: dict, rid: str | None, pin: str | None = None) -> tuple:
    """The ``fwd`` argument of :func:`_fwd_block`: ``(deadline_unix_ms, (ingress, model, version, term, cache
    key, timings), extra header lines)``; ``stages``: the ingress's µs by stage (decode, validate, cache, route,
    ingress_total); ``extra`` carries the client's Content-Type, the request id (the body's ``rid`` when the
    client sent no header), its trace headers and ``Inferbus-Pin: <pin>`` when ``pin`` is given (:data:`H.PIN`)."""
    fargs = (ingress_id, mv.name, mv.version, str(term) if term else "", key or "",
             f"decode={stages['decode']},validate={stages['validate']},cache={stages['cache']},"
             f"route={stages['route']},ingress_total={stages['ingress_total']}")
    extra = f"Content-Type: {ct}\r\n" if ct else ""
    v = hdrs.get(H.REQUEST_ID)
    if v:
        extra += f"Inferbus-Request-Id: {v}\r\n"
    elif rid:  # the body's id is the idempotency key when the header is absent
        extra += f"Inferbus-Request-Id: {H.header_value(rid)}\r\n"
    if H.TRACEPARENT in hdrs or not hdrs.keys() <= H.EXACT_HEADERS:  # W3C: forwarded only when well formed,
        extra += H.trace_lines(hdrs)  # tracestate only beside it; their names in any case (trace_lines)
    if pin:
        extra += f"{H.PIN}: {pin}\r\n"
    return dl_ms, fargs, extra


def _fwd_block(seq: int, timeout_ms: float, fwd: tuple, hedge: str, alone: bool = False) -> bytes:
    """The header block of a forwarded request: ``Inferbus-Fwd`` (one header for the routing fields,
    see ``inferbus.bus.headers.FWD``) plus the client's Content-Type / request id / trace headers, plus
    ``Inferbus-Hedge: <hedge>`` when ``hedge`` is ``primary`` or ``copy``, plus ``Inferbus-Alone: 1`` when ``alone``
    (a suspected query of death, :meth:`Ingress._note_deaths`)."""
    dl_ms, (ingress, model, version, term, key, timings), extra = fwd
    return (f"NATS/1.0\r\nInferbus-Fwd: v1;{seq};{ingress};{model};{version};{max(timeout_ms, 0.0):.3f};{dl_ms:.1f};"
            f"{term};{key};{timings}\r\n{extra}{_HEDGE_LINES[hedge or '']}{_ALONE_LINE if alone else ''}"
            f"\r\n").encode()


_ALONE_LINE = f"{H.ALONE}: 1\r\n"


class _Hedge:
    """State shared by the copies of one hedged request.

    ``body`` and ``fwd`` (the :func:`_fwd_block` fields) make a copy sent over the bus; ``local`` (the
    decoded request and the fields :meth:`Ingress._forward_local` hands over) a copy for the colocated
    worker. All are let go once the request is settled.

    ``done``: settled, nothing more is sent for it (a copy answered, or none can); ``answered``: a copy's completion
    settled it, so its client has its reply (a result or a worker's error): a copy still pending is a loser, which
    is never sent again nor answered by this ingress (:meth:`Ingress._fail_pending`)."""

    __slots__ = ("policy", "seqs", "done", "answered", "timer", "body", "fwd", "t_first", "model_key", "local")

    def __init__(self, policy, body: bytes, fwd: tuple, t_first: float, model_key: str,
                 local: tuple | None = None) -> None:
        self.policy = policy
        self.seqs: list[int] = []
        self.done = False
        self.answered = False
        self.timer: asyncio.TimerHandle | None = None
        self.body = body
        self.fwd = fwd
        self.t_first = t_first
        self.model_key = model_key
        self.local = local

    def release(self) -> None:
        """Let the request's bytes and decoded tensors go (the request is settled)."""
        self.body = b""
        self.local = None


#: Requests waiting in the ``infer`` subscription at or above which a request that arrives past its client's
#: deadline is dropped without an answer (:class:`_ExpiredUnanswered`): the client has given up by its own clock,
#: and under overload the answers to the expired requests ate the time the fresh ones needed. Below it (no
#: backlog: a client whose clock runs ahead of this host's) the client is told, with the reason.
SILENT_EXPIRY_BACKLOG = 64


_ATTEMPT_DEADLINE_SPAN_S = 86_400.0
"""An ``Inferbus-Attempt-Deadline-Unix-Ms`` further than this from the ingress's clock (s) is no attempt's deadline:
seconds or microseconds written for milliseconds, 0, infinity (INVALID_ARGUMENT; a fresh-user trial's seconds were
answered UNAVAILABLE, "given up 1,794,783,792,289 ms before", and counted as abandoned attempts)."""


class _ExpiredUnanswered(Exception):
    """A request past its client's deadline, found while this ingress is behind: dropped, not answered."""


class _AbandonedUnanswered(_ExpiredUnanswered):
    """An attempt its client gave up on (``Inferbus-Attempt-Deadline-Unix-Ms``), found while this ingress is behind:
    dropped, not answered (counted in ``attempts_abandoned`` only)."""


class _Resent(msgspec.Struct):
    """What :meth:`Ingress._forward` reads of a NATS message (``data``, ``reply``), for a request sent again."""

    data: bytes
    reply: str


_RESEND_MIN_BUDGET_S = 0.005
"""A request whose worker died holding it is sent again only with more than this left of its budget (s): less is
spent before a worker could answer (a hop there and back on a loaded host)."""
_MAX_RESENDS = 3
"""How many times one request is sent again after workers died holding it: a request the deaths make a suspect is
refused after its second (``Ingress._note_deaths``); this bounds the rest (each of a model's workers killed in turn
by other requests)."""


class Pending(msgspec.Struct):
    """A request forwarded to a worker and not yet settled, by forward sequence number (a ``msgspec.Struct``
    for its C ``__init__``)."""

    worker_id: str
    reply: str
    deadline: float
    t_fwd: float
    cache_key: str | None
    ttl_ms: int
    content_type: str | None
    request_id: str | None
    """The request id (the ``Inferbus-Request-Id`` header, else the body's ``id`` as the header would carry it):
    the key of the request-id index (``Ingress._by_rid``, which :meth:`Ingress._pop` cleans) and the done memory,
    and the header of every reply the ingress makes for it."""
    model_key: str = ""
    probe: bool = False
    """Sent as the worker's circuit-breaker probe (HALF_OPEN)."""
    hedge: _Hedge | None = None
    body: bytes = b""
    """The request's body as it came (a reference, not a copy): what identifies a request that kills its worker
    when it has neither a request id nor a cache key (:meth:`Ingress._note_deaths`)."""
    hdrs: dict | None = None
    """The request's headers as they came (a reference), with ``mv``: what sending it again takes when its worker
    dies or stops holding it (:meth:`Ingress._resend`; a hedged request's first copy is sent again unhedged, when no
    other copy of it is pending); None for a copy that is not sent again (a hedge's, the colocated worker's
    in-process one)."""
    mv: object = None
    """The model version it was forwarded for (:class:`~inferbus.actors._repository.ModelVersion`)."""
    resends: int = 0
    """Times it was sent again after a worker died holding it (at most ``_MAX_RESENDS``)."""
    waited: bool = False
    """The sweep found it missing past its deadline + ``pending_grace_s`` and waited for its worker's next report
    or notice (:meth:`Ingress._verdict_waits`; counted once in ``counts.verdicts_waited``)."""
    endpoint: str = "infer"
    """The micro endpoint that took it (``infer``, or ``infer_at`` for a request sent to this ingress alone): an error
    answered for it, by the ingress or by its worker, counts in that endpoint's ``$SRV.STATS``."""
    span: object = None
    """Its ingress span to be (:class:`~inferbus.actors._tracing.Traced`: tracing on, the request sampled), made when
    this copy settles; None otherwise. One copy of a hedged request holds it: the first, until the copy that answers
    takes it (:meth:`Ingress._take_span`), or a copy that cannot answer hands it to one that can (a hedge sent on a
    refusal, the other copy of one whose worker died)."""
    stages: dict | None = None
    """The ingress's stages (µs) of a traced request, for its span; None otherwise."""


class _Deferred(msgspec.Struct):
    """A miss for the colocated worker held back while more requests wait in the subscription: computed with
    them at the burst's end (:meth:`Ingress._flush_burst`, :meth:`Worker.run_burst`)."""

    w: object
    """The router's state of the colocated worker (:class:`~inferbus.actors._router.WorkerState`)."""
    reply: str
    body: bytes
    decoded: tuple
    model_key: str
    deadline: float
    dl_ms: float
    t_fwd: float
    term: int
    cache_key: str | None
    ttl_ms: int
    ct: str | None
    worker_rid: str | None
    """The request id (as :attr:`Pending.request_id`); the worker's name for it."""
    dkey: tuple | None
    stages: dict
    probe: bool
    endpoint: str = "infer"
    """As :attr:`Pending.endpoint`."""
    span: object = None
    """As :attr:`Pending.span`."""


SERVER_METADATA = ServerMetadata(name="inferbus", version=__version__, extensions=["model_repository"])
"""What ``<p>.server`` answers (OIP v2 server metadata): ``model_repository`` is the extension of docs/models.md's
load, unload and default writes."""


def model_metadata(model: Model, version: str | None = None) -> ModelMetadata:
    """OIP v2 model metadata of ``version`` (None: the default version; -1 for variable dimensions). Raises
    KeyError for a version the model does not serve. ``parameters``:
    ``default_version`` names the version that serves requests naming none (it can change at run time,
    docs/models.md); ``max_batch_size`` (rows a worker merges into one zero-wait batch, 0 = none) and
    ``cache_ttl_ms`` (how long an answer is cached, 0 = not cached) are the model's config.json, as are
    ``hedge_after_ms`` (its hedge policy as written: a number of ms, ``"pNN"``, ``"auto"`` or ``"off"``) and
    ``description`` (its text) when it has them."""
    mv = model.version(version)
    if mv is None:
        raise KeyError(version)
    cfg = model.config
    params = {"default_version": model.version(None).version, "max_batch_size": cfg.max_batch_size,
              "cache_ttl_ms": cfg.cache_ttl_ms}
    if cfg.hedge_after_ms is not None:
        params["hedge_after_ms"] = cfg.hedge_after_ms
    if cfg.description:
        params["description"] = cfg.description
    if version is not None:
        params["version"] = mv.version
    return ModelMetadata(
        name=model.name, versions=sorted(model.versions, key=int), platform=cfg.platform,
        inputs=[TensorMetadata(t.name, t.datatype, list(t.shape)) for t in mv.inputs],
        outputs=[TensorMetadata(t.name, t.datatype, list(t.shape)) for t in mv.outputs],
        parameters=params,
    )


def _with_problems(meta: ModelMetadata, problems: dict[str, dict]) -> ModelMetadata:
    """``meta`` with ``parameters.versions_not_served``: per version of it that some live worker does not serve
    because its files are not the pinned ones, ``{"ready": <another worker serves it>, "workers": {id: reason}}``
    (:meth:`IngressModels.version_problems`); ``meta`` itself when there is none."""
    mine = {k.rpartition(":")[2]: p for k, p in problems.items() if k.rpartition(":")[0] == meta.name}
    if mine:
        meta.parameters = {**(meta.parameters or {}), "versions_not_served": mine}
    return meta


_INPUT_FIELDS = tuple(f"inputs[{i}]" for i in range(16))  # the error field of input i, made once


def _check_bytes_elements(t, shape, limit: int, i: int) -> None:
    """Refuse BYTES input ``t`` (``inputs[i]``) whose ``shape`` holds more than ``limit`` elements, before any is read.

    Raises:
        PayloadTooLarge: more than ``limit`` elements (``field`` = ``inputs[i]``).
    """
    n = math.prod(shape)
    if n > limit:
        raise PayloadTooLarge(f"BYTES input {t.name!r} has {n} elements, over the limit of {limit} "
                              f"(inferbus up --max-bytes-elements)", field=f"inputs[{i}]")


def _shape_mismatch(t, info, i: int):
    """Raise InvalidArgument: input ``t`` (the ``i``-th) has a shape that does not fit the model's ``info``."""
    raise InvalidArgument(f"input {t.name!r} shape {list(t.shape)} does not fit {list(info.shape)}",
                          field=f"inputs[{i}].shape")


def _rows(shape: tuple) -> str:
    """``3 rows``, ``1 row``, ``no rows`` (a shape with no dimensions) for a shape's first dimension."""
    return "no rows" if not shape else f"{shape[0]} row{'' if shape[0] == 1 else 's'}"


def _check_rows_agree(req, arrays: list, model_name: str, max_batch_size: int) -> None:
    """Raise InvalidArgument naming the first input (``inputs[i].shape``) whose rows (first dimension) differ from
    the first input's, for a model of ``max_batch_size`` > 0, whose inputs all have the batch first (its metadata's
    leading -1): Triton refuses such a request ("batch size does not match other inputs"). Served, it was answered
    with outputs of different row counts, and a worker could not merge it with others."""
    rows = arrays[0].shape[:1]
    for i, a in enumerate(arrays):
        if a.shape[:1] != rows:
            first, t = req.inputs[0], req.inputs[i]
            raise InvalidArgument(
                f"input {t.name!r} has {_rows(a.shape)} (shape {list(t.shape)}) but input {first.name!r} has "
                f"{_rows(rows)} (shape {list(first.shape)}): model {model_name} "
                f"has max_batch_size {max_batch_size}, so the first dimension of every input is the batch and "
                f"must be the same", field=f"inputs[{i}].shape")


def _l2_answer(value, mv) -> InferResponse | None:
    """The answer an L2 entry holds for model version ``mv``, or None when ``value`` is none: not bytes, not a
    MessagePack OIP response, or one of another model or version. An unreadable entry was put in L1 and answered as
    the client's error (INVALID_ARGUMENT "invalid response", or INTERNAL for a non-bytes value) until its TTL ran out
    (a fresh-user trial: 10-19 of 30 asks); a Valkey that anyone can write to, or a junk ``<p>._cache.fill``, is
    enough. The caller counts it (``l2_bad_values``) and forwards the request as a miss."""
    if not isinstance(value, bytes):
        return None
    try:
        resp = decode_response(value)
    except InferbusError:
        return None
    if resp.model_name != mv.name or resp.model_version != mv.version:
        return None
    return resp


def _reply_ct(request_ct: str | None) -> dict:
    """``Content-Type`` header of a metadata or health reply: the encoding :func:`encode` chose for the request."""
    from ..schemas._codec import JSON, MSGPACK, is_json

    return {H.CONTENT_TYPE: JSON if is_json(request_ct) else MSGPACK}


def _outcome(item) -> str:
    """Breaker verdict of a completion (see _breaker): ok / client error / server error / neutral."""
    if item.ok:
        return OK
    if item.server_error:
        return SERVER_ERROR
    if item.code in _CLIENT_CODES:
        return CLIENT_ERROR
    return NEUTRAL


def _with_body_id(err: InferbusError, req) -> InferbusError:
    """``err`` carrying the request body's ``id`` for its error reply (used when no header named one)."""
    if isinstance(req.id, str) and req.id:
        err.request_id = H.header_value(req.id)
    return err


def _sniffed_json(body: bytes) -> str | None:
    """``application/json`` for a body sent without ``Content-Type`` that is JSON by its first byte (the codec's
    own test, :func:`~inferbus.schemas._codec.looks_like_json`: never a MessagePack request), so that the error
    reply (the body was taken as MessagePack and refused) is one a JSON-only client can read; else None."""
    return JSON if looks_like_json(body) else None


def _error_content_type(ct: str | None, body: bytes) -> str | None:
    """The Content-Type of an error reply to a request with ``ct`` (None: absent) and ``body``: JSON when the
    request said JSON, or when its body is JSON by its first byte whatever else it said (``text/plain``, none;
    docs/wire.md); else ``ct``."""
    if is_json(ct):
        return ct
    return _sniffed_json(body) or ct


def _can_stop_apart(nc, sub) -> bool:
    """Whether nats-py has the internals :meth:`Ingress._stop_infer` uses (checked at 2.9-2.16; the round trip's
    are :func:`inferbus.bus._connect._can_drain_apart`'s)."""
    return _can_drain_apart(nc) and all(hasattr(sub, a) for a in ("_id", "_cb", "_pending_queue", "_stop_processing"))


async def _round_trip(nc, timeout_s: float) -> bool:
    """Whether the server answered a PING sent after all this connection had written, within ``timeout_s``
    (:func:`inferbus.bus._connect._round_trip`: the PONG's future left to the PONG, not ``nc.flush(timeout)``).
    False, not raised, for a connection closed or reconnecting."""
    if nc.is_closed or not nc.is_connected or timeout_s <= 0:
        return False
    return await _server_round_trip(nc, asyncio.get_running_loop().time() + timeout_s, nc.stats["reconnects"])


async def _close_quietly(nc) -> None:
    """Close ``nc`` (:func:`inferbus.bus.close_connection`: never raises for a connection already gone), logging
    an error instead of raising it."""
    try:
        await close_connection(nc)
    except asyncio.CancelledError:
        pass
    except Exception as exc:
        log(f"closing the NATS connection: {exc!r}")


class Ingress:
    """The ingress actor; ``run()`` serves until cancelled."""

    def __init__(self, config: IngressConfig) -> None:
        self.config = config
        self.subjects = Subjects(config.bus.prefix)
        # the versions pinned at the node's start must be readable; another model or version whose folder cannot be
        # read now (a stray or half-edited file added while serving) is left out, as a restarted worker does: a
        # strict read made a restarted ingress refuse to start (exit 2) in a loop until the node's restart intensity
        # stopped the whole node (a fresh-user trial: a junk version folder plus one kill -9 of an ingress, 6 of 6)
        self.repo = ModelRepository(config.models_dir, list(config.models) or None,
                                    pinned_versions(config.pins) if config.pins else None, config.configs)
        for name, why in self.repo.unreadable.items():
            log(f"ingress {config.ingress_id}: not serving model {name}: its folder cannot be read: {why}")
        if config.pins:  # the versions its node served at start, not a folder staged on disk since and not loaded (a
            # fresh-user trial: a restarted ingress served such a version as its default, which no worker had loaded)
            self.repo.keep_pinned(config.pins)
        self.router = Router(health_timeout_s=config.health_timeout_s,
                             forget_after_s=forget_after_s(config.health_timeout_s) if config.forget_after_s is None
                             else config.forget_after_s, max_error_rate=config.max_error_rate,
                             min_window_requests=config.min_window_requests, breaker_failures=config.breaker_failures,
                             breaker_open_s=config.breaker_open_s, breaker_probes=config.breaker_probes)
        self.limiter = RateLimiter(config.rate_limit_per_s, config.rate_burst, config.client_rate_limit_per_s,
                                   config.client_rate_burst, config.max_clients)
        self.hedge_budget = HedgeBudget(config.hedge_budget_ratio)
        self.l1 = L1Cache(config.l1_entries, config.l1_max_bytes)
        self._raw_index = L1Cache(config.l1_entries)
        """(model key, JSON?, request body bytes) → (cache key, request id) of a body validated before, for
        bodies up to ``RAW_INDEX_MAX_BODY_BYTES``; entries live as long as the model's cache TTL."""
        self._layouts = RequestLayouts()
        """(model key, body length) → the byte layout of a MessagePack request validated before: a later body that
        differs only in its tensors' raw bytes is taken apart by slicing (:mod:`inferbus.actors._layout`)."""
        self.fencing = Fencing(self.subjects)
        """Fencing term from the primary region manager's heartbeats, stamped on forwarded requests."""
        self.router.region = config.region
        self.pending: dict[int, Pending] = {}
        self._deaths: dict[tuple, tuple[int, float, str, str | None]] = {}
        """Requests held by workers that died (:meth:`_note_deaths`), by body digest, request id and cache key:
        ``(deaths, forgotten after (monotonic s), the last death's reason, the refusal when it is taken for a query of
        death else None)``, in the order of that time (an entry updated is inserted again), emptied of the forgotten
        ones by each sweep (:meth:`_forget_deaths`). Shared with the other ingresses (:meth:`_share_deaths`)."""
        self._crashed_until: dict[str, float] = {}
        """Model version key → until when (monotonic s) a crash of a worker running it is remembered here (its own
        or a peer's): a colocated ingress sends that model's requests to another process meanwhile
        (:meth:`_forward`)."""
        self._deaths_changed: list[tuple] = []
        """Keys of :attr:`_deaths` the last crash changed, for :meth:`_share_deaths` to send."""
        self._by_rid: dict[str, int] = {}
        """Request id → seq of its newest pending forward (sticky retries)."""
        self._parked: list[tuple[Pending, InferbusError]] = []
        """Requests whose worker died holding them, waiting for a live worker of their model (:meth:`_resend`)."""
        self._done_rids: OrderedDict[str, tuple[str, str, float]] = OrderedDict()
        """Request id → (model key, worker id, expiry) of a forward that completed successfully, for
        ``recent_rid_ttl_s`` (LRU, ``recent_rid_entries``): a later copy goes to the worker holding its result."""
        self._seq = itertools.count(1)
        self.nc = None
        self.redis = None
        self.l2_breaker = CircuitBreaker(config.l2_breaker_failures, config.l2_breaker_open_s, 1,
                                         on_state=self._on_l2_breaker)
        """Turns L2 lookups off while they fail in a row (a frozen, lost or refusing Valkey): each would cost its
        miss ``l2_timeout_ms`` (2 ms) for nothing; a fresh-user trial's SIGSTOPped Valkey cost every miss that."""
        self._l2_off_since = 0.0
        self._l2_skipped_at_open = 0
        self.l2_outages = 0
        """Times the L2 lookups turned off (the breaker CLOSED → OPEN); a failed probe, which opens it again, is not
        another (the breaker's own ``trips`` counts those too: a trial's one 9.6 s freeze read 5)."""
        self.counts = {"requests": 0, "ok_forwarded": 0, "errors": 0, "l1_hits": 0, "l2_hits": 0,
                       "l2_timeouts": 0, "l2_errors": 0, "l2_skipped": 0, "l2_bad_values": 0, "rate_limited": 0, "too_large": 0,
                       "unavailable": 0,
                       "pin_refused": 0,
                       "hedges": 0, "hedge_wins": 0, "hedge_cancels": 0, "sticky_retries": 0, "lost": 0,
                       "lost_in_reconnect": 0, "lost_while_behind": 0, "lost_while_busy": 0, "behind_round_trips": 0,
                       "lost_while_worker_behind": 0, "expired_on_arrival": 0, "expired_unanswered": 0,
                       "attempts_abandoned": 0,
                       "local_forwards": 0, "suspect_reroutes": 0, "peer_sticky_retries": 0,
                       "held": 0, "hedges_on_refusal": 0, "backlog_shed": 0, "l2_fill_too_large": 0, "l1_raw_hits": 0,
                       "hedge_losers_dropped": 0,
                       "run_now": 0, "burst_deferred": 0, "burst_runs": 0, "query_of_death": 0, "suspects_alone": 0,
                       "resent_after_death": 0, "quiet_reroutes": 0, "verdicts_waited": 0, "crash_suspects_heard": 0,
                       "deaths_shared_in": 0, "crash_checks": 0, "workers_forgotten": 0}
        self._meta_cache = {m.name: encode(model_metadata(m)) for m in self.repo}
        self._inputs = {}
        self._outputs = {}
        datatypes = set()
        for m in self.repo:
            for mv in m.versions.values():
                self._inputs[mv.key] = {t.name: t for t in mv.inputs}
                self._outputs[mv.key] = {t.name for t in mv.outputs}
                datatypes.update(t.datatype for t in (*mv.inputs, *mv.outputs))
        # ml_dtypes for a BF16 model now, not on its first request (a 1.3 s stall of every request in flight)
        preload_datatypes(datatypes)
        self._model_hedge: dict[str, tuple | None] = {}
        for m in self.repo:
            try:
                policy = parse_policy(m.config.hedge_after_ms)
            except HedgePolicyError as exc:
                log(f"ingress {config.ingress_id}: model {m.name}: {exc}; hedging off")
                policy = None
            for mv in m.versions.values():
                self._model_hedge[mv.key] = policy
        self._policy_cache: dict[str, tuple | None] = {}
        self._latency: dict[str, ForwardStats] = {}
        """Model version → its latency window (hedging) and forward-latency histogram (metrics), :meth:`_observe`:
        the versions served (or with a forward completed since their unload)."""
        self._retired: dict[str, ForwardStats] = {}
        """Model version unloaded → its forward-latency counts (window emptied), kept for the life of the process so
        that its counters never go backwards (:meth:`_retire_forward_stats`); taken back into :attr:`_latency` when a
        forward of it completes again (:meth:`_forward_stats`). Bounded by the versions this process ever served
        (one small object each: the histogram's 16 counts, no latencies)."""
        self._l1_hits: defaultdict[str, int] = defaultdict(int)
        """Model version → requests answered from L1 (``counts.l1_hits`` by model; for ``--metrics-port``)."""
        self._l2_hits: defaultdict[str, int] = defaultdict(int)
        """Model version → requests answered from L2."""
        self._model_errors: defaultdict[tuple[str, str], int] = defaultdict(int)
        """``(model version, error code)`` → error answers to requests for a served model version, by the ingress
        or a worker (:meth:`_error` and :meth:`_count_worker_error` with a ``model_key``)."""
        self.max_request_bytes = config.max_request_bytes
        self._cache_version: dict[str, str] = {}
        """``name:version`` → the version as the result cache keys it (with its pin: :meth:`IngressModels._cache_tags`)."""
        self._repinned: dict[str, str] = {}
        """``name:version`` → its pin (digest), for each version re-pinned since this ingress started
        (:meth:`IngressModels._cache_tags`): forwards of its requests that want a cache fill carry the pin the entry is
        keyed with (``Inferbus-Pin``), and the colocated worker reads it here, so that an answer of the old files
        computed while the workers reload is not cached under the new pin."""
        self.versions_not_here: dict[str, dict[str, str]] = {}
        """Model → {version: why}: versions the serving state serves that this ingress cannot read (not in this
        host's model folder): requests for them get UNAVAILABLE here (another ingress may serve them), health says
        so; every version of a model whose default it cannot read (:meth:`IngressModels.apply`)."""
        self.model_ctl = IngressModels(self)
        """Model management: serving states, the region write gate, ``<p>.models.<model>.<op>``."""
        self.local_worker = None
        """The worker hosted in this process (colocated), handed requests in-process; None = every worker is remote."""
        self._infer_sub = None
        """The ``infer`` endpoint's subscription: its buffer of received, unhandled requests is the backlog."""
        self._done_sub = None
        """The subscription to ``<p>._done.<ingress>`` (the workers' completion notices), set in run."""
        self._at_subs: list = []
        """The subscriptions to ``<p>.ingresses`` (the probe) and to the reads and writes at this ingress alone
        (``<p>.ingresses.<ingress_id>.{health,server,models,models.>}``), set in run; taken off first when the actor
        stops."""
        self._at_infer_sub = None
        """The ``infer_at`` endpoint's subscription (``<p>.ingresses.<ingress_id>.infer.>``: a client's retry sent to
        this ingress alone), set in run; drained and refused as the ``infer`` one when the actor stops."""
        self._load_sub = None
        """The subscription to ``<p>._load`` (the workers' load reports), set in run."""
        self._error_counters: dict = {}
        """Micro endpoint name → its ``$SRV.STATS`` error counter (:func:`endpoint_error_counter`), set in run."""
        self._behind_seen = 0
        self._behind_at = float("-inf")
        self._reconnects_seen = 0
        self._reconnected_at = float("-inf")
        """When a sweep last saw this ingress's NATS connection re-established (monotonic s): requests forwarded
        before it whose completion never came are not held against their worker (:meth:`_sweep`)."""
        self._forget_check_at = 0.0
        """When the sweep next looks for workers to forget (monotonic s; :meth:`_forget`)."""
        self._l2_inflight = 0
        """L2 lookups running (each holds a request that will be forwarded): counted with ``pending``."""
        self._burst: list[_Deferred] = []
        """Misses for the colocated worker held back while more requests waited in the subscription (a burst),
        run together when it ends (:meth:`_flush_burst`)."""
        self._burst_dkeys: set = set()
        self._burst_cost_us = 0.0
        """The burst's estimated compute (the worker's EWMA per request, summed), kept within one inline slice."""
        self._burst_guard = False
        """A loop callback is scheduled to run a burst left over (see :meth:`_defer`)."""

        self.busy_poll = BusyPoll(config.busy_poll_us) if config.busy_poll_us > 0 else None
        """Keeps the loop polling after each request (``busy_poll_us``); run by the local worker when colocated."""
        self._tracing = None
        """The process's :class:`~inferbus.actors._tracing.Tracing` with ``trace_otlp_endpoint``, else None (and
        OpenTelemetry is not imported): the request path tests it once per request."""
        if config.trace_otlp_endpoint:
            from ._tracing import tracing_for

            self._tracing = tracing_for(config.trace_otlp_endpoint, config.trace_ratio, config.ingress_id)

    def attach_local_worker(self, worker) -> None:
        """Host ``worker`` (a :class:`~inferbus.actors._worker.Worker` on this event loop) as the local worker.

        Requests routed to it are handed over in-process (no forward publish; ``counts.local_forwards``),
        its completion notices to this ingress come back in-process, and hedge cancellations reach it
        directly. The router prefers it on equal expected delay. It stays a normal worker for other
        ingresses (its own subject, its load reports). Call before :meth:`run`.
        """
        self.local_worker = worker
        worker.local_pins = self._repinned  # the pins this ingress keys re-pinned versions with (shared, read-only)
        self.router.local_worker_id = worker.config.worker_id
        worker.attach_local_ingress(self.config.ingress_id, self.settle)
        # one busy poller per event loop: the worker runs it, both actors' request handlers poke it, and it
        # stops spinning while the worker's inference thread has work
        shared = worker.busy_poll or self.busy_poll
        if shared is not None:
            shared.pause = worker.thread_has_work
        worker.busy_poll = self.busy_poll = shared

    # ---- hot path -----------------------------------------------------------------------------
    async def _on_infer(self, msg, endpoint: str = "infer") -> None:
        if StopSignal.at is not None:
            # asked to stop: give the loop a turn, so that its handler cancels this actor now, not after the
            # subscription's whole buffer (StopSignal)
            await asyncio.sleep(0)
        t0 = time.monotonic()
        if self.busy_poll is not None:
            self.busy_poll.poke(t0)
        reply = msg.reply
        if not reply:
            return
        hdrs = msg.headers or {}
        ct = hdrs.get(H.CONTENT_TYPE)
        self.counts["requests"] += 1
        if len(reply) > _REPLY_CHARS_UNCHECKED and len(reply.encode()) > MAX_REPLY_BYTES:
            # forwarded with this reply subject, the line would be longer than the client's own and could be over
            # the server's max_control_line: the server would close this ingress's connection (a query of death)
            self.counts["errors"] += 1
            await self._error(reply, InvalidArgument(
                f"the reply subject is {len(reply.encode())} bytes, over the limit of {MAX_REPLY_BYTES}: use a "
                f"shorter inbox", field="reply"), _error_content_type(ct, msg.data), hdrs.get(H.REQUEST_ID), endpoint)
            return
        sub = self._infer_sub
        if sub is not None and sub.pending_msgs >= SILENT_EXPIRY_BACKLOG:
            # behind its own input: the workers' reports wait behind the backlog, their age is this ingress's lag
            self.router.behind_until = t0 + self.config.health_timeout_s
        if sub is not None and (sub.pending_msgs > self.config.max_backlog_msgs
                                or sub.pending_bytes > self.config.max_backlog_bytes):
            # more requests wait behind this one than the bound: refuse at once (cheap, before any decoding)
            # instead of letting the backlog grow until nats-py drops requests silently (slow consumer)
            self.counts["backlog_shed"] += 1
            self.counts["errors"] += 1
            err = ResourceExhausted(f"ingress {self.config.ingress_id} has {sub.pending_msgs} requests waiting "
                                    f"(bound {self.config.max_backlog_msgs}); retry later", retry_after_ms=10)
            await self._error(reply, err, ct, hdrs.get(H.REQUEST_ID), endpoint)
            if self._tracing is not None:
                self._tracing.error(hdrs, t0, self._served_key(msg.subject), self.config.ingress_id, err,
                                    "backlog_shed")
            return
        # the request id header is read only for an error reply (the answered path reads it where it needs it)
        try:
            await self._handle(msg, hdrs, ct, t0, endpoint)
        except _ExpiredUnanswered as exc:
            if type(exc) is _ExpiredUnanswered:
                self.counts["expired_unanswered"] += 1
            if self._tracing is not None:
                self._trace_unanswered(msg, hdrs, t0, type(exc) is _ExpiredUnanswered)
        except InferbusError as err:
            self.counts["errors"] += 1
            await self._error(reply, err, _error_content_type(ct, msg.data),
                              hdrs.get(H.REQUEST_ID) or getattr(err, "request_id", None), endpoint,
                              self._served_key(msg.subject))
            if self._tracing is not None:
                self._tracing.error(hdrs, t0, self._served_key(msg.subject), self.config.ingress_id, err)
        except Exception as exc:  # never let a request kill the actor
            self.counts["errors"] += 1
            log(f"ingress {self.config.ingress_id}: internal error: {exc!r}")
            err = Internal(f"ingress failed: {type(exc).__name__}: {exc}")
            await self._error(reply, err, ct, hdrs.get(H.REQUEST_ID), endpoint, self._served_key(msg.subject))
            if self._tracing is not None:
                self._tracing.error(hdrs, t0, self._served_key(msg.subject), self.config.ingress_id, err)
        if self._burst and (sub is None or not sub.pending_msgs):  # the burst ended: run what it held back
            await self._flush_burst()

    def _trace_unanswered(self, msg, hdrs: dict, t0: float, expired: bool) -> None:
        """The span of a request dropped without an answer behind a backlog (:class:`_ExpiredUnanswered`, or
        :class:`_AbandonedUnanswered` when not ``expired``), with the error its client sees by its own timeout."""
        if expired:
            err, outcome = DeadlineExceeded("past the client's deadline on arrival; dropped without an answer "
                                            "behind a backlog"), "expired_unanswered"
        else:
            err, outcome = Unavailable("an attempt its client gave up; dropped without an answer behind a "
                                       "backlog"), "attempt_abandoned"
        self._tracing.error(hdrs, t0, self._served_key(msg.subject), self.config.ingress_id, err, outcome)

    async def _on_infer_at(self, msg) -> None:
        """A request on ``<p>.ingresses.<ingress_id>.infer.<model>[.<version>]`` (sent to this ingress only: a client's
        retry after an attempt with no answer, :meth:`inferbus.client.Client.request`): served as the same request on
        ``<p>.infer.<model>[.<version>]``."""
        msg.subject = self._infer_head + msg.subject[len(self._at_head):]
        await self._on_infer(msg, "infer_at")

    async def _on_read_at(self, msg) -> None:
        """A read (``health``, ``server``, ``models``, ``models.<model>[.<version>][.ready]``) or a model-management
        write (``models.<model>.<op>``) on ``<p>.ingresses.<ingress_id>.<...>``, sent to this ingress alone (a
        client's retry, :meth:`inferbus.client.Client.request`): answered as the same request on ``<p>.<...>``."""
        rest = msg.subject[len(self._at_root):]
        msg.subject = f"{self.subjects.prefix}.{rest}"
        if rest == "health":
            await self._on_health(msg)
        elif rest == "server":
            await self._on_server(msg)
        else:
            await self._on_models(msg)

    async def _on_ingresses(self, msg) -> None:
        """``<p>.ingresses``: answer this ingress's id (every serving ingress answers; the first answer comes from
        one that is live and keeping up), unless it is behind its own input (``SILENT_EXPIRY_BACKLOG`` requests or
        more waiting in its ``infer`` subscription): its probe would be answered between requests while a retry sent
        here would wait behind the whole backlog."""
        sub = self._infer_sub
        if msg.reply and (sub is None or sub.pending_msgs < SILENT_EXPIRY_BACKLOG):
            try:
                await self.nc.publish(msg.reply, self.config.ingress_id.encode())
            except Exception:
                pass

    async def _on_infer_bare(self, msg) -> None:
        """A request on ``<p>.infer`` or ``<p>.ingresses.<ingress_id>.infer`` (no model named): INVALID_ARGUMENT saying
        where to send it."""
        if msg.reply:
            hdrs = msg.headers or {}
            await self._error(msg.reply, InvalidArgument(
                f"subject {msg.subject!r} names no model: send inference requests to "
                f"{msg.subject}.<model>[.<version>]", field="model"),
                _error_content_type(hdrs.get(H.CONTENT_TYPE), msg.data), hdrs.get(H.REQUEST_ID))

    async def _send(self) -> None:
        """Send what this request published: in one write at once when no other request waits in the
        subscription, else by nats-py's flusher after the waiting ones (their messages share the write);
        :func:`inferbus.bus.send_pending`."""
        sub = self._infer_sub
        await send_pending(self.nc, now=sub is None or not sub.pending_msgs)

    async def _error(self, reply: str, err: InferbusError, ct: str | None, rid: str | None,
                     endpoint: str = "infer", model_key: str | None = None) -> None:
        """Reply ``err`` to ``reply``, counted in the ``$SRV.STATS`` (``num_errors``, ``last_error``) of the
        micro endpoint that took the request: ``infer`` (inference), ``infer_at`` (inference sent to this ingress
        alone) or ``model`` (``<p>.models.<name>[.<op>]``); with ``model_key`` (an inference request for a model
        version this ingress serves), also by version and code (:attr:`_model_errors`)."""
        count = self._error_counters.get(endpoint)
        if count is not None:
            count(f"{err.code.value}: {err.message}")
        if model_key is not None:
            self._model_errors[model_key, err.code.value] += 1
        eh, eb = error_message(err, ct, rid)
        try:
            await self.nc.publish(reply, eb, headers=eh)
        except Exception as exc:  # e.g. a reply subject the server refuses; nothing else to tell
            log(f"ingress {self.config.ingress_id}: error reply failed: {exc!r}")

    async def _handle(self, msg, hdrs: dict, ct: str | None, t0: float, endpoint: str = "infer") -> None:
        if hdrs:
            if (bad := H.miscased_header(hdrs)) is not None:
                raise InvalidArgument(f"header {bad[0]!r} is not {bad[1]!r}: NATS header names are case-sensitive "
                                      f"(ADR-4), so it would be ignored; send {bad[1]!r}", field=bad[1])
            if H.ATTEMPT in hdrs:
                H.attempt_number(hdrs[H.ATTEMPT])  # a malformed one is refused, not guessed at
            rid = hdrs.get(H.REQUEST_ID)  # every reply echoes it in a header: bounded (a body's id by its schema)
            if rid is not None and len(rid) > MAX_REQUEST_ID_CHARS:
                raise InvalidArgument(f"the request id is {len(rid)} characters, over the limit of "
                                      f"{MAX_REQUEST_ID_CHARS}", field=H.REQUEST_ID)
        deadline = H.deadline_from_headers(hdrs, t0, self.config.default_timeout_ms, strict=True)
        client_deadline = hdrs.get(H.DEADLINE_UNIX_MS)
        if client_deadline is not None:  # the client's own clock: time spent queued in the bus counts
            deadline = self._client_deadline(client_deadline, deadline, t0)
        attempt_deadline = hdrs.get(H.ATTEMPT_DEADLINE_UNIX_MS)
        # the SDK's attempt: given up and sent again elsewhere past it; near it, perhaps (asks the peers, as a retry)
        ask_peers = attempt_deadline is not None and self._check_attempt(attempt_deadline)
        if deadline <= t0:  # (a budget of 0 or less: the client's deadline was checked above)
            self.counts["expired_on_arrival"] += 1
            raise DeadlineExceeded("the request's budget (Inferbus-Timeout-Ms) was already spent on arrival")
        model_name, version = self.subjects.parse_infer(msg.subject)
        model = self.repo.get(model_name)
        if model is None:
            if (problem := name_problem(model_name)) is not None:  # no repository serves it: as the SDK says it
                raise InvalidArgument(problem, field="model")
            if model_name in self.versions_not_here or self._served_elsewhere(model_name, version):
                raise self._not_here(model_name, version)
            raise NotFound(f"unknown model {model_name!r}", field="model")
        mv = model.version(version)
        if mv is None:
            if version and "." in version:  # no version holds a dot: the subject has tokens past the version
                sent = self._at_head + msg.subject[len(self._infer_head):] if endpoint == "infer_at" else msg.subject
                raise InvalidArgument(f"subject {sent!r} has tokens after the version: send inference requests "
                                      f"to {sent[:-len(version) - 1]}[.<version>]", field="model_version")
            if version in self.versions_not_here.get(model_name, ()) or self._served_elsewhere(model_name, version):
                raise self._not_here(model_name, version)
            if (problem := version_problem(version)) is not None:
                raise InvalidArgument(problem, field="model_version")
            raise NotFound(f"model {model_name!r} has no version {version!r}; versions: "
                           f"{', '.join(sorted(model.versions, key=lambda v: (len(v), v)))}", field="model_version")
        body = msg.data
        if len(body) > self.max_request_bytes:  # before the rate limits: a request that can never be served
            # takes no token, and its client is not told to retry after a wait
            self.counts["too_large"] += 1
            raise PayloadTooLarge(f"request body of {len(body)} bytes is over the limit of {self.max_request_bytes}")
        if self.limiter.enabled:
            cid = hdrs.get(H.CLIENT_ID)
            if cid is not None and len(cid) > H.MAX_CLIENT_ID_CHARS:  # (kept as a key of a bucket per client)
                raise InvalidArgument(f"{H.CLIENT_ID} of {len(cid)} characters is over the limit of "
                                      f"{H.MAX_CLIENT_ID_CHARS}", field=H.CLIENT_ID)
            refused = self.limiter.check(cid, t0)
            if refused is not None:
                self.counts["rate_limited"] += 1
                scope, wait_ms = refused
                raise ResourceExhausted(f"{scope} rate limit reached; retry in {wait_ms} ms", retry_after_ms=wait_ms)
        hedge_policy = self._model_hedge.get(mv.key)
        hv = hdrs.get(H.HEDGE)
        if hv is not None:
            hedge_policy = self._policy(hv)
        ttl_ms = model.config.cache_ttl_ms
        raw_key = None
        json_ct = ct is not None and is_json(ct)
        vtag = None
        # a body whose bytes are a request validated before but for its tensors' values is taken apart by
        # slicing (a layout, inferbus.actors._layout): no decode, no validation, its cache key from the payloads
        layout = None if json_ct else self._layouts.get(mv.key, body)
        if ttl_ms > 0:  # vtag is read below only when ttl_ms > 0
            vtag = self._cache_version.get(mv.key, mv.version)  # the version with its pin
            if layout is None and len(body) <= RAW_INDEX_MAX_BODY_BYTES:  # (a body of a layout is keyed by it)
                # the same body bytes for the same model version and encoding were decoded, validated and keyed
                # before: their cache key comes from the raw index, and an L1 hit skips decode, validation and key
                raw_key = (mv.key, vtag, json_ct, body)
                seen_before = self._raw_index.get(raw_key, t0)
                if seen_before is not None:
                    cached = self.l1.get(seen_before[0], t0)
                    if cached is not None:
                        self.counts["l1_hits"] += 1
                        self.counts["l1_raw_hits"] += 1
                        self._l1_hits[mv.key] += 1
                        await self._reply_cached(msg.reply, cached, seen_before[1], ct, hdrs, "l1", t0,
                                                 seen_before[0])
                        return
        raws = layout.payloads(body) if layout is not None else None
        key = None
        if raws is not None:
            if ttl_ms > 0:
                key = layout.cache_key(vtag, raws)
                if key is not None:  # an L1 hit builds no request
                    cached = self.l1.get(key, t0)
                    if cached is not None:
                        self.counts["l1_hits"] += 1
                        self._l1_hits[mv.key] += 1
                        await self._reply_cached(msg.reply, cached, layout.request_id, ct, hdrs, "l1", t0, key)
                        return
            req, arrays = layout.build(raws)
            out_names = layout.out_names
            t_dec = t_val = time.monotonic()
            if deadline <= t_val:
                raise _with_body_id(DeadlineExceeded(f"the request's budget ran out before the ingress took it "
                                                     f"apart ({fmt_ms((t_val - t0) * 1000)} ms)"), req)
        else:
            req = decode_request(body, ct)
            t_dec = time.monotonic()
            try:
                arrays, out_names = self._validate(req, mv, model_name, model.config.max_batch_size)
                t_val = time.monotonic()
                if deadline <= t_val:  # a large request can spend its whole budget in decoding and validation
                    raise DeadlineExceeded(f"the request's budget ran out while the ingress decoded and validated it "
                                           f"({fmt_ms((t_val - t0) * 1000)} ms)")
            except InferbusError as err:
                raise _with_body_id(err, req)
            if not json_ct:
                self._layouts.learn(mv.key, body, req, arrays, out_names, mv.name, vtag)
        # the idempotency key: the header, else the body's id as the header would carry it (one key for the
        # request-id index, the done memory and every reply; an id that is only whitespace has none)
        rid = hdrs.get(H.REQUEST_ID) or (H.header_value(req.id) or None if isinstance(req.id, str) and req.id
                                         else None)
        if ttl_ms > 0:
            if key is None:
                key = cache_key(mv.name, vtag, req.inputs, arrays, out_names, answers_raw(req), req.parameters)
                if raw_key is not None:
                    self._raw_index.put(raw_key, (key, req.id), ttl_ms, t_val)
                cached = self.l1.get(key, t_val)
                if cached is not None:
                    self.counts["l1_hits"] += 1
                    self._l1_hits[mv.key] += 1
                    await self._reply_cached(msg.reply, cached, req.id, ct, hdrs, "l1", t0, key)
                    return
            if self.redis is not None and self.l2_breaker.allows(t_val):
                if len(self.pending) + self._l2_inflight >= self.config.max_pending:
                    raise ResourceExhausted(f"ingress {self.config.ingress_id} has {len(self.pending)} requests "
                                            f"outstanding and {self._l2_inflight} cache lookups", retry_after_ms=10)
                self._l2_inflight += 1
                asyncio.create_task(self._l2_then_forward(msg, hdrs, ct, t0, t_dec, t_val, deadline, mv, key,
                                                          ttl_ms, req.id, rid, hedge_policy, (req, arrays),
                                                          self.l2_breaker.on_send(), ask_peers, endpoint))
                return
            if self.redis is not None:  # the breaker is open: a miss without the lookup
                self.counts["l2_skipped"] += 1
        try:
            await self._forward(msg, hdrs, ct, t0, t_dec, t_val, deadline, mv, key, ttl_ms, rid, hedge_policy,
                                time.monotonic(), (req, arrays), ask_peers=ask_peers, endpoint=endpoint)
        except InferbusError as err:  # a refusal (a query of death, no worker, ...): it carries the body's id too
            if rid is not None and getattr(err, "request_id", None) is None:
                err.request_id = rid
            raise

    def _served_key(self, subject: str) -> str | None:
        """The key (``name:version``) of the model version this ingress serves that an inference subject names (its
        default version for a subject without one), else None: read on the error path only, to count the error
        by model version (:attr:`_model_errors`) without keeping the request's model anywhere on the answered path."""
        try:
            name, version = self.subjects.parse_infer(subject)
            model = self.repo.get(name)
            mv = model.version(version) if model is not None else None
        except Exception:  # (a subject no request of a served model has)
            return None
        return mv.key if mv is not None else None

    def _served_elsewhere(self, model: str, version: str | None) -> bool:
        """A live worker serves ``model`` (version ``version``, or any when None) that this ingress does not know:
        nodes on one NATS with other model folders, before any write told this one (each node serves its own
        folder then). Read on the error path only; not once a write set the model's state (the state says then, and a
        version being unloaded is still on its workers for a moment: NOT_FOUND is the answer)."""
        st = self.model_ctl.states.get(model)
        if st is not None and st.revision > 0:
            return False
        ready = self.router.ready_models(time.monotonic())
        if version:
            return f"{model}:{version}" in ready
        return any(k.rpartition(":")[0] == model for k in ready)

    def _not_here(self, model: str, version: str | None) -> Unavailable:
        """UNAVAILABLE for a request of a served version of ``model`` this ingress cannot read
        (:attr:`versions_not_here`, or served by another node's workers): another ingress of the queue group may
        serve it, so the SDK's retry can (NOT_FOUND is not retried)."""
        missing = self.versions_not_here.get(model, {})
        why = missing.get(version) or next(iter(missing.values()), None) or \
            "workers of another node serve it, and it is not in this ingress's model folder"
        what = f"model {model!r} version {version}" if version else f"model {model!r} (its default version)"
        return Unavailable(f"{what} is served, but ingress {self.config.ingress_id} cannot read it: {why}; "
                           f"another ingress may (retry)", field="model_version", retry_after_ms=20)

    async def _await_workers(self, timeout_s: float = START_WORKERS_WAIT_S) -> None:
        """Before the infer endpoint is subscribed: wait until the router knows a live worker of each served model's
        default version (from their load reports), ``timeout_s`` at most. The router learns of workers only from
        those reports, so an ingress restarted by its node (a kill -9) that took requests at once answered them
        UNAVAILABLE "no live, healthy worker" for the ~10-100 ms before its first reports, with every worker live
        (a fresh-user trial: a raw client got 3 such answers in 1 of 3 kills at 200 requests/s)."""
        deadline = time.monotonic() + timeout_s
        wanted = {m.version(None).key for m in self.repo}
        while wanted and not wanted <= self.router.ready_models() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    def _check_attempt(self, raw: str) -> bool:
        """Refuse an attempt its client gave up on: ``raw`` (``Inferbus-Attempt-Deadline-Unix-Ms``, ms since the Unix
        epoch, the client's clock) passed by more than the clock-skew allowance (``DEADLINE_SKEW_MS``).

        The SDK sends a request again, same id, when an attempt gets no answer within its attempt timeout; the
        retry goes to an ingress that answers the probe. An attempt that waited in the socket of this ingress while
        it was stopped (SIGSTOP, a stalled VM) or starved, and is taken only after that, has been retried
        elsewhere: run here, it would compute the answer a second time on another worker, for a reply subject the
        client no longer reads (a fresh-user trial: 19-69 requests ran twice per 1-2 s SIGSTOP of one of two
        ingresses at 100-150 requests/s).

        Returns:
            Whether the attempt is within the clock-skew allowance of its deadline, on either side: its client may
            have sent it again already, so it is routed as a marked retry is, to the worker a peer ingress sent the
            retry to, if one did, where it joins that copy (the edge of an ingress's freeze).

        Raises:
            InvalidArgument: ``raw`` is not a number, or not within a day of this host's clock
                (:data:`_ATTEMPT_DEADLINE_SPAN_S`: seconds or microseconds for milliseconds, 0, infinity; ``field`` =
                the header's name).
            Unavailable: the attempt was given up (``retry_after_ms`` 0; the SDK, if it still waits because its
                clock runs behind this host's, sends the request again, and its last attempt carries no such
                deadline).
            _AbandonedUnanswered: the same, while 64 or more requests wait behind it (dropped without a reply).
        """
        ms = H.header_number(raw)
        left_s = H.wall_deadline_left_s(ms)  # (the allowance included: refused below 0, near it below 2 allowances)
        if not abs(left_s) < _ATTEMPT_DEADLINE_SPAN_S:  # NaN, inf, seconds or µs for ms, 0: no attempt's deadline
            raise InvalidArgument(f"{H.ATTEMPT_DEADLINE_UNIX_MS} must be milliseconds since the Unix epoch within a "
                                  f"day of this host's clock, got {str(raw)[:40]!r}", field=H.ATTEMPT_DEADLINE_UNIX_MS)
        if left_s >= 0:
            return left_s < 2 * H.DEADLINE_SKEW_MS / 1000.0
        self.counts["attempts_abandoned"] += 1
        sub = self._infer_sub
        if sub is not None and sub.pending_msgs >= SILENT_EXPIRY_BACKLOG:
            raise _AbandonedUnanswered
        raise Unavailable(f"the client gave this attempt up ({H.ATTEMPT_DEADLINE_UNIX_MS}) "
                          f"{-left_s * 1000 + H.DEADLINE_SKEW_MS:.0f} ms before this ingress took it (it waited in the "
                          f"bus while the ingress was stopped or behind, or the client's clock and this host's differ "
                          f"by more than {H.DEADLINE_SKEW_MS:.0f} ms): not run, its retry is answered elsewhere",
                          retry_after_ms=0)

    def _client_deadline(self, raw: str, deadline: float, t0: float) -> float:
        """The earlier of ``deadline`` (``Inferbus-Timeout-Ms`` from this handler's start, monotonic s) and the
        client's wall-clock deadline ``raw`` (``Inferbus-Deadline-Unix-Ms``, ms since the Unix epoch) plus the
        clock-skew allowance (``DEADLINE_SKEW_MS``, 50 ms).

        A relative budget starts when the handler does, so it cannot see the time a request spent in the
        server's or the socket's buffers while this ingress was behind: under overload every request then
        arrived with its client gone and was still decoded, forwarded and computed, and no answer came in time
        (a fresh-user trial: 0 of 100,000 at 20k/s on 2 cores). The client's clock can see it, and a request
        past its deadline is refused here for the price of a header.

        Raises:
            InvalidArgument: ``raw`` is not a number (``field`` = the header's name).
            DeadlineExceeded: the client's deadline passed more than the allowance before this handler started.
        """
        ms = H.header_number(raw)
        if ms != ms:
            raise InvalidArgument(f"{H.DEADLINE_UNIX_MS} must be milliseconds since the Unix epoch, got "
                                  f"{str(raw)[:40]!r}", field=H.DEADLINE_UNIX_MS)
        left_s = H.wall_deadline_left_s(ms)
        if left_s <= 0:
            self.counts["expired_on_arrival"] += 1
            sub = self._infer_sub
            if sub is not None and sub.pending_msgs >= SILENT_EXPIRY_BACKLOG:
                raise _ExpiredUnanswered
            if not math.isfinite(ms):  # "-inf": no time to tell, and no bus wait or clock skew to blame
                raise DeadlineExceeded(f"the client's deadline ({H.DEADLINE_UNIX_MS}) is {str(raw).strip()[:40]!r}, "
                                       f"before any time this ingress could take the request")
            raise DeadlineExceeded(
                f"the client's deadline ({H.DEADLINE_UNIX_MS}) had passed {-left_s * 1000 + H.DEADLINE_SKEW_MS:.0f} ms "
                f"before this ingress took the request (it waited in the bus while the ingress was behind, or the "
                f"client's clock and this host's differ by more than {H.DEADLINE_SKEW_MS:.0f} ms)")
        return min(deadline, t0 + left_s)

    def _validate(self, req, mv, model_name: str, max_batch_size: int = 0):
        """``req``'s inputs against ``mv``'s metadata: ``([numpy array per input, in request order], requested
        output names or None)``. ``max_batch_size``: the model's config (> 0: the first dimension of every input
        is the batch, so every input must have as many rows, as Triton requires).

        Raises:
            InvalidArgument: an unexpected, repeated or missing input, a datatype or shape that does not fit, an
                unknown output (naming the field); for a model of ``max_batch_size`` > 0, an input whose first
                dimension (its rows) differs from the first input's (``inputs[i].shape``).
            PayloadTooLarge: an input over ``max_tensor_bytes``; a BYTES input of more than ``max_bytes_elements``
                elements (from its shape, before any element is read).
        """
        spec = self._inputs[mv.key]
        arrays = []
        seen = set()
        max_tensor = self.config.max_tensor_bytes
        for i, t in enumerate(req.inputs):
            info = spec.get(t.name)
            if info is None:
                raise InvalidArgument(f"unexpected input {t.name!r}; model {model_name} takes "
                                      f"{', '.join(sorted(spec))}",
                                      field=f"inputs[{i}].name")
            if t.name in seen:
                raise InvalidArgument(f"input {t.name!r} given twice", field=f"inputs[{i}].name")
            seen.add(t.name)
            if t.datatype != info.datatype:
                raise datatype_mismatch(t.name, info.datatype, t.datatype, f"inputs[{i}].datatype")
            shape = t.shape
            if len(shape) != len(info.shape):
                _shape_mismatch(t, info, i)
            for d, n in zip(info.shape, shape):
                if d >= 0 and d != n:
                    _shape_mismatch(t, info, i)
            if t.datatype == "BYTES" and self.config.max_bytes_elements:
                try:
                    _check_bytes_elements(t, shape, self.config.max_bytes_elements, i)
                except PayloadTooLarge:
                    self.counts["too_large"] += 1
                    raise
            arr = input_to_numpy(t, field=_INPUT_FIELDS[i] if i < len(_INPUT_FIELDS) else f"inputs[{i}]")
            if max_tensor:
                nbytes = arr.nbytes if t.datatype != "BYTES" else sum(len(x) for x in arr.flat)
                if nbytes > max_tensor:
                    self.counts["too_large"] += 1
                    raise PayloadTooLarge(f"input {t.name!r} holds {nbytes} bytes, over the limit of {max_tensor}",
                                          field=f"inputs[{i}]")
            arrays.append(arr)
        if len(seen) != len(spec):
            missing = sorted(set(spec) - seen)
            raise InvalidArgument(f"missing input(s) {missing}", field="inputs")
        if max_batch_size > 0 and len(arrays) > 1:
            _check_rows_agree(req, arrays, model_name, max_batch_size)
        out_names = None
        if req.outputs:
            outs = self._outputs[mv.key]
            out_names = []
            for j, o in enumerate(req.outputs):
                if o.name not in outs:
                    raise InvalidArgument(f"unknown output {o.name!r}; model has {', '.join(sorted(outs))}",
                                          field=f"outputs[{j}].name")
                out_names.append(o.name)
        return arrays, out_names

    def _policy(self, value: str):
        try:
            return self._policy_cache[value]
        except KeyError:
            pass
        try:
            policy = parse_policy(value)
        except HedgePolicyError as exc:
            raise InvalidArgument(str(exc), field=H.HEDGE) from None
        if len(self._policy_cache) < _MAX_POLICY_CACHE:
            self._policy_cache[value] = policy
        return policy

    async def _l2_then_forward(self, msg, hdrs, ct, t0, t_dec, t_val, deadline, mv, key, ttl_ms, req_id, rid,
                               hedge_policy, decoded, probe: bool = False, ask_peers: bool = False,
                               endpoint: str = "infer") -> None:
        """Look ``key`` up in L2 (at most ``l2_timeout_ms``), then answer the hit or forward the miss; ``probe``: the
        lookup is the L2 breaker's probe (:meth:`CircuitBreaker.on_send`), whose verdict turns lookups back on or
        off; ``ask_peers``, ``endpoint``: as :meth:`_forward`'s."""
        try:
            cached, left_ms = None, -1
            left_s = max(deadline - time.monotonic(), 0.0)
            wait_s = min(self.config.l2_timeout_ms / 1000.0, left_s)
            lookup = asyncio.ensure_future(self._l2_get(f"{self.subjects.prefix}:{key}"))
            verdict = None  # the breaker's: True (Valkey answered), False (it failed), None (says nothing)
            try:  # shielded: wait_for would wait for the cancelled lookup, and redis-py can hold one that is
                # opening a pool connection past its cancellation (seen: 840 ms with a 30 ms L2 timeout)
                cached, left_ms = await asyncio.wait_for(asyncio.shield(lookup), wait_s)
                verdict = True
            except asyncio.TimeoutError:
                self.counts["l2_timeouts"] += 1
                verdict = False if wait_s < left_s else None  # a budget shorter than the L2 timeout: not Valkey's
            except Exception:
                self.counts["l2_errors"] += 1
                verdict = False
            finally:
                if verdict:
                    self.l2_breaker.on_success(probe)
                elif verdict is False:
                    self.l2_breaker.on_failure(time.monotonic(), probe)
                else:  # (cancelled too: the probe's slot is freed, or lookups would stay off for good)
                    self.l2_breaker.on_neutral(probe)
                self._l2_inflight -= 1  # from here the request is a pending forward (or answered)
                if not lookup.done():
                    lookup.cancel()
                    lookup.add_done_callback(lambda t: t.cancelled() or t.exception())
            resp = _l2_answer(cached, mv) if cached is not None else None
            if resp is not None:
                self.counts["l2_hits"] += 1
                self._l2_hits[mv.key] += 1
                # kept in L1 for what is left of the entry's TTL, not a whole TTL again: an answer found in L2 near
                # the end of its life was served by the ingresses that found it for up to twice cache_ttl_ms
                self.l1.put(key, cached, min(ttl_ms, left_ms) if left_ms > 0 else ttl_ms)
                await self._reply_cached(msg.reply, resp, req_id, ct, hdrs, "l2", t0)
                return
            if cached is not None:  # a value that is no answer of this model version: a miss, never an error
                self.counts["l2_bad_values"] += 1
            t_cache = time.monotonic()
            if deadline <= t_cache:
                raise DeadlineExceeded("the request's budget ran out during the L2 cache lookup")
            await self._forward(msg, hdrs, ct, t0, t_dec, t_val, deadline, mv, key, ttl_ms, rid, hedge_policy,
                                t_cache, decoded, ask_peers=ask_peers, endpoint=endpoint)
        except InferbusError as err:
            self.counts["errors"] += 1
            await self._error(msg.reply, err, ct, H.header_value(rid) if rid else None, endpoint, mv.key)
            if self._tracing is not None:
                self._tracing.error(hdrs, t0, mv.key, self.config.ingress_id, err)
        except Exception as exc:
            self.counts["errors"] += 1
            err = Internal(f"ingress failed: {exc!r}")
            await self._error(msg.reply, err, ct, H.header_value(rid) if rid else None, endpoint, mv.key)
            if self._tracing is not None:
                self._tracing.error(hdrs, t0, mv.key, self.config.ingress_id, err)

    def _on_l2_breaker(self, old: BreakerState, new: BreakerState) -> None:
        """Log an L2 outage once, when the lookups turn off, and once when they resume (the breaker flaps OPEN ↔
        HALF_OPEN once per ``l2_breaker_open_s`` while the outage lasts: not logged)."""
        cfg = self.config
        if new is BreakerState.OPEN and old is BreakerState.CLOSED:
            self.l2_outages += 1
            self._l2_off_since = time.monotonic()
            self._l2_skipped_at_open = self.counts["l2_skipped"]
            log(f"ingress {cfg.ingress_id}: L2 lookups off: {cfg.l2_breaker_failures} in a row failed or took over "
                f"{fmt_ms(cfg.l2_timeout_ms)} ms ({self.counts['l2_timeouts']} timed out, {self.counts['l2_errors']} "
                f"failed since start); misses go to the workers without one, and a lookup is tried again every "
                f"{cfg.l2_breaker_open_s:g} s")
        elif new is BreakerState.CLOSED:
            # (the time to the first probe that answered: a probe waits for a miss, so with no traffic Valkey may have
            # been back well before; a fresh-user trial read "after 23.7 s" of a Valkey back after about 10)
            log(f"ingress {cfg.ingress_id}: L2 lookups resumed: a miss's lookup answered "
                f"{time.monotonic() - self._l2_off_since:.1f} s after they were turned off "
                f"({self.counts['l2_skipped'] - self._l2_skipped_at_open} misses went without one)", logging.INFO)

    def _l2_state(self, now: float) -> str:
        """The L2 breaker's state as health and metrics show it: ``closed`` (lookups on), ``open`` (off), or
        ``half_open``: the open period is over and the next miss's lookup is the probe (the breaker turns HALF_OPEN
        only when a miss asks; an ingress that gets no misses said ``open`` long after Valkey was back)."""
        return str(self.l2_breaker.state_at(now))

    async def _l2_get(self, name: str) -> tuple[bytes | None, int]:
        """``(value or None, ms left of its TTL)`` of L2 entry ``name``: ``GET`` and ``PTTL`` in one round trip
        (a pipeline, no transaction); the ms are -1 for an entry without a TTL, -2 when there is none.

        Raises:
            redis.exceptions.RedisError: the lookup failed (the caller counts it and forwards the request).
        """
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(name)
        pipe.pttl(name)
        value, left_ms = await pipe.execute()
        return value, left_ms

    async def _reply_cached(self, reply: str, cached: bytes | InferResponse, req_id, ct, hdrs, level: str,
                            t0: float, key: str | None = None) -> None:
        """Answer from a cache entry: the cached response with this request's id and the hit's parameters.

        An L1 entry (``key`` given) is decoded once: the decoded response replaces the bytes in L1 (same
        expiry), and each hit encodes a shallow copy, never the shared object."""
        if isinstance(cached, InferResponse):
            resp = cached
        else:
            resp = decode_response(cached)
            if key is not None:
                self.l1.replace(key, resp)
        params = dict(resp.parameters or {})
        params["cache_hit"] = True
        params["cache_level"] = level
        if self.fencing.term:
            params["term"] = self.fencing.term
        params["timings_us"] = {"total": int((time.monotonic() - t0) * 1e6), "queue": 0, "compute": 0}
        rid = hdrs.get(H.REQUEST_ID) or (H.header_value(req_id) if isinstance(req_id, str) and req_id else None)
        await publish_raw(self.nc, reply, encode_response(msgspec.structs.replace(resp, id=req_id, parameters=params),
                                                          ct), headers=reply_block(is_json(ct), rid), flush=False)
        await self._send()
        if self._tracing is not None:
            self._tracing.cached(hdrs, t0, f"{resp.model_name}:{resp.model_version}", level, self.config.ingress_id)

    def _pending_copy(self, rid: str | None, model_key: str):
        """``(seq, pending, worker state or None)`` of request ``rid``'s pending copy for ``model_key``, or None."""
        if rid is None:
            return None
        seq = self._by_rid.get(rid)
        p = self.pending.get(seq) if seq is not None else None
        if p is None or p.model_key != model_key:
            return None
        return seq, p, self.router.workers.get(p.worker_id)

    def _sticky(self, rid: str | None, model_key: str, now: float):
        """The worker still holding a pending copy of request ``rid``, or the result of a completed one (its
        recent results answer the copy without running the model), if it can take the retry."""
        copy = self._pending_copy(rid, model_key)
        if copy is None:
            return self._retry_target(self._done_worker(rid, model_key, now), now)
        return self._retry_target(copy[2], now)

    def _done_worker(self, rid: str | None, model_key: str, now: float):
        """The worker that computed request ``rid`` for ``model_key`` within ``recent_rid_ttl_s``, or None."""
        if rid is None:
            return None
        d = self._done_rids.get(rid)
        if d is None or d[0] != model_key:
            return None
        if d[2] <= now:
            del self._done_rids[rid]
            return None
        return self.router.workers.get(d[1])

    def _remember_done(self, rid: str, model_key: str, worker_id: str, now: float) -> None:
        n = self.config.recent_rid_entries
        if n <= 0:
            return
        self._done_rids[rid] = (model_key, worker_id, now + self.config.recent_rid_ttl_s)
        self._done_rids.move_to_end(rid)
        while len(self._done_rids) > n:
            self._done_rids.popitem(last=False)

    def _retry_target(self, w, now: float):
        """``w`` if the worker holding a retried request's copy can take the retry (live, reporting, breaker)."""
        if w is None or not self.router.live(w, now) or now - w.last_report > _STICKY_REPORT_AGE_S:
            return None
        if not w.breaker.allows(now):
            return None
        return w

    async def _peer_sticky(self, rid: str, model_key: str, now: float):
        """The worker a *peer* ingress forwarded request ``rid``'s first copy to, if it can take the retry.

        A client's retry that lands on another ingress replica would otherwise be routed afresh and could
        run the model a second time on another worker; sent to the worker that holds the copy, the
        worker's dedupe joins it. Costs one core-NATS request, only for retries (``Inferbus-Attempt``).
        """
        try:
            msg = await self.nc.request(self.subjects.rid_query, f"{model_key} {rid}".encode(),
                                        timeout=self.config.peer_query_timeout_ms / 1000.0)
        except Exception:  # timeout (no peer holds it), no responders, connection trouble: route as usual
            return None
        return self._retry_target(self.router.workers.get(msg.data.decode(errors="replace")), now)

    async def _on_rid_query(self, msg) -> None:
        """A peer asks which worker holds a pending copy, or the recent result, of a request id; answer only
        when this ingress knows."""
        if not msg.reply:
            return
        key, _, rid = msg.data.decode(errors="replace").partition(" ")
        copy = self._pending_copy(rid or None, key)
        w = copy[2] if copy is not None else self._done_worker(rid or None, key, time.monotonic())
        if w is not None:
            try:
                await self.nc.publish(msg.reply, w.worker_id.encode())
            except Exception:
                pass

    def _suspected_copy(self, rid: str | None, model_key: str, now: float) -> tuple[int, Pending] | None:
        """``(seq, pending)`` of request ``rid``'s copy at a worker silent past the suspicion age, if any."""
        copy = self._pending_copy(rid, model_key)
        if copy is None:
            return None
        seq, p, w = copy
        age_s = self.router.suspect_s
        if w is None or not w.last_report or now - w.last_report < age_s:
            return None
        return seq, p

    async def _forward(self, msg, hdrs, ct, t0, t_dec, t_val, deadline, mv, key, ttl_ms, rid=None,
                       hedge_policy=None, t_cache: float | None = None, decoded: tuple | None = None,
                       resends: int = 0, exclude: str | None = None, ask_peers: bool = False,
                       endpoint: str = "infer", span=None) -> None:
        """Pick a worker and forward the request to it: published with one header block, or handed to the
        colocated worker in-process (:meth:`_forward_local`) with ``decoded`` (``(InferRequest, [array per
        input])`` as :meth:`_handle` validated it), building no headers. ``t_cache``: when the cache lookup
        ended (stage ``cache``, the start of stage ``route``).

        Stage ``route`` runs from ``t_cache`` through the choice of the worker (a retry's copy, a peer's answer,
        or the router's ``pick``) to one stamp taken once the worker is chosen, which also ends ``ingress_total``
        and starts ``forward_hop`` (the forward's time: its deadline fields, the pending entry, the local hand-over),
        so the ingress's stages tile its time with no gap. The choice itself reads the clock as ``t_cache``.
        ``resends``: how many times :meth:`_resend` has sent it again after workers died holding it; ``exclude``: a
        worker not to send it to (the silent one it is taken from, :meth:`_reroute_quiet`); ``ask_peers``: an attempt
        taken near its client's attempt deadline (:meth:`_check_attempt`), located through the peers as a marked
        retry is; ``endpoint``: the micro endpoint that took it (:attr:`Pending.endpoint`), where an error answered
        for it is counted. ``span``: with tracing on, the request's ingress span to be
        (:class:`~inferbus.actors._tracing.Traced`, its ids), made when the request settles: given by :meth:`_resend`
        (the first copy's), else decided here once the worker is chosen (:meth:`Tracing.begin
        <inferbus.actors._tracing.Tracing.begin>`; None when it is not sampled); a parameter so that tracing off costs
        this call one attribute test."""
        if t_cache is None:
            t_cache = t_val
        if len(self.pending) >= self.config.max_pending:
            raise ResourceExhausted(f"ingress {self.config.ingress_id} has {len(self.pending)} requests outstanding",
                                    retry_after_ms=10)
        alone = avoid_local = False
        # the crash memory is looked up (the request's inputs digested, ~10 µs) only for a model with a crash
        # remembered: every key of a crash is noted under its model (_note_crashed_model), and the other models'
        # requests pay one dict lookup while any crash is remembered
        if self._deaths and self._crashed_until.get(mv.key, 0.0) > t_cache:
            self.counts["crash_checks"] += 1
            died = self._deaths_of(mv.key, key, msg.data, t_cache, decoded[0] if decoded is not None else None)
            if died:
                if died[1] is not None:
                    self.counts["query_of_death"] += 1
                    raise Internal(died[1])
                # a suspect (a crashed worker's run held it): it runs alone and is not hedged, so a second crash is
                # its own
                alone = True
                hedge_policy = None
                self.counts["suspects_alone"] += 1
            # while a crash of this model is remembered, a colocated ingress sends its requests to another process's
            # worker: a process that dies then takes no request of its own ingress with it, and what its worker held
            # for the others' is answered or sent again by them
            avoid_local = self.local_worker is not None
        now = t_cache  # the choice's clock (liveness, breakers, sticky copies): taken just before this call
        w = self._sticky(rid, mv.key, now) if rid is not None else None  # only a request with an id has copies
        suspected = None
        if w is not None:
            self.counts["sticky_retries"] += 1
            hedge_policy = None  # a retry joins the copy already running; it is not hedged again
        elif rid is not None and (H.ATTEMPT in hdrs and H.attempt_number(hdrs[H.ATTEMPT]) > 1
                                  or ask_peers) and \
                rid not in self._by_rid and rid not in self._done_rids and \
                (w := await self._peer_sticky(rid, mv.key, now)) is not None:
            self.counts["peer_sticky_retries"] += 1
            hedge_policy = None
        else:
            suspected = self._suspected_copy(rid, mv.key, now) if rid is not None else None
            # a retry whose copy sits at a worker that went silent (hung, frozen, partitioned) goes elsewhere
            w = self.router.pick(mv.key, now, exclude=suspected[1].worker_id if suspected else exclude)
            if avoid_local and w is not None and w.worker_id == self.router.local_worker_id:
                # not in this process while another can take it (above): if it is the killer, this ingress must live
                # to answer it (INTERNAL) and to tell the others (a cold SDK client's killer at --colocate ended
                # DEADLINE_EXCEEDED: its second death took the ingress holding its retry along, and the innocents
                # that process held in-process)
                w = self.router.pick(mv.key, now, exclude=w.worker_id) or w
            if suspected is not None and w is not None:
                self.counts["suspect_reroutes"] += 1
                # withdraw the old copy: a worker that thaws reads this right after the buffered request and
                # drops it before compute (and its stall fence refuses it anyway after a long freeze)
                old_w = suspected[1].worker_id
                seqs = [s for s, q in self.pending.items()  # every copy there: the first and joined retries
                        if q.worker_id == old_w and (s == suspected[0] or (q.request_id and q.request_id == rid))]
                try:
                    await self.nc.publish(control_subject(self.subjects.prefix, old_w),
                                          encode_internal(Cancel(self.config.ingress_id, seqs)))
                except Exception:
                    pass
        if w is None:
            pinned = self.model_ctl.pin_failures(mv.key, now)
            if pinned:  # its files changed or are gone where it was (re)loaded: a retry cannot help, say why now
                self.counts["pin_refused"] += 1
                wid, why = next(iter(sorted(pinned.items())))
                raise Internal(f"model version {mv.key} is not served: no live worker holds the files it was "
                               f"pinned to: {why} (worker {wid}" + (f" and {len(pinned) - 1} more" if len(pinned) > 1
                                                                   else "") + ")", field="model_version")
            self.counts["unavailable"] += 1
            raise Unavailable(f"no live, healthy worker has {mv.key} loaded (or every breaker is open)",
                              field="model", retry_after_ms=50)
        now = time.monotonic()  # the worker is chosen: 'route' and 'ingress_total' end, the forward starts
        term = self.fencing.term
        dl_ms = (time.time() + (deadline - now)) * 1000.0
        body = msg.data
        # the ingress's stages in µs (the answer's timings_us start with them; decode + validate + cache + route
        # is ingress_total, each truncated to whole µs)
        stages = {"decode": int((t_dec - t0) * 1e6), "validate": int((t_val - t_dec) * 1e6),
                  "cache": int((t_cache - t_val) * 1e6), "route": int((now - t_cache) * 1e6),
                  "ingress_total": int((now - t0) * 1e6)}
        if self._tracing is not None and span is None:
            span = self._tracing.begin(hdrs, t0)
        local = decoded is not None and self.local_worker is not None and w.worker_id == self.router.local_worker_id
        if local and hedge_policy is None and self.config.run_to_completion:
            dkey = self.local_worker.dedupe_key(mv.key, rid, body) if rid else None
            if dkey is not None and dkey in self._burst_dkeys:  # a copy is held back: run it first, then join
                await self._flush_burst()
            if self.local_worker.can_run_now(mv.key, term or None, dkey, len(body)):
                sub = self._infer_sub
                if self._burst or (sub is not None and sub.pending_msgs):
                    # more requests wait (or wait no longer, ending a burst): held back, to be computed with them
                    await self._defer(_Deferred(w, msg.reply, body, decoded, mv.key, deadline, dl_ms, now, term, key,
                                          ttl_ms, ct, rid, dkey, stages, self.router.on_sent(w), endpoint, span))
                    self.counts["ok_forwarded"] += 1
                    return
                o = await self._run_now(w, msg.reply, body, decoded, mv, deadline, dl_ms, now, term, key, ttl_ms, ct,
                                        rid, dkey, stages, endpoint)
                self.counts["ok_forwarded"] += 1
                if span is not None:
                    self._trace_local(span, o, w.worker_id, stages)
                return
        seq = next(self._seq)
        hedge_mark = HEDGE_PRIMARY if hedge_policy is not None else ""
        fwd = None
        if not local or hedge_policy is not None:  # the bus form (a hedge copy may go over the bus)
            fwd = _fwd_fields(dl_ms, self.config.ingress_id, mv, term, key, stages, ct, hdrs, rid,
                              self._repinned.get(mv.key) if key is not None and self._repinned else None)
        if not local:
            block = _fwd_block(seq, H.remaining_ms(deadline, now), fwd, hedge_mark, alone)
            max_payload = self.nc.max_payload or 0
            if max_payload and len(body) + len(block) > max_payload:
                self.counts["too_large"] += 1
                raise PayloadTooLarge(f"request of {len(body)} bytes plus routing headers exceeds the bus's "
                                      f"max_payload ({max_payload} bytes)")
        p = Pending(w.worker_id, msg.reply, deadline, now, key, ttl_ms, ct, rid, mv.key, body=body, resends=resends,
                    endpoint=endpoint)
        if not local:  # (a hedged request's first copy too: sent again, unhedged, when no other copy is pending)
            p.hdrs, p.mv = hdrs, mv  # what sending it again takes, should its worker die or stop holding it
        self.pending[seq] = p
        if rid:
            self._by_rid[rid] = seq
        p.probe = self.router.on_sent(w)
        self.hedge_budget.on_request()
        lf = None
        if local or (hedge_policy is not None and decoded is not None and self.local_worker is not None):
            # what the colocated worker takes in-process (the request as decoded, the forward's fields)
            lf = (decoded, mv.key, dl_ms, term or None, key, ct, rid, stages, span)
        if span is not None:  # the forward names the ingress span as the worker's parent
            p.span, p.stages = span, stages
            if fwd is not None:
                fwd = (fwd[0], fwd[1], self._tracing.forward_lines(span, fwd[2]))
                if not local:
                    block = _fwd_block(seq, H.remaining_ms(deadline, now), fwd, hedge_mark, alone)
        if hedge_policy is not None:
            self._arm_hedge(p, seq, hedge_policy, body, fwd, deadline, now, lf)
        if local:
            await self._forward_local(seq, msg.reply, body, lf, deadline, now, hedge_mark)
        else:
            await publish_raw(self.nc, self.subjects.worker(w.worker_id), body, reply=msg.reply, headers=block,
                              flush=False)
            await self._send()
        self.counts["ok_forwarded"] += 1

    async def _forward_local(self, seq: int, reply: str, body: bytes, lf: tuple, deadline: float, now: float,
                             hedge: str) -> None:
        """Hand a forwarded request to the colocated worker in-process (same checks and answers as over NATS),
        as decoded, with the forward's fields as values (:meth:`Worker.submit_local`): no header block is
        built and nothing is parsed or decoded again.

        Args:
            lf: ``(decoded, model key, wall-clock deadline ms, term or None, cache key or None, Content-Type,
                request id as forwarded, the ingress's stages (µs by name; copied, the worker fills its copy), the
                ingress span or None)`` (see :meth:`_forward`).
            deadline, now: the request's monotonic deadline and the forward's time.
            hedge: the hedge mark (``primary``, ``copy`` or "").

        Raises:
            Internal: the worker's handler raised (a bug); the request is dropped from the pending table
                and counted a failure of that worker.
        """
        worker = self.local_worker
        self.counts["local_forwards"] += 1
        decoded, model_key, dl_ms, term, key, ct, rid, st, span = lf
        try:
            await worker.submit_local(reply, body, decoded, model_key, seq, self.config.ingress_id, deadline, dl_ms,
                                      now, term, key, ct, rid, hedge or None, dict(st), span)
        except Exception as exc:
            p = self._pop(seq)
            if p is not None:
                self.router.on_done(p.worker_id, 0.0, outcome=SERVER_ERROR, probe=p.probe)
            log(f"ingress {self.config.ingress_id}: local worker failed: {exc!r}")
            raise Internal(f"local worker failed: {type(exc).__name__}: {exc}") from exc

    async def _run_now(self, w, reply: str, body: bytes, decoded: tuple, mv, deadline: float, dl_ms: float,
                       now: float, term: int, key: str | None, ttl_ms: int, ct: str | None, rid: str | None,
                       dkey: tuple | None, timings: dict, endpoint: str = "infer") -> None:
        """Serve a request at the colocated worker within this call (:meth:`Worker.run_now`) and settle it here
        as :meth:`settle` settles a completion: the router's in-flight count, breaker and latency, the
        latency window, the request id's worker (retries), the L1 fill. Nothing is left in flight between
        event-loop iterations, so no pending entry and no completion item. Only for a request without a
        hedge, when nothing waits in the subscription and :meth:`Worker.can_run_now`.

        Args:
            rid: the request id (the ``Inferbus-Request-Id`` header, else the body's id as the header would carry
                it; None without one).
            dkey: its dedupe key (:meth:`Worker.dedupe_key`), None without an id.
            endpoint: the micro endpoint that took it (:attr:`Pending.endpoint`): an error answer counts there.

        Returns:
            The worker's :class:`~inferbus.actors._worker.Outcome` (answered).

        Raises:
            InferbusError: the worker refused it before computing (nothing was answered): a client error
                for the breaker, or neutral for DEADLINE_EXCEEDED.
            Internal: the worker's code raised (a bug); counted a failure of that worker.
        """
        self.counts["local_forwards"] += 1
        self.counts["run_now"] += 1
        probe = self.router.on_sent(w)
        self.hedge_budget.on_request()
        try:
            o = await self.local_worker.run_now(reply, body, decoded, mv.key, deadline, dl_ms, now, term or None, key,
                                                ct, rid, dkey, timings)
        except InferbusError as err:  # refused before compute: a client's error or neutral (budget), as settled
            self.router.on_done(w.worker_id, 0.0, outcome=CLIENT_ERROR if err.code.value in _CLIENT_CODES
                                else NEUTRAL, probe=probe)
            raise
        except Exception as exc:
            self.router.on_done(w.worker_id, 0.0, outcome=SERVER_ERROR, probe=probe)
            log(f"ingress {self.config.ingress_id}: local worker failed: {exc!r}")
            raise Internal(f"local worker failed: {type(exc).__name__}: {exc}") from exc
        # _settle_run's steps written out: this is the lone miss's path, and the call cost it bytecodes
        # (with _answer_in_call/_write_answers, +1.2 % per miss; docs/performance.md, fourteenth session)
        t_done = time.monotonic()
        latency_us = (t_done - now) * 1e6
        self.router.on_done(w.worker_id, latency_us, outcome=OK if o.ok else _outcome(o), probe=probe, now=t_done)
        if not o.ok:
            self._count_worker_error(o.code, w.worker_id, endpoint, mv.key)
            return o
        if rid is not None:
            self._remember_done(rid, mv.key, w.worker_id, t_done)
        self._observe(mv.key, latency_us)
        if o.response_msgpack is not None and key is not None:
            if self.config.redis_url:
                await self._fill_caches(key, ttl_ms, o.response_msgpack, t_done)
            else:  # what _fill_caches does without L2, without its call
                self.l1.put(key, o.response_msgpack, ttl_ms, t_done)
        return o

    def _trace_local(self, span, o, worker_id: str, stages: dict) -> None:
        """Make the worker span and the ingress span (``span``, a :class:`~inferbus.actors._tracing.Traced`) of a
        request the colocated worker computed and answered within this call (:meth:`_run_now`, :meth:`_run_burst`),
        from the job's stamps (receipt, stages), both ended now, after the reply's write."""
        tr = self._tracing
        now = time.monotonic()
        tr.worker_span(span, o.job, o, worker_id, now)  # (neither raises: a span that cannot be made is logged)
        tr.end(span, now, o.job.model_key, "miss", self.config.ingress_id, worker_id=worker_id, stages=stages,
               code=None if o.ok else o.code, request_id=o.job.rid)

    async def _settle_run(self, o, worker_id: str, model_key: str, t_fwd: float, t_done: float, probe,
                          rid: str | None, key: str | None, ttl_ms: int, endpoint: str = "infer") -> None:
        """Settle a request the colocated worker computed and answered within this call (:meth:`_run_burst`;
        :meth:`_run_now` has the same steps written out), as :meth:`settle` settles a completion without a
        hedge: the router (in-flight count, breaker, latency from ``t_fwd`` to ``t_done``, monotonic s), and
        for a good answer the request id's worker (retries), the latency window and the L1 (and L2) fill under
        ``key``; an error answer is counted in the stats of ``endpoint`` (the micro endpoint that took it).
        (:meth:`settle` stays apart: it also settles hedges and requests a worker held.)"""
        latency_us = (t_done - t_fwd) * 1e6
        self.router.on_done(worker_id, latency_us, outcome=_outcome(o), probe=probe, now=t_done)
        if not o.ok:
            self._count_worker_error(o.code, worker_id, endpoint, model_key)
            return
        if rid is not None:
            self._remember_done(rid, model_key, worker_id, t_done)
        self._observe(model_key, latency_us)
        if o.response_msgpack is not None and key is not None:
            await self._fill_caches(key, ttl_ms, o.response_msgpack, t_done)

    async def _defer(self, d: _Deferred) -> None:
        """Hold back ``d`` (a miss the colocated worker may run now, counted in flight at the router already)
        until the burst ends. A burst that would take more than one inline slice of estimated compute
        (``INLINE_SLICE_US``, as the worker's queue does) or ``INLINE_MAX_JOBS`` requests is run first. A loop
        callback runs a burst that no later request ended (e.g. the last one was dropped without a reply
        subject)."""
        est_us = self.local_worker.compute_ewma_us.get(d.model_key, 0.0)
        if self._burst and (self._burst_cost_us + est_us > INLINE_SLICE_US or len(self._burst) >= INLINE_MAX_JOBS):
            await self._flush_burst()
        self._burst.append(d)
        self._burst_cost_us += est_us
        if d.dkey is not None:
            self._burst_dkeys.add(d.dkey)
        self.counts["burst_deferred"] += 1
        self.hedge_budget.on_request()
        if not self._burst_guard:
            self._burst_guard = True
            asyncio.get_running_loop().call_soon(self._burst_left_over)

    def _burst_left_over(self) -> None:
        self._burst_guard = False
        if self._burst:
            asyncio.ensure_future(self._flush_burst())

    async def _flush_burst(self) -> None:
        """Run the held-back burst now (:meth:`_run_burst`). Never raises (it runs after a request's own
        handling, and from a loop callback): a failure past the answers, e.g. an L2 fill that could not be
        published, is logged."""
        held, self._burst = self._burst, []
        self._burst_dkeys.clear()
        self._burst_cost_us = 0.0
        if held:
            try:
                await self._run_burst(held)
            except Exception as exc:
                log(f"ingress {self.config.ingress_id}: settling a burst failed: {exc!r}")

    async def _run_burst(self, held: list[_Deferred]) -> None:
        """Compute ``held`` at the colocated worker as batches (:meth:`Worker.run_burst`) and settle each as
        :meth:`_run_now` settles one: router (in-flight count, breaker, latency), latency window, request id's
        worker, L1 fill. A request the worker may no longer run now (its state changed during the burst) goes
        through its queue instead (:meth:`_queue_local`). A failure of the worker's code is answered INTERNAL
        to each request and counted a failure of that worker."""
        self.counts["burst_runs"] += 1
        try:
            outcomes = await self.local_worker.run_burst(held)
        except Exception as exc:
            log(f"ingress {self.config.ingress_id}: local worker failed on a burst: {exc!r}")
            for d in held:
                self.router.on_done(d.w.worker_id, 0.0, outcome=SERVER_ERROR, probe=d.probe)
                self.counts["errors"] += 1
                await self._error_deferred(d, Internal(f"local worker failed: {type(exc).__name__}: {exc}"))
            return
        t_done = time.monotonic()
        for d, o in zip(held, outcomes):
            if o is None:
                try:
                    await self._queue_local(d)
                except InferbusError as err:
                    self.counts["errors"] += 1
                    await self._error_deferred(d, err)
                continue
            self.counts["local_forwards"] += 1
            self.counts["run_now"] += 1
            await self._settle_run(o, d.w.worker_id, d.model_key, d.t_fwd, t_done, d.probe, d.worker_rid,
                                   d.cache_key, d.ttl_ms, d.endpoint)
            if d.span is not None:
                self._trace_local(d.span, o, d.w.worker_id, d.stages)

    async def _error_deferred(self, d: _Deferred, err: InferbusError) -> None:
        """Answer the held-back request ``d`` with ``err`` here, and end its ingress span (if any) with it."""
        await self._error(d.reply, err, d.ct, d.worker_rid, d.endpoint, d.model_key)
        if d.span is not None:
            self._tracing.failed(d.span, err, d.model_key, self.config.ingress_id, worker_id=d.w.worker_id,
                                 stages=d.stages, request_id=d.worker_rid)

    async def _queue_local(self, d: _Deferred) -> None:
        """Forward a held-back request through the colocated worker's queue (:meth:`_forward_local`), as
        :meth:`_forward` forwards one; it was counted in flight at the router when held back."""
        seq = next(self._seq)
        p = Pending(d.w.worker_id, d.reply, d.deadline, d.t_fwd, d.cache_key, d.ttl_ms, d.ct, d.worker_rid,
                    d.model_key, body=d.body, endpoint=d.endpoint)
        p.probe = d.probe
        if d.span is not None:
            p.span, p.stages = d.span, d.stages
        self.pending[seq] = p
        if d.worker_rid:
            self._by_rid[d.worker_rid] = seq
        await self._forward_local(seq, d.reply, d.body, (d.decoded, d.model_key, d.dl_ms, d.term or None,
                                                         d.cache_key, d.ct, d.worker_rid, d.stages, d.span),
                                  d.deadline, d.t_fwd, "")

    # ---- hedging ------------------------------------------------------------------------------
    def _arm_hedge(self, p: Pending, seq: int, policy, body: bytes, fwd: tuple, deadline: float, now: float,
                   local: tuple | None = None) -> None:
        """Make ``p`` (forwarded as ``seq``) hedge-eligible and start its hedge timer when the delay is known
        and fits the budget. Without a timer (a quantile policy before ``MIN_SAMPLES``, a delay over the
        budget) the request is still hedged at once if its worker sheds or refuses it (:meth:`_on_held`)."""
        h = _Hedge(policy, body, fwd, now, p.model_key, local)
        h.seqs.append(seq)
        p.hedge = h
        kind, value = policy
        if kind == "fixed":
            delay_ms = value
        else:
            lw = self._latency.get(p.model_key)
            q_us = lw.quantile(value, now) if lw is not None else None
            if q_us is None:
                return  # too few observations yet
            delay_ms = q_us / 1000.0
        delay_ms = max(delay_ms, MIN_DELAY_MS)
        if delay_ms >= H.remaining_ms(deadline, now):
            return  # the hedge could never answer within the budget
        h.timer = asyncio.get_running_loop().call_later(delay_ms / 1000.0, self._fire_hedge, seq)

    def _fire_hedge(self, seq: int) -> None:
        p = self.pending.get(seq)
        if p is None or p.hedge is None or p.hedge.done:
            return
        asyncio.ensure_future(self._send_hedge(p))

    async def _send_hedge(self, p: Pending, hand_span: bool = False) -> bool:
        """Send the hedge copy of the request ``p`` (its first copy) to another worker than ``p``'s.

        ``hand_span``: ``p`` will not answer (its worker held it), so its ingress span, if any, goes with the
        hedge copy, before it is sent (its completion, even one that comes back in-process at once, ends it).

        Returns False, sending nothing, when the request is settled, already hedged, out of budget, or no
        other worker can take it or the hedge budget is spent.
        """
        h = p.hedge
        now = time.monotonic()
        if h is None or h.done or len(h.seqs) > 1 or p.deadline <= now:
            return False
        w = self.router.pick(h.model_key, now, exclude=p.worker_id)
        if w is None or not self.hedge_budget.try_spend():
            return False
        seq2 = next(self._seq)
        local = h.local is not None and self.local_worker is not None and w.worker_id == self.router.local_worker_id
        remaining_ms = H.remaining_ms(p.deadline, now)
        p2 = Pending(w.worker_id, p.reply, p.deadline, now, p.cache_key, p.ttl_ms, p.content_type, p.request_id,
                     p.model_key, hedge=h, body=p.body, endpoint=p.endpoint)
        self.pending[seq2] = p2
        h.seqs.append(seq2)
        p2.probe = self.router.on_sent(w)
        if hand_span and p.span is not None:
            p2.span, p2.stages, p.span = p.span, p.stages, None
        self.counts["hedges"] += 1
        try:
            if local:
                await self._forward_local(seq2, p.reply, h.body, h.local, p.deadline, now, HEDGE_COPY)
            else:
                await publish_raw(self.nc, self.subjects.worker(w.worker_id), h.body, reply=p.reply,
                                  headers=_fwd_block(seq2, remaining_ms, h.fwd, HEDGE_COPY))
        except Exception as exc:  # the pending entry stays: the sweeper or the client's budget ends it
            log(f"ingress {self.config.ingress_id}: hedge publish failed: {exc!r}")
        return True

    async def _on_held(self, p: Pending, item, now: float) -> None:
        """A worker shed (RESOURCE_EXHAUSTED) or refused (UNAVAILABLE) the hedge-marked copy ``p`` before
        compute and did not reply to the client (``DoneItem.held``).

        If another copy of the request is still pending, it answers (nothing is sent). Else the hedge is
        sent at once to another worker; when none can be sent (no other routable worker, hedge budget
        spent, the hedge was already sent and failed too, budget over), the client gets the worker's error
        from here, once.
        """
        self.counts["held"] += 1
        h = p.hedge
        if h is not None:
            if h.done or any(s in self.pending for s in h.seqs):
                if p.span is not None and not self._pass_span(p, h):
                    self._end_ok_span(p, now, None)
                return  # another copy answered already or is still running: it answers (and ends the span)
            if h.timer is not None:
                h.timer.cancel()
            if await self._send_hedge(p, hand_span=True):  # (the span goes with the hedge: it answers)
                self.counts["hedges_on_refusal"] += 1
                return
            h.done = True
            h.release()
        self.counts["errors"] += 1
        if item.code == "RESOURCE_EXHAUSTED":
            err = ResourceExhausted(f"worker {p.worker_id} shed the request (mailbox full) and no other worker "
                                    f"could take it", retry_after_ms=_HELD_RETRY_AFTER_MS["RESOURCE_EXHAUSTED"])
        else:
            err = Unavailable(f"worker {p.worker_id} refused the request ({item.code}) and no other worker "
                              f"could take it; safe to retry", retry_after_ms=_HELD_RETRY_AFTER_MS["UNAVAILABLE"])
        await self._error_pending(p, err)

    async def _error_pending(self, p: Pending, err: InferbusError) -> None:
        """Answer the forwarded request ``p`` with ``err`` here (its worker will not), and end its ingress span with
        it (:meth:`_end_span`)."""
        await self._error(p.reply, err, p.content_type, p.request_id, p.endpoint, p.model_key)
        if p.span is not None:
            self._end_span(p, err)

    def _take_span(self, p: Pending, h: _Hedge) -> None:
        """``p``, a copy of the hedged request ``h``, answered first: it takes the request's ingress span from the
        copy still pending that holds it (the first copy's, when the hedge wins), so that the span ends with this
        answer and names this worker, not with the loser's completion (CANCELLED, or computed anyway) and its worker."""
        pending = self.pending
        for s in h.seqs:
            q = pending.get(s)
            if q is not None and q.span is not None:
                p.span, p.stages, q.span = q.span, q.stages, None
                return

    def _pass_span(self, p: Pending, h: _Hedge, worker_id: str | None = None) -> bool:
        """``p``, a copy of the hedged request ``h``, will not answer (held, or its worker failed): hand its ingress
        span to a copy still pending (on another worker than ``worker_id``), whose completion ends it. Returns False
        when there is none (the caller ends the span)."""
        for s in h.seqs:
            q = self.pending.get(s)
            if q is not None and q is not p and (worker_id is None or q.worker_id != worker_id):
                q.span, q.stages, p.span = p.span, p.stages, None
                return True
        return False

    def _end_ok_span(self, p: Pending, now: float, code: str | None) -> None:
        """End the ingress span of ``p`` at ``now`` (monotonic s) on a completion its worker answered (``code``: the
        worker's error code, None for an answer)."""
        self._tracing.end(p.span, now, p.model_key, "miss", self.config.ingress_id, worker_id=p.worker_id,
                          stages=p.stages, request_id=p.request_id, code=code)

    def _end_span(self, p: Pending, err: InferbusError, outcome: str | None = None) -> None:
        """End the ingress span of the forwarded request ``p`` (tracing on, sampled) now, with ``err``: the error it
        was answered here, or (``outcome``, :data:`~inferbus.actors._tracing.OUTCOMES`) the one its client sees."""
        self._tracing.failed(p.span, err, p.model_key, self.config.ingress_id, worker_id=p.worker_id,
                             stages=p.stages, request_id=p.request_id, outcome=outcome)
        p.span = None

    async def _settle_hedge(self, h: _Hedge, winner_seq: int, now: float) -> None:
        """The first completion of a hedged request arrived: cancel the other copy."""
        h.done = h.answered = True
        if h.timer is not None:
            h.timer.cancel()
        if winner_seq != h.seqs[0]:
            self.counts["hedge_wins"] += 1
        h.release()  # let the request bytes go
        by_worker: dict[str, list[int]] = {}
        for s in h.seqs:
            q = self.pending.get(s)
            if s != winner_seq and q is not None:
                by_worker.setdefault(q.worker_id, []).append(s)
        for wid, seqs in by_worker.items():
            self.counts["hedge_cancels"] += len(seqs)
            if self.local_worker is not None and wid == self.router.local_worker_id:
                self.local_worker.cancel(self.config.ingress_id, seqs)  # in-process, like the done notices
                continue
            try:
                await self.nc.publish(control_subject(self.subjects.prefix, wid),
                                      encode_internal(Cancel(self.config.ingress_id, seqs)))
            except Exception:
                pass

    # ---- control path -------------------------------------------------------------------------
    def _pop(self, seq: int) -> Pending | None:
        p = self.pending.pop(seq, None)
        if p is not None and p.request_id is not None and self._by_rid.get(p.request_id) == seq:
            del self._by_rid[p.request_id]  # (by the header's id alone, a body's id stayed here for good: a leak)
        return p

    async def _on_done(self, msg) -> None:
        try:
            notice = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if not isinstance(notice, DoneNotice):
            return
        await self.settle(notice.items)

    async def settle(self, items) -> None:
        """Settle the requests a worker completed: in-flight counts, breaker, hedges, latency, cache fills.

        ``items``: :class:`~inferbus.schemas._internal.DoneItem` records, from a ``DoneNotice`` on
        ``<p>._done.<ingress>`` or, in-process and without a notice around them, from the colocated worker
        (the same accounting either way). Unknown sequence numbers (already failed or swept) are ignored.
        """
        now = time.monotonic()
        for item in items:
            p = self._pop(item.seq)
            if p is None:
                continue
            if p.span is not None and not item.held:  # (tracing on, the request sampled, this copy holds its span:
                # its first completion, a hedge's winner takes it below; a held one's span is ended or handed on by
                # _on_held)
                self._end_ok_span(p, now, None if item.ok or item.code == "CANCELLED" else item.code)
            if item.ok and p.request_id is not None:
                self._remember_done(p.request_id, p.model_key, p.worker_id, now)
            latency_us = (now - p.t_fwd) * 1e6
            self.router.on_done(p.worker_id, latency_us, outcome=_outcome(item), probe=p.probe, now=now)
            if item.held:
                await self._on_held(p, item, now)
                continue
            if not item.ok and item.code != "CANCELLED":  # the worker answered the client with an error
                self._count_worker_error(item.code, p.worker_id, p.endpoint, p.model_key)
            h = p.hedge
            if h is not None:
                if not h.done and item.code != "CANCELLED":
                    if p.span is None and self._tracing is not None:  # the hedge answered first: the span is
                        self._take_span(p, h)  # the first copy's, ended now and naming this worker
                        if p.span is not None:
                            self._end_ok_span(p, now, None if item.ok else item.code)
                    await self._settle_hedge(h, item.seq, now)
                    if item.ok:
                        self._observe(p.model_key, (now - h.t_first) * 1e6)
            elif item.ok:
                self._observe(p.model_key, latency_us)
            if item.ok and item.response is not None and p.cache_key is not None:
                await self._fill_caches(p.cache_key, p.ttl_ms, item.response, now)

    def _count_worker_error(self, code: str | None, worker_id: str, endpoint: str = "infer",
                            model_key: str | None = None) -> None:
        """Count an error a worker answered the client with in the ``$SRV.STATS`` of ``endpoint``, the micro endpoint
        that took the request (``infer``, or ``infer_at`` for a request sent to this ingress alone), and by model
        version ``model_key`` and code (:attr:`_model_errors`)."""
        count = self._error_counters.get(endpoint)
        if count is not None:
            count(f"{code or 'error'} (answered by worker {worker_id})")
        if model_key is not None:
            self._model_errors[model_key, code or "UNKNOWN"] += 1

    async def _fill_caches(self, key: str, ttl_ms: int, response: bytes, now: float) -> None:
        """Keep a computed answer (encoded msgpack) in L1 and send it to the aggregator for L2.

        An answer whose fill message would exceed the bus's ``max_payload`` stays out of L2
        (``counts.l2_fill_too_large``); a fill that cannot be sent is logged: neither may leave the other
        completions of a notice unsettled (they would count as lost and open healthy workers' breakers)."""
        self.l1.put(key, response, ttl_ms, now)
        if self.config.redis_url:
            fill = encode_internal(CacheFill(key, ttl_ms, response, int(time.time() * 1000) + ttl_ms))
            max_payload = self.nc.max_payload or 0
            if max_payload and len(fill) > max_payload:
                self.counts["l2_fill_too_large"] += 1
                return
            try:
                await self.nc.publish(self.subjects.cache_fill, fill)
            except Exception as exc:
                log(f"ingress {self.config.ingress_id}: cache fill failed: {exc!r}")

    def _observe(self, model_key: str, latency_us: float) -> None:
        """A successful forward of ``model_key`` took ``latency_us`` (forward to completion): into the hedging
        policy's window and, to be folded into the Prometheus histogram off the request path (:meth:`_sweep`,
        :meth:`_stats_data`), its pending list. :meth:`ForwardStats.add` written out: the two appends cost fewer
        bytecodes than the call did for one (docs/performance.md, fifty-third session)."""
        lw = self._latency.get(model_key)
        if lw is None:
            lw = self._forward_stats(model_key)
        lw.samples.append(latency_us)
        lw.pending.append(latency_us)

    def _forward_stats(self, model_key: str) -> ForwardStats:
        """The first forward of ``model_key`` to complete since it was (re-)served (off the hot path: once per
        version and load): its counts of before an unload, if any (:attr:`_retired`), with an empty latency
        window, else new ones, now in :attr:`_latency`."""
        lw = self._retired.pop(model_key, None)
        if lw is None:
            lw = ForwardStats()
        self._latency[model_key] = lw
        return lw

    def _retire_forward_stats(self, model_key: str) -> None:
        """``model_key`` is no longer served (:meth:`IngressModels._set_state`): its latency window is emptied and it
        leaves :attr:`_latency` (the health's ``latency`` block, hedging: a re-load, maybe of other files, starts a
        new window), its pending latencies are folded and its counts kept in :attr:`_retired` (``per_model`` in
        :meth:`_stats_data` still gives them): a version's counters are monotonic for the life of the process,
        across unload and re-load."""
        lw = self._latency.pop(model_key, None)
        if lw is None:
            return
        lw.fold()
        lw.clear()
        self._retired[model_key] = lw

    async def _on_load(self, msg) -> None:
        try:
            r = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if isinstance(r, LoadReport):
            self._take_report(r)

    def _take_report(self, r: LoadReport) -> None:
        """A worker's load report, from ``<p>._load`` or (the colocated worker's first, at start) in-process."""
        self.router.server = connected_server(self.nc)  # current across reconnects (10 reports/s per worker)
        self.router.on_report(r)
        self.model_ctl.on_report(r)

    async def _on_event(self, msg) -> None:
        try:
            ev = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if isinstance(ev, ProcessEvent) and ev.kind == "down" and ev.worker_id:
            stopped = ev.reason == "exit code 0"
            poison, charge = ({}, True) if stopped else self._note_deaths(ev.worker_id, ev.reason, time.monotonic(),
                                                                          ev.running, ev.fault, ev.running_local)
            self.router.on_down(ev.worker_id, ev.pid, charge=charge)
            if self._deaths_changed:
                await self._share_deaths(self._deaths_changed)
                self._deaths_changed = []
            # what a worker held when its process ended is sent again to another worker (within its budget): a crash's,
            # and a stop's too: a stopping worker answers what it received as it drains, so what is still pending here
            # is what was forwarded to it in the moment before its draining report arrived, after it stopped taking
            # requests (it never saw them; they were answered UNAVAILABLE, which a raw client does not retry: a
            # fresh-user trial's SIGTERM of one of 2 workers failed 5 raw requests while the other idled)
            await self._fail_pending(ev.worker_id, Unavailable(
                f"worker {ev.worker_id} {'stopped' if stopped else 'died'} ({ev.reason}) "
                f"holding this request; safe to retry", retry_after_ms=0), poison, resend=True)

    def _note_deaths(self, worker_id: str, reason: str, now: float, running: list[tuple[str, int]] | None = None,
                     fault: bool = False, running_local: list[tuple[str, str, bytes]] | None = None
                     ) -> tuple[dict[int, InferbusError], bool]:
        """Count a crash of ``worker_id`` against the requests it was running; returns, by pending sequence number,
        the INTERNAL answer of those now held by :data:`QUERY_OF_DEATH_DEATHS` dying workers (a query of death: an
        input that kills the runtime, e.g. ONNX Runtime's SIGFPE on INT64_MIN / -1, which the SDK's retries of
        UNAVAILABLE carried from worker to worker: every worker of the model died, again and again, a fresh-user
        trial), and whether the crash counts against the worker's breaker.

        ``running``: ``(ingress id, seq)`` of the requests the worker's model runs held when it died (its flight
        record, :mod:`inferbus.actors._flight`). Only this ingress's among them are counted; the worker's other
        requests (queued, another model's) are not, and are retried as usual. None (no record): every request it
        held is counted. A request counted once is a suspect: it is forwarded to run alone (``Inferbus-Alone``), so
        that a second crash is its own, and the requests that shared its first run are not taken for it.

        ``fault``: the worker was killed by a signal its own code raised (SIGFPE, SIGSEGV, ...). When the dying run
        held one request alone, that request is what killed it: a query of death at this first crash (each death
        costs a restart, and a second one took the other worker of the model down too, a fresh-user trial). A
        SIGKILL (the OOM killer, an operator) or a run of several requests counts one death, as above.

        ``running_local``: for a colocated process (``--colocate``), ``(model version key, request id or "", request
        digest)`` of each request its own ingress, which died with it, had handed to its worker in-process and a
        run held. This ingress holds none of them, but their client's retry comes here next: each is remembered by
        its digest (:func:`~inferbus.actors._crashes.request_digest`) as above (one death, or a query of death at
        once when the run held it alone and ``fault``), so that the retry is refused (or run alone elsewhere)
        instead of killing this process too.

        The crash does not count against the breaker when this ingress's requests in the dying run are each now
        answered as a query of death: the request is at fault, not the worker (which restarts). Such a request
        is then refused on sight (:meth:`_deaths_of`)."""
        out: dict[int, InferbusError] = {}
        deaths_map = self._deaths
        held = None if running is None else {seq for ingress, seq in running if ingress == self.config.ingress_id}
        local = running_local or ()
        # the run held it alone
        caught = fault and running is not None and len(running) + len(local) == 1
        counted = 0
        now_deaths: dict = {}  # key -> deaths after this crash: counted once per crash, though copies of one
        # request (a retry the worker joined to the first) are several pending entries with the same keys
        for s, p in self.pending.items():
            if p.worker_id != worker_id or (held is not None and s not in held):
                continue
            keys = death_keys(p.model_key, p.cache_key, p.body)
            if not keys:
                continue
            counted += 1
            refusal = count_crash(deaths_map, now_deaths, p.model_key, keys, reason, caught, now)
            if refusal is not None:
                self.counts["query_of_death"] += 1
                out[s] = Internal(refusal)
        for model_key, _rid, digest in local:  # the dead process's own ingress's: remembered for their retries
            self.counts["crash_suspects_heard"] += 1
            count_crash(deaths_map, now_deaths, model_key, (("body", model_key, digest),), reason, caught, now)
        commit_crash(deaths_map, now_deaths, reason, now)
        self._deaths_changed.extend(now_deaths)
        for k in now_deaths:
            self._note_crashed_model(k, now + QUERY_OF_DEATH_TTL_S)
        return out, not (held and counted and len(out) == counted)

    def _memory_entries(self, keys, now: float) -> list:
        """:class:`DeathMemory` entries of ``keys`` still remembered (all of :attr:`_deaths` for None)."""
        return memory_entries(self._deaths, keys, now)

    async def _share_deaths(self, keys) -> None:
        """Tell the other ingresses what a crash changed in this one's query-of-death memory (``<p>._deaths``), so
        that a client's retry through another ingress replica, or a colocated process, counts the same deaths
        (before, each ingress counted its own: 3-4 deaths per killer with ``--ingress 2``, a trial). Best effort: a
        message lost only costs the retry one more death (:func:`~inferbus.actors._crashes.share_memory`)."""
        await share_memory(self.nc, self.subjects, self._deaths, keys, self.config.ingress_id)

    def _merge_deaths(self, m: DeathMemory, now: float) -> int:
        """Take a peer's entries (:meth:`_share_deaths`, or its answer to :meth:`_fetch_deaths`, or the node's):
        :func:`~inferbus.actors._crashes.merge_memory`. Returns how many keys changed here."""
        changed = merge_memory(self._deaths, m, now)
        if changed:
            for key, _n, ttl_s, _reason, _refusal in m.entries:
                self._note_crashed_model(key, now + min(ttl_s, QUERY_OF_DEATH_TTL_S))
        return changed

    def _note_crashed_model(self, key, until: float) -> None:
        """Extend :attr:`_crashed_until` to ``until`` for the model of memory key ``key`` (``("body", model key,
        digest)``; a cache key's names no model)."""
        cu = self._crashed_until
        if len(key) == 3 and key[0] == "body" and isinstance(key[1], str) and cu.get(key[1], 0.0) < until:
            cu[key[1]] = until

    async def _on_deaths(self, msg) -> None:
        """A peer's :class:`DeathMemory` (``<p>._deaths``); or, on ``<p>._deaths.get``, a peer starting asks for
        this one's memory (answered when it remembers something: the node answers in any case)."""
        if msg.subject == self.subjects.deaths_get:
            await answer_ask(self.nc, msg, self._deaths, self.config.ingress_id)
            return
        try:
            m = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if isinstance(m, DeathMemory) and m.ingress != self.config.ingress_id:
            self.counts["deaths_shared_in"] += self._merge_deaths(m, time.monotonic())

    async def _fetch_deaths(self, timeout_s: float = 0.25) -> None:
        """At start, before taking requests: the query-of-death memory of the first to answer, merged: the node
        (:class:`~inferbus.actors._crashes.CrashKeeper`, which keeps every ingress's shares and answers in any case)
        or a peer that remembers something. A colocated process restarted after a killer crashed it took the
        killer's retry afresh and died again. With nobody to ask, NATS answers "no responders" at once; without a
        node and with peers that remember nothing, this waits ``timeout_s``, once."""
        try:
            msg = await self.nc.request(self.subjects.deaths_get, b"", timeout=timeout_s)
            m = decode_internal(msg.data)
        except Exception:  # no responders, a timeout, a reply from another version
            return
        if isinstance(m, DeathMemory):
            self.counts["deaths_shared_in"] += self._merge_deaths(m, time.monotonic())

    def _forget_deaths(self, now: float) -> None:
        """Drop the entries of :attr:`_deaths` past their time (the oldest first: the dict is in that order), so that
        it empties again once no crash is remembered, and the check on each request costs a truth test again."""
        deaths = self._deaths
        while deaths:
            k, e = next(iter(deaths.items()))
            if e[1] > now:
                return
            del deaths[k]

    def _deaths_of(self, model_key: str, cache_key: str | None, body: bytes, now: float,
                   req=None) -> tuple[int, str | None] | None:
        """``(crashes, refusal)`` that :meth:`_note_deaths` counted against this request (the most of its keys' within
        their time; the refusal of any of them), or None. A refusal (not None): a query of death, refused; else a
        suspect, run alone."""
        found = None
        for k in death_keys(model_key, cache_key, body, req):
            e = self._deaths.get(k)
            if e is None:
                continue
            if e[1] <= now:
                del self._deaths[k]
            elif found is None:
                found = (e[0], e[3])
            else:
                found = (max(found[0], e[0]), found[1] or e[3])
        return found

    async def _fail_pending(self, worker_id: str, err: InferbusError,
                            instead: dict[int, InferbusError] | None = None, resend: bool = False) -> int:
        """Answer every request pending at ``worker_id`` with ``err``, or with ``instead[seq]`` where given (a
        hedge copy still running elsewhere answers instead). With ``resend`` (the worker's process ended), a request
        with no ``instead`` answer is first sent again to another worker (:meth:`_resend`), within what is left of
        its budget and at most ``_MAX_RESENDS`` times in all; ``err`` only where that cannot be done.

        The loser of a hedged request already answered (:attr:`_Hedge.answered`: its other copy's completion came
        first, a result or a worker's error) is dropped without a word: its client has its one reply, so it is
        neither sent again nor answered ``err`` (``counts.hedge_losers_dropped``). Its in-flight count goes with
        every other request's at ``worker_id``: the callers zero the worker's (:meth:`Router.on_down
        <inferbus.actors._router.Router.on_down>`; the sweep, for a silent worker). Returns how many were pending."""
        victims = [s for s, p in self.pending.items() if p.worker_id == worker_id]
        now = time.monotonic()
        ready = self.router.ready_models(now) if resend and victims else None  # (once, not per request)
        for s in victims:
            p = self._pop(s)
            h = p.hedge
            if h is not None and h.answered:
                self.counts["hedge_losers_dropped"] += 1
                continue
            if h is not None and not h.done and any(
                    q in self.pending and self.pending[q].worker_id != worker_id for q in h.seqs):
                if p.span is not None:  # the other copy's completion ends the ingress span
                    self._pass_span(p, h, worker_id)
                continue  # the other copy may still answer; the client's budget covers the rest
            if h is not None and h.timer is not None and not h.done:
                h.done = True
                h.timer.cancel()
            answer = instead.get(s) if instead else None
            if answer is None and resend and await self._resend(p, now, err, ready):
                continue
            await self._error_pending(p, answer or err)
        return len(victims)

    async def _resend(self, p: Pending, now: float, err: InferbusError, ready: set[str],
                      exclude: str | None = None) -> bool:
        """Send again, to another worker, a request whose worker's process ended holding it (a crash or a stop),
        instead of answering it ``err`` (UNAVAILABLE): a client that does not retry (a raw NATS request in any language) gets
        its answer. Only a request forwarded over the bus (:attr:`Pending.hdrs`; a hedged one's first copy, unhedged), sent again fewer
        than ``_MAX_RESENDS`` times, with more than ``_RESEND_MIN_BUDGET_S`` of its budget left. It goes through
        :meth:`_forward` like a new request with the same body, headers, deadline and ids: one the crash made a
        suspect runs alone (``Inferbus-Alone``), one it made a query of death is refused (answered here). While no
        worker of its model is live (each died or restarts), it waits (``_parked``; the sweep sends it once one is,
        or answers ``err`` when its budget is spent; the ingress's stop answers it ``err``).
        ``ready``: the model versions with a live worker (:meth:`Router.ready_models`, read once by the caller).
        Returns False when it was not sent (the caller answers it ``err``); True when it was sent, parked, or
        answered with the error the forward raised (a full ingress: RESOURCE_EXHAUSTED)."""
        if p.hdrs is None or p.resends >= _MAX_RESENDS or p.deadline - now <= _RESEND_MIN_BUDGET_S:
            return False
        if p.model_key not in ready:
            self._parked.append((p, err))
            return True
        try:
            await self._forward(_Resent(p.body, p.reply), p.hdrs, p.content_type, now, now, now, p.deadline, p.mv,
                                p.cache_key, p.ttl_ms, p.request_id, None, now, None, resends=p.resends + 1,
                                exclude=exclude, endpoint=p.endpoint, span=p.span)
        except InferbusError as exc:
            await self._error_pending(p, exc)
            return True
        except Exception as exc:  # a bug here must not leave the worker's other requests unanswered
            log(f"ingress {self.config.ingress_id}: sending a request again failed: {exc!r}")
            return False
        if exclude is None:  # (one taken from a silent worker is counted as a quiet reroute)
            self.counts["resent_after_death"] += 1
        return True

    async def _reroute_quiet(self, now: float) -> None:
        """Send the requests this ingress forwarded to a worker silent past the suspicion age
        (:attr:`Router.suspect_s`, 2.5 s by default) to another worker of their model (:meth:`_resend`), and tell the
        silent one to drop them (``Cancel``; its stall fence, shorter than that age, refuses them anyway if it
        thaws). A raw client's request at a frozen (SIGSTOP) worker got nothing until the thaw and then the
        fence's UNAVAILABLE, seconds later, while another worker idled (a fresh-user trial, 2026-12-05); an SDK
        client's retry was already sent elsewhere at that age. Only requests forwarded over the bus and not hedged,
        with a budget left and another worker to take them; the others wait for the health timeout, as before.
        Not while this ingress is behind its own connection (the reports may be queued there): a round trip first."""
        age_s = self.router.suspect_s
        timeout_s = self.config.health_timeout_s
        quiet = {w.worker_id for w in self.router.workers.values()
                 if w.alive and w.last_report and age_s < now - w.last_report <= timeout_s}
        if not quiet:
            return
        held = [s for s, p in self.pending.items() if p.worker_id in quiet and p.hdrs is not None and p.hedge is None
                and p.resends < _MAX_RESENDS and p.deadline - now > _RESEND_MIN_BUDGET_S]
        if not held:
            return
        if not await self._caught_up(max(self.config.pending_grace_s, _SWEEP_PERIOD_S)):
            self._behind_at = time.monotonic()
            self.counts["behind_round_trips"] += 1
            return
        now = time.monotonic()
        ready = self.router.ready_models(now)
        cancels: dict[str, list[int]] = {}
        for s in held:
            p = self.pending.get(s)
            w = self.router.workers.get(p.worker_id) if p is not None else None
            if w is None or now - w.last_report <= age_s or self.router.pick(p.model_key, now, p.worker_id) is None:
                continue  # settled, reported meanwhile, or no other worker: it waits for its worker
            self._pop(s)
            self.router.on_done(p.worker_id, (now - p.t_fwd) * 1e6, outcome=NEUTRAL, probe=p.probe, now=now)
            cancels.setdefault(p.worker_id, []).append(s)
            self.counts["quiet_reroutes"] += 1
            err = Unavailable(f"worker {p.worker_id} went silent holding this request; safe to retry",
                              retry_after_ms=0)
            if not await self._resend(p, now, err, ready, p.worker_id):
                await self._error_pending(p, err)
        for wid, seqs in cancels.items():
            try:
                await self.nc.publish(control_subject(self.subjects.prefix, wid),
                                      encode_internal(Cancel(self.config.ingress_id, seqs)))
            except Exception:  # noqa: BLE001 - its stall fence refuses them anyway
                pass

    async def _unpark(self, now: float, stopping: bool = False) -> None:
        """Send the parked requests (:meth:`_resend`) whose model has a live worker again; answer those whose budget
        is spent, or all of them when ``stopping``, with the error they would have had."""
        parked, self._parked = self._parked, []
        ready = set() if stopping else self.router.ready_models(now)
        for p, err in parked:
            if stopping or not await self._resend(p, now, err, ready):
                await self._error_pending(p, err)

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_PERIOD_S)
            try:
                await self._sweep()
            except Exception as exc:  # keep sweeping whatever one pass hit
                log(f"ingress {self.config.ingress_id}: sweep failed: {exc!r}")

    def _saw_reconnect(self, now: float) -> float:
        """When this ingress last found its own NATS connection re-established (monotonic s; -inf if never),
        from nats-py's public ``stats["reconnects"]``, read once per sweep."""
        stats = getattr(self.nc, "stats", None)
        n = stats.get("reconnects", 0) if isinstance(stats, dict) else 0
        if n != self._reconnects_seen:
            self._reconnects_seen = n
            self._reconnected_at = now
        return self._reconnected_at

    def _saw_behind(self, now: float) -> float:
        """When this ingress last found itself behind its requests (monotonic s; -inf if never): requests that
        reached it past their client's deadline, or refused for its backlog, since the previous sweep."""
        seen = self.counts["expired_on_arrival"] + self.counts["backlog_shed"]
        if seen != self._behind_seen:
            self._behind_seen = seen
            self._behind_at = now
        return self._behind_at

    def _busy_within_budget(self, worker_id: str, now: float) -> bool:
        """Whether the worker's last report, fresh (within ``health_timeout_s``), says its inference thread is
        computing a batch whose requests' deadlines have not all passed: a request of this ingress waiting behind
        it is late for a legal reason. A batch computing past every deadline in it (hung model, injected delay)
        is not, nor is a worker that stopped reporting (the silent-worker check below fails it)."""
        w = self.router.workers.get(worker_id)
        return (w is not None and w.alive and w.computing_ms > 0 and not w.computing_overdue
                and now - w.last_report <= self.config.health_timeout_s)

    def _worker_behind(self, worker_id: str, now: float) -> bool:
        """Whether the worker, reporting (its last report within ``health_timeout_s``) and not computing a batch
        past its deadlines, showed its event loop behind its own input within the last 2 × ``pending_grace_s``
        (:attr:`WorkerState.behind_at`): a request of this ingress missing then was delayed by an overload of that
        worker, not lost by a fault. A worker that stopped reporting is not (the silent-worker check below fails
        it), nor one whose batch is overdue (a hung model: blamed), nor one whose reports came after a gap in that
        window (:attr:`WorkerState.gap_at`: it was frozen, and its backlog is what it read meanwhile)."""
        w = self.router.workers.get(worker_id)
        window_s = 2 * self.config.pending_grace_s
        return (w is not None and w.alive and not w.computing_overdue and now - w.behind_at <= window_s
                and now - w.gap_at > window_s and now - w.last_report <= self.config.health_timeout_s)

    async def _caught_up(self, timeout_s: float) -> bool:
        """Whether this ingress has received and settled every completion notice the server held for it: a round
        trip (:func:`_round_trip`; its PONG comes after every message the server had queued for this connection,
        the notices and the workers' load reports among them), then the notices' and the reports' subscriptions
        handled down to an empty buffer, all within
        ``timeout_s``. False when the PONG or the buffer took longer (this ingress reads its connection behind a
        backlog: a notice may still be waiting in it), or the connection closed or reconnected meanwhile."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        if not await _round_trip(self.nc, timeout_s):
            return False
        queues = [q for sub in (self._done_sub, self._load_sub) if (q := getattr(sub, "_pending_queue", None))]
        if not queues:  # a nats-py without it (checked at 2.9-2.16): the notices already read are handled
            await asyncio.sleep(0)
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*(q.join() for q in queues)), max(until - loop.time(), 0.0))
        except asyncio.TimeoutError:
            return False
        return True

    def _neutral_cause(self, p, now: float, reconnected_at: float, behind_at: float) -> str | None:
        """Why a forward missing past its deadline + ``pending_grace_s`` is no fault of its worker: the key of
        ``counts`` it goes under (the first cause that applies, the more specific first), or None when it is the
        worker's failure (``lost``: hung, partitioned). Used by the sweep's check before its round trip and by its
        verdict on each forward, so that the two cannot disagree."""
        if p.t_fwd <= reconnected_at:
            # forwarded before this ingress's own connection dropped: the worker's completion notice may have
            # come while nobody here was subscribed (its answer went straight to the client). Not the
            # worker's failure: blaming it opened every healthy worker's breaker after an overload that made
            # this ingress miss its PINGs (a fresh-user trial: UNAVAILABLE for ~30 s after the load stopped)
            return "lost_in_reconnect"
        if self._busy_within_budget(p.worker_id, now):
            # queued behind a batch its worker is still computing within that batch's own budget (one legal
            # multi-second request): late, not lost; blaming it opened a busy worker's breaker (fresh-user
            # trial: a 2-worker node not ready after two 7.7 MB requests)
            return "lost_while_busy"
        if self._worker_behind(p.worker_id, now):
            # the worker's loop was behind its own input (a backlog in its subscription): an overload of the
            # worker, not a fault; blaming it opened a 1-worker node's breaker after an overload and the node
            # refused every request for ~20 s (fresh-user trial, 2-core box)
            return "lost_while_worker_behind"
        if now - behind_at <= 2 * self.config.pending_grace_s:
            # this ingress is behind (the worker's own reports show nothing: the causes above, the more
            # specific, count first): the completion notice may be queued behind the same backlog of requests
            # (one connection carries both), so its absence says nothing about the worker
            return "lost_while_behind"
        return None

    def _verdict_waits(self, p, now: float) -> bool:
        """Whether the sweep leaves a forward missing past its deadline + ``pending_grace_s`` for later, for at most
        ``health_timeout_s`` more:

        * its worker is in a gap of its reports (:meth:`WorkerState.in_report_gap`), so whether it was stopped (a
          failure) or busy (an overload: a colocated process working off its own ingress's backlog, whose completion
          notices come late) is known only from its next report (:attr:`LoadReport.cpu_ratio`);
        * or its worker's reports resumed after a gap (frozen: SIGSTOP, a stalled VM) since this was forwarded: it is
          working through what it read while frozen (its stall fence refuses most of it, each with a completion
          notice), and what it has not reached yet is not lost; its reports' backlog cannot show that, since what
          waits in its socket is not counted (a fresh-user trial, 2026-12-05: a 3 s SIGSTOP of a colocated process
          under a burst, 63 answered requests counted lost by the other ingress and its breaker opened).

        The forward stays pending, and so priced in the worker's load, until its completion notice comes or the
        ``health_timeout_s`` is up (then it is judged as any other); the silent-worker check or a down event can
        settle it first. What a thawed worker really lost is blamed that much later."""
        w = self.router.workers.get(p.worker_id)
        if w is None or now - p.deadline > self.config.pending_grace_s + self.config.health_timeout_s:
            return False
        if w.in_report_gap(now) or w.gap_at >= p.t_fwd:
            if not p.waited:
                p.waited = True
                self.counts["verdicts_waited"] += 1
            return True
        return False

    async def _sweep(self) -> None:
        now = time.monotonic()
        for lw in self._latency.values():  # the forwards' latencies into the histograms (bounds what waits)
            if lw.pending:
                lw.fold()
        if self._deaths:
            self._forget_deaths(now)
        if self._parked:
            await self._unpark(now)
        grace = self.config.pending_grace_s
        reconnected_at = self._saw_reconnect(now)
        behind_at = self._saw_behind(now)
        stale = [s for s, p in self.pending.items() if p.deadline + grace < now and not self._verdict_waits(p, now)]
        if any(self._neutral_cause(self.pending[s], now, reconnected_at, behind_at) is None for s in stale):
            # one of them would be held against its worker: first make sure its completion notice is not still on
            # its way in, queued behind a backlog of this ingress's own connection (the server writes requests and
            # notices to it in one stream): under a burst of requests with no client deadline, nothing else shows
            # this ingress behind, and blaming the workers opened every breaker of a healthy node for ~30 s
            # (fresh-user trial, 2-core box: 20,000 requests at once from one raw NATS client)
            if not await self._caught_up(max(grace, _SWEEP_PERIOD_S)):
                self._behind_at = behind_at = time.monotonic()
                self.counts["behind_round_trips"] += 1
            now = time.monotonic()
            reconnected_at = self._saw_reconnect(now)
            stale = [s for s in stale if s in self.pending]  # settled meanwhile: not lost
        for s in stale:
            p = self._pop(s)
            cause = self._neutral_cause(p, now, reconnected_at, behind_at)
            if p.span is not None:
                self._end_span(p, DeadlineExceeded(f"no completion from worker {p.worker_id} "
                                                   f"{fmt_ms((now - p.deadline) * 1000)} ms after the deadline: "
                                                   f"given up ({cause or 'lost'})"), cause or "lost")
            if cause is not None:
                self.counts[cause] += 1
                self.router.on_done(p.worker_id, (now - p.t_fwd) * 1e6, outcome=NEUTRAL, probe=p.probe, now=now)
                continue
            self.counts["lost"] += 1
            # no completion long after the deadline: the worker lost it (hung, partitioned): a failure
            self.router.on_done(p.worker_id, (now - p.t_fwd) * 1e6, outcome=SERVER_ERROR, probe=p.probe, now=now)
        # a worker that stopped reporting (hung, partitioned) is failed like a dead one; not while this ingress's
        # own connection has just come back (the reports it missed were not the workers' silence)
        if now - reconnected_at <= self.config.health_timeout_s:
            return
        if now >= self._forget_check_at:
            self._forget_check_at = now + _FORGET_CHECK_PERIOD_S
            self._forget(now)
        await self._reroute_quiet(now)
        now = time.monotonic()
        timeout_s = self.config.health_timeout_s
        silent = {w.worker_id for w in self.router.workers.values()
                  if w.alive and w.last_report and now - w.last_report > timeout_s}
        if not silent or not any(p.worker_id in silent for p in self.pending.values()):
            return  # nothing to fail (failing nothing changed nothing before either)
        # nor while its reports may be queued behind a backlog of this ingress's own connection (one stream carries
        # requests, notices and reports): failing the worker's requests UNAVAILABLE then, while it computes and
        # answers them, gives their clients two answers each (seen in a burst of 30,000 from one client, 5,176 second
        # answers, with a connection that was not found stale behind the burst: an experiment of 2026-12-04, not
        # kept). First a round trip and the reports read before its PONG handled; a round trip that does not come
        # back in time says this ingress is behind, not the worker
        if not await self._caught_up(max(self.config.pending_grace_s, _SWEEP_PERIOD_S)):
            self._behind_at = time.monotonic()
            self.counts["behind_round_trips"] += 1
            return
        now = time.monotonic()
        for w in list(self.router.workers.values()):
            if w.alive and w.last_report and now - w.last_report > timeout_s:
                n = await self._fail_pending(w.worker_id, Unavailable(
                    f"worker {w.worker_id} stopped reporting; safe to retry", retry_after_ms=0))
                if n:
                    w.in_flight = 0
                    self.router.on_silent(w.worker_id, now)

    def _forget(self, now: float) -> None:
        """Forget the workers silent past the router's ``forget_after_s`` (:meth:`Router.forget`): a node SIGKILLed
        whole sends no ``down`` event, and its workers stayed in the table and the health reply as ``silent`` for
        ever. Not one this ingress still holds a forward of (the silent-worker check fails those first, at
        ``health_timeout_s``; a forget waits for it). Their load reports go too (model management's view); counted
        in ``counts.workers_forgotten``."""
        limit = self.router.forget_after_s
        if not any(now - w.last_report > limit for w in self.router.workers.values()):
            return  # (the common case: no pass over the pending forwards)
        gone = self.router.forget(now, {p.worker_id for p in self.pending.values()})
        if gone:
            for wid in gone:
                self.model_ctl.reports.pop(wid, None)
            self.counts["workers_forgotten"] += len(gone)
            log(f"ingress {self.config.ingress_id}: forgot worker{'s' if len(gone) > 1 else ''} {', '.join(gone)}: "
                f"no load report for {self.router.forget_after_s:g} s")

    async def _on_models(self, msg) -> None:
        subj = msg.subject
        ct = H.query_content_type(msg.headers)
        if subj == self.subjects.models:
            problems = self.model_ctl.version_problems(time.monotonic())
            body = encode(ModelList(models=[_with_problems(model_metadata(m), problems) for m in self.repo]), ct)
        else:
            name = subj[len(self.subjects.models) + 1:]
            tokens = name.split(".")
            ready = len(tokens) > 1 and tokens[-1] == "ready"  # <p>.models.<model>[.<version>].ready
            asked = tokens[:-1] if ready else tokens  # [model] or [model, version] ...
            if len(asked) > 2 or (len(asked) == 2 and not (asked[1].isascii() and asked[1].isdigit())):
                self.model_ctl.submit(msg, tokens[0], name.partition(".")[2])  # ... else a model-management write
                return
            name, version = asked[0], (asked[1] if len(asked) == 2 else None)
            try:
                if ready:
                    body = encode(self.model_ready(name, version), ct)
                else:
                    body = encode(_with_problems(self._metadata(name, version),
                                                 self.model_ctl.version_problems(time.monotonic())), ct)
            except (NotFound, InvalidArgument) as e:
                await self._error(msg.reply, e, ct, None, endpoint="model")
                return
        await self.nc.publish(msg.reply, body, headers=_reply_ct(ct))

    def _served(self, name: str, version: str | None) -> tuple[Model, ModelVersion]:
        """``(model, model version)`` of a served model version (None: the default version).

        Raises:
            NotFound: an unknown model (``field`` ``model``), or a version it does not serve (``model_version``).
            InvalidArgument: a version no folder is named (not decimal digits, or a leading zero: ``01``).
        """
        model = self.repo.get(name)
        if model is None:
            if (problem := name_problem(name)) is not None:  # no repository serves it: as the SDK says it
                raise InvalidArgument(problem, field="model")
            raise NotFound(f"unknown model {name!r}", field="model")
        mv = model.version(version)
        if mv is None:
            if (problem := version_problem(version)) is not None:
                raise InvalidArgument(problem, field="model_version")
            raise NotFound(f"model {name!r} has no version {version!r}; versions: "
                           f"{', '.join(sorted(model.versions, key=int))}", field="model_version")
        return model, mv

    def _metadata(self, name: str, version: str | None) -> ModelMetadata:
        """:func:`model_metadata` of a served model version; NotFound as :meth:`_served` says."""
        return model_metadata(self._served(name, version)[0], version)

    def _readiness(self, now: float) -> tuple[set[str], set[str], dict[str, dict], dict[str, str]]:
        """``(ready, wanted, problems, not_here)``: the model version keys (``"digits:2"``) this ingress can serve
        now, those it must for the node to be ready (every default version, and any version some worker refuses),
        the versions not served for their files (:meth:`IngressModels.version_problems`) and the served versions
        this ingress cannot read (``{"digits:3": why}``)."""
        ready_models = self.router.ready_models(now)
        wanted = {m.version(None).key for m in self.repo}
        # a served version whose files changed or are gone on every live worker that (re)loaded it: not ready either
        problems = self.model_ctl.version_problems(now)
        wanted |= {k for k, p in problems.items() if not p["ready"]}
        not_here = {f"{m}:{v}": why for m, vs in self.versions_not_here.items() for v, why in vs.items()}
        if not_here:  # served versions this ingress cannot read (not in its host's model folder): not ready here
            wanted |= set(not_here)
            ready_models = ready_models - set(not_here)
        if self.repo.unreadable:
            # a model this (restarted) ingress could not read but the workers serve: not ready here, and not listed
            # ready (a fresh-user trial: "ready": true and fraud:1 in models_ready, while it answered NOT_FOUND)
            left_out = {k for k in ready_models if k.rpartition(":")[0] in self.repo.unreadable}
            wanted |= left_out
            ready_models = ready_models - left_out
        return ready_models, wanted, problems, not_here

    def model_ready(self, name: str, version: str | None = None) -> ModelReady:
        """OIP v2 model ready of ``version`` of ``name`` (None: its default version), by :meth:`_readiness`.

        Raises:
            NotFound: an unknown model (``field`` ``model``), or a version it does not serve (``model_version``).
        """
        mv = self._served(name, version)[1]
        ready, _, problems, _ = self._readiness(time.monotonic())
        return ModelReady(name=name, version=mv.version,
                          ready=mv.key in ready and problems.get(mv.key, {}).get("ready", True))

    def health(self) -> Health:
        """Live/ready and the serving state: per-worker health and breaker, limits, hedging, cache."""
        now = time.monotonic()
        ready_models, wanted, problems, not_here = self._readiness(now)
        latency = {}
        for k, lw in self._latency.items():
            p50, p95 = lw.quantile(0.5, now), lw.quantile(0.95, now)
            latency[k] = {"p50_ms": None if p50 is None else round(p50 / 1000, 3),
                          "p95_ms": None if p95 is None else round(p95 / 1000, 3), "samples": len(lw.samples)}
        params = {
            "ingress_id": self.config.ingress_id, "pid": os.getpid(), "models_ready": sorted(ready_models),
            "workers_live": sum(1 for w in self.router.workers.values() if self.router.live(w, now)),
            "pending": len(self.pending), "l1_entries": len(self.l1), "l1_bytes": self.l1.bytes,
            "l2_inflight": self._l2_inflight,
            "backlog": self._infer_sub.pending_msgs if self._infer_sub is not None else 0,
            "max_backlog_msgs": self.config.max_backlog_msgs,
            "workers": self.router.status(now), "counts": {**self.counts, "route_scans": self.router.scans}, "rate_limit": self.limiter.stats(),
            "latency": latency, "hedge_budget_tokens": round(self.hedge_budget.tokens, 2),
            "local_worker": self.router.local_worker_id or None, "nats_server": connected_server(self.nc),
            "layouts": self._layouts.stats(),
        }
        if problems:  # {"digits:2": {"ready": false, "workers": {"n1-w0": "model 'digits' version 2: digest ..."}}}
            params["model_versions_not_served"] = problems
        if self.repo.unreadable:  # {"fraud": "ModelConfigError: ..."}: left out when this (restarted) ingress read it
            params["models_unreadable"] = dict(self.repo.unreadable)
        if not_here:  # {"digits:3": "not in this host's model folder (...)"}
            params["versions_not_here"] = not_here
        if self.redis is not None:
            pool = self.redis.connection_pool
            params["l2_pool_in_use"] = len(getattr(pool, "_in_use_connections", ()))
            params["l2_pool_size"] = self.config.l2_pool_size
            params["l2_lookups"] = self._l2_state(now)  # closed: on; open: off (failing); half_open: the next probes
            params["l2_lookups_off_times"] = self.l2_outages
        return Health(live=True, ready=wanted <= ready_models, parameters=params)

    async def _on_server(self, msg) -> None:
        """OIP v2 server metadata (``<p>.server``), in the encoding the request's content type names."""
        ct = H.query_content_type(msg.headers)
        await self.nc.publish(msg.reply, encode(SERVER_METADATA, ct), headers=_reply_ct(ct))

    async def _on_health(self, msg) -> None:
        ct = H.query_content_type(msg.headers)
        await self.nc.publish(msg.reply, encode(self.health(), ct), headers=_reply_ct(ct))

    def _stats_data(self, endpoint_stats) -> dict:
        """``data`` of the endpoints in ``$SRV.STATS`` (the ``infer`` endpoint's; the others' is empty): breaker
        states and verdicts per worker, ``counts``, and for ``inferbus up --metrics-port`` (read at scrape time,
        nothing counted per request for it): every served model version (``models``) and the ready ones,
        pending forwards, the subscription backlog, L1 entries and bytes, L2 lookups in flight, the per-worker
        view of the router (``workers``) and the latency window's quantiles per model version in µs
        (``latency_us``: ``{key: {"0.5": µs, "0.95": µs, "0.99": µs, "samples": n}}``, None with too few samples),
        the request layouts (``layouts``: :meth:`RequestLayouts.stats`) and, per model version, the counts since the
        process started, versions unloaded since included (``per_model``: ``{key: {"forward": {"le": [cumulative count per bound of
        LATENCY_BOUNDS_US], "count": n, "sum_us": µs, "last_ms": ms since the epoch}, "l1_hits": n, "l2_hits": n, "errors": {code: n}}}``,
        every latency observed so far folded in first)."""
        if getattr(endpoint_stats, "name", "") != "infer":
            return {}
        now = time.monotonic()
        st = self.router.status(now)
        latency = {}
        per_model: dict[str, dict] = {}
        for k, lw in self._latency.items():
            q = {str(p): lw.quantile(p, now) for p in (0.5, 0.95, 0.99)}
            latency[k] = {**q, "samples": len(lw.samples)}
            lw.fold()
            per_model[k] = {"forward": lw.histogram()}
        for k, lw in self._retired.items():  # unloaded versions: their counts (folded when retired)
            per_model[k] = {"forward": lw.histogram()}
        for name, hits in (("l1_hits", self._l1_hits), ("l2_hits", self._l2_hits)):
            for k, n in hits.items():
                per_model.setdefault(k, {})[name] = n
        for (k, code), n in self._model_errors.items():
            per_model.setdefault(k, {}).setdefault("errors", {})[code] = n
        return {"breakers": {k: v["breaker"] for k, v in st.items()},
                "health": {k: v["health"] for k, v in st.items()}, "counts": {**self.counts, "route_scans": self.router.scans},
                "workers": st, "models": sorted(mv.key for m in self.repo for mv in m.versions.values()),
                "models_ready": sorted(self.router.ready_models(now)), "pending": len(self.pending),
                "backlog": self._infer_sub.pending_msgs if self._infer_sub is not None else 0,
                "l1_entries": len(self.l1), "l1_bytes": self.l1.bytes, "l2_inflight": self._l2_inflight,
                "l2_lookups": self._l2_state(now) if self.redis is not None else None,
                "l2_lookups_off_times": self.l2_outages if self.redis is not None else None,
                "latency_us": latency, "layouts": self._layouts.stats(), "per_model": per_model}

    async def run(self, *, nc=None, ready=None) -> None:
        """Connect, subscribe (internal subjects first, public last), announce readiness, serve.

        Args:
            nc: a connection to use instead of opening one (shared with a colocated worker); the caller
                owns it: this actor does not drain it when it stops.
            ready: called once subscribed and flushed, instead of the GC freeze and the ``READY`` line.
        """
        set_affinity(self.config.cpu_affinity)
        own_nc = nc is None
        self.nc = await connect_logged(self.config.bus, f"ingress-{self.config.ingress_id}") if own_nc else nc
        if not self.max_request_bytes:
            self.max_request_bytes = self.nc.max_payload or 8 * 1024 * 1024
        if self.config.redis_url and self.config.l2_lookup:
            import redis.asyncio as aioredis

            pool = aioredis.BlockingConnectionPool.from_url(
                self.config.redis_url, max_connections=self.config.l2_pool_size,
                timeout=max(self.config.l2_timeout_ms / 1000.0, 0.001), socket_timeout=0.5,
                socket_connect_timeout=0.5)
            self.redis = aioredis.Redis(connection_pool=pool)
        s = self.subjects
        self._load_sub = await self.nc.subscribe(s.load, cb=self._on_load)
        if self.local_worker is not None:
            # the colocated worker's first report went out before this subscription: take it in-process, so that
            # a process restarted beside live workers routes to its own worker from its first request, not from
            # the worker's next report (report_interval_ms; a CI run once saw 200 requests go over the bus first)
            self._take_report(self.local_worker._report())
        await self.nc.subscribe(s.events, cb=self._on_event)
        self._done_sub = await self.nc.subscribe(s.done(self.config.ingress_id), cb=self._on_done)
        await self.nc.subscribe(s.rid_query, cb=self._on_rid_query)  # peers locating a retried request's copy
        await self.nc.subscribe(s.deaths, cb=self._on_deaths)  # peers sharing their query-of-death memory
        await self._fetch_deaths()  # (before this one answers such asks: it would answer its own)
        await self.nc.subscribe(s.deaths_get, cb=self._on_deaths)
        await self.fencing.start(self.nc)
        await self.model_ctl.start(self.nc)
        await self._await_workers()
        from nats.micro import add_service

        svc = await add_service(self.nc, name="inferbus-ingress", version=__version__,
                                description="inferbus ingress (request actor + router)",
                                metadata={"ingress_id": self.config.ingress_id}, stats_handler=self._stats_data)
        q = s.ingress_queue
        await svc.add_endpoint(name="infer", subject=s.infer_all, queue_group=q,
                               handler=lambda req: self._on_infer(req._msg))
        self._infer_sub = endpoint_subscription(svc, "infer")
        # a client's retry sent to this ingress only (the one that answered <p>.ingresses first), served as on
        # <p>.infer.<model>[.<version>]: an attempt that went to a hung ingress is not handed to it again by the queue
        # group (docs/failure-semantics.md, "A hung ingress")
        self._infer_head = s.infer_bare + "."
        self._at_head = s.ingress_infer(self.config.ingress_id) + "."
        # an endpoint of its own (`infer_at` in $SRV.STATS: its requests, handler time and errors; the metrics' error
        # count adds it to infer's), the subject this ingress's alone
        await svc.add_endpoint(name="infer_at", subject=self._at_head + ">", queue_group=q,
                               handler=lambda req: self._on_infer_at(req._msg))
        at_sub = endpoint_subscription(svc, "infer_at")
        # the reads (metadata, readiness, health, server) and model-management writes, at this ingress alone too
        self._at_root = f"{s.prefix}.ingresses.{self.config.ingress_id}."
        reads = [await self.nc.subscribe(self._at_root + rest, cb=self._on_read_at)
                 for rest in ("health", "server", "models", "models.>")]
        self._at_infer_sub = at_sub
        self._at_subs = [await self.nc.subscribe(s.ingresses, cb=self._on_ingresses), *reads,
                         await self.nc.subscribe(self._at_head[:-1], cb=self._on_infer_bare)]
        # `<p>.infer` itself (no model token) matches no endpoint: a hand-written client got NATS's "no responders"
        await self.nc.subscribe(s.infer_bare, queue=q, cb=self._on_infer_bare)
        await svc.add_endpoint(name="models", subject=s.models, queue_group=q, handler=lambda r: self._on_models(r._msg))
        await svc.add_endpoint(name="model", subject=s.models_all, queue_group=q, handler=lambda r: self._on_models(r._msg))
        await svc.add_endpoint(name="health", subject=s.health, queue_group=q, handler=lambda r: self._on_health(r._msg))
        await svc.add_endpoint(name="server", subject=s.server, queue_group=q, handler=lambda r: self._on_server(r._msg))
        self._error_counters = {name: endpoint_error_counter(svc, name) for name in ("infer", "infer_at", "model")}
        named = {"sweeper": self._sweeper}
        if self.busy_poll is not None and self.local_worker is None:
            named["busy-poll"] = self.busy_poll.run
        loops = await supervise_loops(f"ingress-{self.config.ingress_id}", named)
        await self.nc.flush()
        if ready is None:
            serving_gc()
            announce_ready()
        else:
            ready()
        serving = asyncio.ensure_future(loops.run())
        try:
            # returns only by escalation (IntensityExceeded): the process then exits abnormally. Waited for, not
            # awaited: a SIGTERM cancels this task alone, and the loops (the sweeper) keep running through the
            # stop's drain until its close phase stops them (a cancelled run() stopped them at once)
            await asyncio.wait({serving})
            serving.result()
        finally:
            await self._stop(loops, svc, own_nc)
            serving.cancel()  # (done already unless a bound cut the loops' stop short)
            await asyncio.gather(serving, return_exceptions=True)

    # ---- graceful stop ------------------------------------------------------------------------
    async def _stop(self, loops, svc, own_nc: bool) -> None:
        """Graceful stop (SIGTERM: ``run()`` cancelled), within :data:`STOP_BOUND_S` whatever the backlog.

        1. Drain (:data:`STOP_DRAIN_S`): the ``infer`` subscription takes nothing new, and the requests it received
           are handled and forwarded as usual (the node stops its workers after its ingresses); new requests go to
           the other replicas of the queue group.
        2. Refuse (:data:`STOP_REFUSE_S`), when the drain did not finish: each request still waiting is answered
           UNAVAILABLE at once; past this phase the rest is dropped, and a request whose handling is still running
           is cut short (:meth:`_stop_infer`).
        3. Close (:data:`STOP_CLOSE_S`): the loops stop; the connection, when this actor owns it, is flushed (a
           PING/PONG round trip: what it forwarded and answered has reached the server) and closed, else (colocated)
           the micro service is stopped on it. Not nats-py's ``Client.drain()``: that one handled every
           subscription's whole buffer again (a flood's backlog in the ``infer`` one: the process was killed 5 s
           after SIGTERM), and cut short by a cancellation it leaves its gather of the subscriptions' drains
           unretrieved (asyncio then logs ``_GatheringFuture exception was never retrieved``).

        The phases count from the signal (:attr:`StopSignal.at`) when the loop let the stop begin later.

        Cancellation: a second cancellation (a second SIGTERM) during the stop ends the drain or refusal phase at
        once (the requests still waiting are dropped) and goes on with the close; it is not raised from here.
        Never raises otherwise: errors (a connection already closed) are logged.
        """
        t0 = t_began = time.monotonic()
        backlog = getattr(self._infer_sub, "pending_msgs", None)
        log(f"ingress {self.config.ingress_id}: draining: {len(self.pending)} requests in flight"
            f"{'' if backlog is None else f', {backlog} waiting in its subscription'} (at most "
            f"{STOP_DRAIN_S + STOP_REFUSE_S:g} s)", logging.INFO)
        if StopSignal.at is not None and StopSignal.at < t0:
            if t0 - StopSignal.at > 0.05:
                log(f"ingress {self.config.ingress_id}: stop began {t0 - StopSignal.at:.2f} s after the signal; its "
                    f"phases count from the signal")
            t0 = StopSignal.at
        cut = False
        at_infer = self._at_infer_sub  # drained as infer's (below)
        for sub in self._at_subs:  # the probe first: no client is sent here any more; then the reads
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        try:
            drain_until, refuse_until = t0 + STOP_DRAIN_S, t0 + STOP_DRAIN_S + STOP_REFUSE_S
            stops = [self._stop_infer(drain_until, refuse_until)]
            if at_infer is not None:
                stops.append(self._stop_infer(drain_until, refuse_until, at_infer))
            await asyncio.gather(*stops)
            if self._parked:  # waiting for a worker this ingress will no longer send them to
                await self._unpark(time.monotonic(), stopping=True)
        except asyncio.CancelledError:
            cut = True
            log(f"ingress {self.config.ingress_id}: stop cut short (cancelled again): what still waited is dropped")
        t_end = time.monotonic() + STOP_CLOSE_S
        try:
            await asyncio.wait_for(loops.stop(), max(t_end - time.monotonic(), 0.0))
        except (Exception, asyncio.CancelledError) as exc:  # noqa: B902 (a second cancellation: close all the same)
            log(f"ingress {self.config.ingress_id}: stopping its loops: {exc!r}")
        if not own_nc and not cut:  # a shared connection (colocated) stays: take this actor's endpoints off it
            try:
                await asyncio.wait_for(svc.stop(), max(t_end - time.monotonic(), 0.0))
            except (Exception, asyncio.CancelledError) as exc:  # noqa: B902
                log(f"ingress {self.config.ingress_id}: stopping its service: {exc!r}")
        if own_nc:  # closing it ends the service's subscriptions too
            try:
                await _round_trip(self.nc, max(t_end - time.monotonic(), 0.0))
            except asyncio.CancelledError:
                pass
            await _close_quietly(self.nc)
        log(f"ingress {self.config.ingress_id}: stopped {time.monotonic() - t_began:.2f} s after its drain began"
            f"{' (cut short)' if cut else ''}; {len(self.pending)} requests left unanswered", logging.INFO)

    async def _stop_infer(self, drain_until: float, refuse_until: float, sub=None) -> None:
        """Phases 1 and 2 of :meth:`_stop` on the ``infer`` subscription (monotonic deadlines, s), or on ``sub``
        (``<p>.ingresses.<ingress_id>.infer.>``, the retries sent to this ingress alone: the same, so that a backlog
        there is answered too; a fresh-user trial's SIGTERM left 2,988 of 3,000 such requests without any answer when
        that subscription was only unsubscribed).

        UNSUB, then a PING (:func:`inferbus.bus._connect.drain_subscription`): its PONG comes after every request the server sent before the UNSUB,
        so once it is back and the buffer is empty, everything this ingress was given has been handled or answered.
        Until ``drain_until`` the requests are handled as usual; then, if some still wait (or the PONG has not
        come), each one the subscription delivers is answered UNAVAILABLE (:meth:`_refuse_stopping`: 10-20 µs each,
        where handling one takes up to a few ms on a saturated box) until ``refuse_until``, and dropped past it.
        Then the subscription is forgotten (messages for it are dropped, and a reconnect does not subscribe it
        again: nats-py subscribes again every subscription it still has, so a reconnect during the old drain, which
        a flood makes likely, handed the ingress the flood again) and its task is stopped.

        Falls back to :func:`drain_endpoint` (the drain alone, at most ``drain_until``) when nats-py's internals it
        uses are missing (logged).

        Cancellation: the phase in progress ends; the subscription is still forgotten and stopped, what waits is
        dropped, and the cancellation is raised.
        """
        sub, nc = sub or self._infer_sub, self.nc
        if sub is None:
            return
        if not _can_stop_apart(nc, sub):
            log(f"ingress {self.config.ingress_id}: nats-py internals changed: the stop drains its infer "
                f"subscription for at most {STOP_DRAIN_S} s without refusing what is left")
            await drain_endpoint(sub, max(drain_until - time.monotonic(), 0.0))
            return
        queue = sub._pending_queue
        t0 = time.monotonic()
        tally = {"refused": 0, "dropped": 0}
        drained = asyncio.ensure_future(drain_subscription(nc, sub))
        try:
            await asyncio.wait({drained}, timeout=max(drain_until - time.monotonic(), 0.0))
            if not drained.done():
                waiting = queue.qsize()
                sub._cb = functools.partial(self._refuse_stopping, until=refuse_until, tally=tally,
                                            endpoint="infer" if sub is self._infer_sub else "infer_at")
                await asyncio.wait({drained}, timeout=max(refuse_until - time.monotonic(), 0.0))
                unsent = "" if drained.done() else " and what the server had yet to deliver"
                log(f"ingress {self.config.ingress_id}: stop: {STOP_DRAIN_S} s of draining did not finish ({waiting} "
                    f"requests waiting, more on their way); answered {tally['refused']} UNAVAILABLE (retry "
                    f"elsewhere), dropped {tally['dropped'] + queue.qsize()}{unsent}; stop took "
                    f"{time.monotonic() - t0:.2f} s so far")
        finally:
            # its outcome retrieved, the subscription forgotten and stopped (a request still being handled is cut
            # short: the close's bound)
            await end_drain(nc, sub, drained)

    async def _refuse_stopping(self, msg, *, until: float, tally: dict, endpoint: str = "infer") -> None:
        """The ``infer`` (or ``infer_at``) subscription's callback once the stop's drain is over: answer ``msg``
        UNAVAILABLE at once (its encoding, its request id; counted as an error reply of ``endpoint``) until ``until``
        (monotonic s), drop it after."""
        if not msg.reply:
            return
        if time.monotonic() >= until:
            tally["dropped"] += 1
            return
        hdrs = msg.headers or {}
        self.counts["errors"] += 1
        tally["refused"] += 1
        t0 = time.monotonic()
        err = Unavailable(f"ingress {self.config.ingress_id} is shutting down; retry elsewhere", retry_after_ms=0)
        await self._error(msg.reply, err, _error_content_type(hdrs.get(H.CONTENT_TYPE), msg.data),
                          hdrs.get(H.REQUEST_ID), endpoint)
        if self._tracing is not None:
            key = self._served_key(msg.subject if endpoint == "infer" else
                                   self._infer_head + msg.subject[len(self._at_head):])
            self._tracing.error(hdrs, t0, key, self.config.ingress_id, err, "stopping")


def main(config_json: str) -> None:
    """Process entry: ``python -m inferbus.actors ingress '<IngressConfig JSON>'``."""
    cfg = IngressConfig.from_json(config_json)
    run_actor(Ingress(cfg).run)
