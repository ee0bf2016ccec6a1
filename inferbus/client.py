"""The Python SDK: an async client for inferbus over NATS.

Example::

    async with await Client.connect("nats://127.0.0.1:4222") as client:
        out = await client.infer("digits", {"pixels": x}, timeout_s=0.5)
        out["probabilities"]          # np.ndarray float32 [1, 10]

Errors come back as the typed exceptions of :mod:`inferbus.schemas`
(``InvalidArgument``, ``NotFound``, ``DeadlineExceeded``, ``ResourceExhausted``,
``Unavailable``, ``PayloadTooLarge``, ``Internal``). UNAVAILABLE (including NATS
"no responders"), a lost connection and an attempt with no answer within its
per-attempt timeout are retried within the remaining budget with the same request
id, so a retried request is never computed as a different request (see :class:`Client`).

Regions (DESIGN §8): give :meth:`Client.connect` the servers of every region,
the local region first (``no_randomize=True`` keeps that order). Its defaults
notice a dead server within ``ping_interval_s * max_outstanding_pings`` (0.5 s;
at once when the server's process is gone and the socket resets), reconnect to
the next server without waiting, and fail every request that was in flight on
the lost connection at once, so they are retried on the new one (same request
id) instead of waiting out their budget.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import math
import numbers
import random
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import nats
import numpy as np
from nats.errors import (
    ConnectionClosedError, ConnectionDrainingError, NoRespondersError, NoServersError, OutboundBufferLimitError,
    TimeoutError as NatsTimeout,
)

def _tally(sent: int, met: Mapping[str, int] | None, count_one: bool = False) -> str:
    """``<sent> attempts: <n> <kind>, ...``, the attempts of a request whose budget ran out counted by what ended
    them (``no responders``, ``timed out``, ``while disconnected``, ``connection lost``, ``UNAVAILABLE``, ...; in
    the order first met), for the error raised then; ``""`` for a single attempt (its own error says what it met)
    unless ``count_one`` (the error is about something else), and for none. ``met`` empty or None: ``<sent>
    attempts``."""
    if sent <= 0 or (sent == 1 and not count_one):
        return ""
    kinds = ", ".join(f"{n} {kind}" for kind, n in (met or {}).items())
    return f"{sent} attempt{'s' if sent > 1 else ''}" + (f": {kinds}" if kinds else "")


def _no_answer(timeout_s: float, sent: int, last_err: Exception | None, which: str,
               met: Mapping[str, int] | None = None, disconnected: bool | str = False,
               count_one: bool = False, at: str | None = None) -> DeadlineExceeded:
    """The DEADLINE_EXCEEDED of a request whose budget ran out: ``no answer within <budget> ms (<sent> attempts:
    <what they met, by kind>; <which>: <last_err>)``, the parts that apply (the tally: :func:`_tally`); when nothing
    was sent, ``nothing was sent within the budget of <budget> ms (...)``. ``disconnected``: the client's connection was down when the budget ran
    out (said, so that a user does not look for a slow server); ``"closed"``: nats-py closed it for good (it does not
    reconnect after a server ``-ERR``: said so, not "reconnecting"). ``count_one``: tally a single attempt too
    (``last_err`` is not that attempt's). ``at``: the id of the one ingress the client sent the last attempt to (``no
    answer from ingress <at> within ...``), None when it went through the queue group or to the caller's subject."""
    tally = _tally(sent, met, count_one)
    detail = ([tally] if tally else []) + ([f"{which}: {last_err}"] if last_err else [])
    # with nothing sent there was no answer to wait for (a fresh-user trial read "no answer within 1e-06 ms; nothing
    # was sent" as a contradiction)
    head = (f"no answer{f' from ingress {at}' if at else ''} within {_fmt_ms(timeout_s * 1000)} ms" if sent
            else f"nothing was sent within the budget of {_fmt_ms(timeout_s * 1000)} ms")
    link = ""
    if disconnected == "closed":  # nats-py closed it for good (a server -ERR): no reconnect will come
        link = "; this client is not connected to NATS (its connection was closed for good: connect a new Client)"
    elif disconnected:
        link = "; this client is not connected to NATS (reconnecting)"
    return DeadlineExceeded(head + (f" ({'; '.join(detail)})" if detail else "") + link)


def _with_tally(last_err: InferbusError, sent: int, met: Mapping[str, int], note: str = "") -> InferbusError:
    """The retryable error (UNAVAILABLE, RESOURCE_EXHAUSTED) raised when a request's budget ran out between its
    retries: the last one met, of the same type, its message followed by the attempts' tally as the
    DEADLINE_EXCEEDED gives it (:func:`_tally`) and ``note``: ``no responders on inferbus.infer.digits: no ingress
    is serving (17 attempts: 17 no responders)``. Its field and ``retry_after_ms`` are the last one's; ``last_err``
    itself when there is nothing to add (one attempt)."""
    detail = "; ".join(part for part in (_tally(sent, met), note) if part)
    if not detail:
        return last_err
    return type(last_err)(f"{last_err.message} ({detail})", field=last_err.field,
                          retry_after_ms=last_err.retry_after_ms)


def _ingress_token(ingress_id: str | None) -> bool:
    """Whether ``ingress_id`` (an answer to ``<p>.ingresses``) can be one subject token: not empty, no ``.``, ``*``,
    ``>`` or whitespace, at most :data:`~inferbus.bus._subjects.MAX_NAME_BYTES` bytes (an answer that cannot name an
    ingress's own subject is not used)."""
    return (bool(ingress_id) and name_problem(ingress_id) is None
            and not any(c in _NOT_IN_A_TOKEN or c.isspace() for c in ingress_id))


def _connect_causes(failures: list[tuple[str, BaseException]], final: BaseException, try_s: float) -> str:
    """Why a first connect failed, for its Unavailable: each server's last failure (``h1:4222: not connected within
    2 s (TimeoutError); h2:4222: [Errno 111] Connect call failed ...``, in the order first tried), or the last cause
    alone when every server failed alike (same error type, and same errno or text) or only one was tried; ``final``
    (what the connect raised) when no try reported a failure. ``try_s``: the connect timeout of one try, seconds
    (nats-py's timeout says only ``TimeoutError``)."""
    def text(exc: BaseException) -> str:
        if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and not str(exc):
            return f"{_NOT_CONNECTED_WITHIN} {try_s:g} s ({type(exc).__name__})"
        return str(exc) or type(exc).__name__

    def kind(exc: BaseException) -> tuple:  # an OS error names its address: alike when type and errno are
        return (type(exc), exc.errno) if isinstance(exc, OSError) and exc.errno else (type(exc), text(exc))

    last = {server: exc for server, exc in failures}  # dicts keep first-insertion order, last value
    if len({kind(exc) for exc in last.values()}) > 1:
        return "; ".join(f"{server}: {text(exc)}" for server, exc in last.items())
    return text(failures[-1][1]) if failures else text(final)


_NOT_CONNECTED_WITHIN = "not connected within"
"""How :func:`_connect_causes` starts a try's timeout (the CLI words it with its budget instead)."""


_FAILOVER_DEFAULTS = {"ping_interval_s": 0.25, "max_outstanding_pings": 2, "reconnect_time_wait_s": 0.05,
                      "no_randomize": True}
"""Client.connect's bus settings unless overridden: a blackholed server is given up after ~0.5 s; servers
are tried in the order given (list the local region's first; ``no_randomize=False`` spreads clients)."""


from .bus import BusConfig, ConnectionLost as _ConnectionLost, Subjects, close_connection, connect, fail_pending_requests
from .bus import server_url_problem, version_problem, shown_servers, split_servers
from .bus._subjects import control_line_problem, name_problem, reply_bytes
from .bus import headers as H
from .schemas._errors import fmt_ms as _fmt_ms
from .schemas._hedge_policy import HedgePolicyError, parse_policy
from .schemas import (
    MAX_PARAMETERS, MAX_REQUEST_ID_CHARS, MAX_TENSORS, DeadlineExceeded, InferRequest, InferResponse, InvalidArgument,
    ModelList,
    ModelMetadata,
    PayloadTooLarge,
    RequestedOutput,
    ResourceExhausted, Unavailable, decode, decode_error, decode_response, encode_request, input_from_numpy,
    parameter_field,
    output_to_numpy, Health, ModelReady, ServerMetadata,
)

_MAX_BACKOFF_MS = 100.0
_RETRY_TOKEN_RATIO = 0.1
"""Tokens an answered request gives back to the RESOURCE_EXHAUSTED retry bucket (gRFC A6's ``tokenRatio``; its
examples use 0.1)."""
_RTO_MIN_SAMPLES = 16
"""Answers seen on a subject before its per-attempt timeout is derived from their latency."""
_RTO_MIN_RETRY_MS = 20.0
"""An attempt timeout is not retried with less than this left of the budget (the answer could not come)."""
_INGRESS_PROBE_MAX_MS = 100.0
"""The longest wait for the first ingress to answer ``<p>.ingresses`` before a retry (a quarter of the budget left
at most); without an answer in time the retry goes through the queue group."""
_INGRESS_PROBE_OFF_S = 5.0
"""After ``<p>.ingresses`` met no responders (ingresses older than the probe), retries go through the queue group for
this long without asking again."""


_NOT_IN_A_TOKEN = frozenset(".*>")


def _subject_token(value: str, field: str) -> str:
    """``value`` (a model name or version) if it can be one NATS subject token, else InvalidArgument at once.

    A name with a ``.`` would address another model or version, ``*``/``>`` are wildcards, and an empty or
    space-containing one is no subject at all (nats-py raises its own BadSubjectError, or the request waits
    for its budget on a subject nothing serves). A name longer than :data:`~inferbus.bus._subjects.MAX_NAME_BYTES`
    (128) bytes of UTF-8 names no model (a repository refuses such a folder), and a much longer one made a subject
    the NATS server answered by closing the connection for good (a fresh-user trial: a 5,000-character name left the
    Client dead, "the NATS connection is closed").
    """
    if not isinstance(value, str):
        kinds = "a string or an int >= 0" if field == "model_version" else "a string"
        raise InvalidArgument(f"{field} must be {kinds}, got {type(value).__name__} {value!r}", field=field)
    if (problem := name_problem(value, field)) is not None:
        raise InvalidArgument(problem, field=field)
    if (not value or not value.isprintable() or any(c.isspace() for c in value)
            or not _NOT_IN_A_TOKEN.isdisjoint(value)):
        raise InvalidArgument(f"{field} {value!r} must be a non-empty name without '.', '*', '>' or whitespace",
                              field=field)
    return value


def _is_masked(arr) -> bool:
    """True for a ``numpy.ma.MaskedArray``. Looks ``numpy.ma`` up in ``sys.modules`` rather than as ``np.ma``:
    numpy loads that submodule lazily on first access, which cost a client's first call ~10 ms; a program
    that never imported it holds no masked array."""
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(arr, ma.MaskedArray)


def _check_timeout(timeout_s) -> None:
    """``timeout_s`` is a finite number of seconds > 0, else InvalidArgument at once (``field`` ``timeout_s``):
    0, a negative budget, NaN (every comparison with it is false) or infinity (a request that could wait and
    retry forever) is the caller's error, not a deadline."""
    if (isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real)
            or not 0 < timeout_s < float("inf")):  # NaN fails both comparisons
        raise InvalidArgument(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}",
                              field="timeout_s")


def _version_text(version):
    """``version`` as the subject carries it: an int >= 0 as its digits (``2`` is ``"2"``, as on disk); anything else
    as given, for the caller's check."""
    if isinstance(version, int) and not isinstance(version, bool) and version >= 0:
        return str(version)
    return version


def _extra_headers(headers) -> dict[str, str]:
    """``infer``'s ``headers`` as a new dict, else InvalidArgument at once (``field`` ``headers``): a mapping of
    strings, none of them one of inferbus's own client headers in any case (``Inferbus-Request-Id``, ``-Timeout-Ms``,
    ...: ``infer``'s arguments set them, and two spellings of one are refused by the ingress)."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidArgument(f"headers must map header names to values, got {type(headers).__name__}",
                              field="headers")
    out = {}
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or any(c in k for c in ": \r\n") or \
                "\r" in v or "\n" in v:
            raise InvalidArgument(f"headers: {k!r}: {v!r} is not a header (a name without ':' or whitespace and a "
                                  f"value without line breaks, both strings)", field="headers")
        if k.lower() in H.CLIENT_HEADERS:
            raise InvalidArgument(f"headers: {k!r} is inferbus's own header; infer's arguments set it "
                                  f"(timeout_s, request_id, json, hedge)", field="headers")
        out[k] = v
    return out


def _version_token(version) -> str | None:
    """``version`` as the subject carries it (None stays None: the default version), else InvalidArgument at once
    (``field`` ``model_version``): a version is a string of digits or an int >= 0, at most
    :data:`~inferbus.bus._subjects.MAX_VERSION` (2**63 - 1), as a model repository's version folders are; anything
    else names no version the ingress could serve (it answered NOT_FOUND after the round trip)."""
    if version is None:
        return None
    version = _version_text(version)
    if not (isinstance(version, str) and version.isascii() and version.isdigit()):
        # worded as the ingress words a version it cannot serve (a fresh-user trial read two wordings), plus the
        # SDK's own forms
        said = "is not a number" if isinstance(version, str) else "names no version"
        shown = repr(version[:40]) + "..." if isinstance(version, str) and len(version) > 40 else repr(version)
        raise InvalidArgument(f"version {shown} {said}: versions are named by their folders' decimal numbers "
                              f"(e.g. '1'); the version must be a string of digits or an int >= 0",
                              field="model_version")
    # the digits are checked: a leading zero, which no version folder has, or a number over MAX_VERSION (the
    # largest a folder may have; thousands of digits made a subject the NATS server closed the connection for)
    problem = version_problem(version)
    if problem is not None:
        raise InvalidArgument(problem, field="model_version")
    return version


def _check_request_id(request_id) -> None:
    """``request_id`` is None or a string of at most :data:`~inferbus.schemas.MAX_REQUEST_ID_CHARS` characters, else
    InvalidArgument at once (``field`` ``request_id``): an int failed deep in nats-py's header encoding
    (``AttributeError: 'int' object has no attribute 'strip'``; a fresh-user trial), and the ingress refuses a longer
    one."""
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidArgument(f"request_id must be a string (e.g. a UUID's hex) or None, got "
                              f"{type(request_id).__name__} {request_id!r}", field="request_id")
    if request_id is not None and len(request_id) > MAX_REQUEST_ID_CHARS:  # the ingress refuses it
        raise InvalidArgument(f"request_id is {len(request_id)} characters, over the limit of {MAX_REQUEST_ID_CHARS}",
                              field="request_id")


def _check_option(option: str, value, want: str, fits, kind: type = numbers.Real) -> None:
    """``Client(option=value)``: a ``kind`` (a real number by default) for which ``fits(value)`` is true.

    Raises:
        ValueError: ``Client.OPTION must be WANT, got VALUE`` otherwise: another type (a string did not compare), a
            bool (``max_in_flight=True`` was taken as 1 slot, ``True`` as 1 ms), or a value out of range (NaN is:
            ``fits`` compares it false).
    """
    if isinstance(value, bool) or not isinstance(value, kind) or not fits(value):
        raise ValueError(f"Client.{option} must be {want}, got {value!r}")


class _LatencyEstimate:
    """Smoothed latency and its mean deviation (RFC 6298 §2: alpha 1/8, beta 1/4), in ms."""

    __slots__ = ("srtt_ms", "rttvar_ms", "n")

    def __init__(self) -> None:
        self.srtt_ms = 0.0
        self.rttvar_ms = 0.0
        self.n = 0

    def add(self, ms: float) -> None:
        if self.n == 0:
            self.srtt_ms, self.rttvar_ms = ms, ms / 2
        else:
            self.rttvar_ms = 0.75 * self.rttvar_ms + 0.25 * abs(self.srtt_ms - ms)
            self.srtt_ms = 0.875 * self.srtt_ms + 0.125 * ms
        self.n += 1

    def rto_ms(self) -> float:
        return self.srtt_ms + 4 * self.rttvar_ms


@dataclass
class InferResult:
    """A decoded answer: ``outputs`` by name (numpy arrays) plus the response's metadata."""

    outputs: dict[str, np.ndarray]
    model_name: str
    model_version: str
    id: str | None
    parameters: dict = field(default_factory=dict)


class Client:
    """An inferbus client on one NATS connection.

    Retries (:meth:`request`): UNAVAILABLE (an error reply, NATS "no responders", a lost
    connection) is retried with the same request id while the budget lasts, so the
    servers can deduplicate it (a worker computes one request id once). The pause
    before retry n is exponential with "equal jitter" (Brooker, "Exponential Backoff
    And Jitter", AWS Architecture Blog, 2015): ``b/2 + uniform(0, b/2)`` with
    ``b = min(retry_backoff_ms * 2**(n-1), 100 ms)``; a server hint (``retry_after_ms``)
    replaces the first pause, and a later pause is never shorter than its reply's hint. RESOURCE_EXHAUSTED is retried only with
    ``retry_resource_exhausted=True``, after ``max(retry_after_ms, the same backoff counted over its retries)`` and
    only if that fits in the budget (retrying into a rate limit only makes it worse); when the budget runs out
    between such retries the call raises the last RESOURCE_EXHAUSTED, with the attempts' tally. Those retries are
    throttled per client as gRPC's retry throttling does them (gRFC A6, "Retry Throttling"): a bucket of
    ``retry_throttle_tokens`` tokens, one taken by each RESOURCE_EXHAUSTED answer, 0.1 given back by each answered
    request; a RESOURCE_EXHAUSTED is retried only while more than half the bucket is left, so that many callers of
    one client facing an overloaded deployment send little more than their own requests (a fresh-user trial: 1,000
    callers against a 50/s rate limit sent ~11,000 requests/s, each retrying on its own backoff).

    Args:
        nc: a connected nats-py client (the Client does not own it unless made by :meth:`connect`).
        prefix: subject prefix of the deployment (default ``inferbus``).
        retry_backoff_ms: base pause between retries, ms (default 5; >= 0).
        retry_unavailable: retry UNAVAILABLE within the budget (default True); False raises it at once.
        retry_resource_exhausted: also retry RESOURCE_EXHAUSTED as described (default False).
        client_id: sent as ``Inferbus-Client-Id`` on every request (per-client rate limits); None sends none.
        attempt_timeout_ms: per-attempt timeout, ms (> 0), or None (default) for the adaptive one below. The
            adaptive floor does not apply to it: one shorter than the answers' own latency sends requests again
            that are still being computed, and a retry that lands on another worker runs the model a second time
            (a fresh-user trial, no fault: 1 ms ran 75 of 600 requests twice, 3 ms 41, 20 ms 1); keep it above the
            p99 of the answers.
        attempt_timeout_floor_ms: the adaptive per-attempt timeout is never shorter than this, ms
            (default 250; >= 1).
        adaptive_attempt_timeout: derive the per-attempt timeout from the latency observed on the
            subject (default True); False (and no ``attempt_timeout_ms``) = one attempt per budget
            unless an UNAVAILABLE or a lost connection ends it.
        max_in_flight: requests this client has outstanding at most (default 1024; None = no bound).
        retry_throttle_tokens: the size of the RESOURCE_EXHAUSTED retry bucket above (default 10, as gRPC's
            ``maxTokens`` examples; a number > 0 up to 1000, gRPC's bound; None = retries not throttled).
            Calls beyond it wait, within their own budget, for one to finish: a burst of 10,000
            concurrent calls otherwise kept one event loop busy long enough for the connection to be
            judged stale (0.5 s without a PONG) and every request to fail. Waiting past the budget
            raises DeadlineExceeded with nothing sent.

    Raises:
        ValueError: a bad option, ``Client.OPTION must be ..., got VALUE``: ``retry_unavailable``,
            ``retry_resource_exhausted`` or ``adaptive_attempt_timeout`` not a bool (``"false"`` was taken as True);
            ``client_id`` not a non-empty string a header can carry (at most 256 characters), or None (``5`` failed
            every request with nats-py's AttributeError); ``max_in_flight`` not an int >= 1 or
            None, ``attempt_timeout_ms`` not a number > 0 or None, ``attempt_timeout_floor_ms`` not a number >= 1,
            ``retry_backoff_ms`` not a number >= 0 (NaN is none of these; nor is a bool: ``max_in_flight=True`` was
            taken as 1 slot).

    Per-attempt timeout: an attempt with no answer after its timeout is abandoned and the request
    is sent again, **same request id**, with the remaining budget, so a request delivered to a
    process that then died (a SIGKILLed ingress, a worker behind a dead server) is answered within
    its budget. The timeout is ``attempt_timeout_ms`` if given, else ``max(floor, srtt + 4 ×
    rttvar)`` of the answers seen on that subject (RFC 6298's retransmission timeout; first
    attempts only, Karn's rule), else, before 16 answers, half the budget; it doubles with each
    timed-out attempt (RFC 6298 §5.5), and the last attempt gets whatever budget is left. A retry
    that reaches the worker still holding the first copy *joins* it (the worker dedupes ids, and
    an ingress sends a pending id to the same worker); one that lands on another worker runs the
    model a second time: the price of the answer. The retry after an attempt timeout goes to the ingress that
    answers ``<p>.ingresses`` first (a live ingress keeping up; the probe waits 100 ms at most, a quarter of the budget
    left at most), on its own subject (``<p>.ingresses.<ingress_id>.infer.<model>[.<version>]``; the same for the
    metadata, readiness, health and server reads and the model-management writes), not through the queue
    group: the queue group hands a request to any member whose connection is open, a hung one (SIGSTOPped, a stalled
    VM) included, until the server drops it 4-6 s later, and each retry through it could land there again (without
    an answer to the probe, the retry goes through the queue group). Only UNAVAILABLE, a lost connection and an
    attempt timeout are retried; INVALID_ARGUMENT, NOT_FOUND, PAYLOAD_TOO_LARGE, INTERNAL and a
    server's DEADLINE_EXCEEDED never are. A request published while the connection is reconnecting
    and its buffer (``BusConfig.pending_size_bytes``, 64 MiB) is full (nats-py's ``OutboundBufferLimitError``, after
    a burst of large requests) was not sent: it is sent again after a pause, within its budget (DeadlineExceeded,
    saying so, if the budget ends first).
    """

    def __init__(self, nc, prefix: str = "inferbus", *, retry_backoff_ms: float = 5.0,
                 retry_unavailable: bool = True, owns_connection: bool = False,
                 retry_resource_exhausted: bool = False, client_id: str | None = None,
                 attempt_timeout_ms: float | None = None, attempt_timeout_floor_ms: float = 250.0,
                 adaptive_attempt_timeout: bool = True, max_in_flight: int | None = 1024,
                 retry_throttle_tokens: float | None = 10.0):
        if max_in_flight is not None:
            _check_option("max_in_flight", max_in_flight, "an int >= 1 or None", lambda n: n >= 1, int)
        self.max_in_flight = max_in_flight
        self._slots = asyncio.Semaphore(max_in_flight) if max_in_flight is not None else None
        if attempt_timeout_ms is not None:
            _check_option("attempt_timeout_ms", attempt_timeout_ms, "> 0 ms or None", lambda ms: ms > 0)
        _check_option("attempt_timeout_floor_ms", attempt_timeout_floor_ms, ">= 1 ms", lambda ms: ms >= 1)
        _check_option("retry_backoff_ms", retry_backoff_ms, ">= 0 ms", lambda ms: ms >= 0)
        for option, value in (("retry_unavailable", retry_unavailable), ("retry_resource_exhausted",
                              retry_resource_exhausted), ("adaptive_attempt_timeout", adaptive_attempt_timeout)):
            if not isinstance(value, bool):  # "false" was taken as True, None as False
                raise ValueError(f"Client.{option} must be True or False, got {value!r}")
        if client_id is not None and not (isinstance(client_id, str) and client_id.strip()
                                          and H.header_value(client_id) == client_id
                                          and len(client_id) <= H.MAX_CLIENT_ID_CHARS):
            why = ""  # the reason, where the value alone does not show it (a fresh-user trial)
            if isinstance(client_id, str) and client_id.strip():
                why = (f" (this one has {len(client_id)})" if len(client_id) > H.MAX_CLIENT_ID_CHARS else
                       " (this one has a line break or leading or trailing whitespace, which a header does not keep)")
            shown = client_id[:80] if isinstance(client_id, str) else client_id
            raise ValueError(f"Client.client_id must be a non-empty string a NATS header can carry (no line breaks, "
                             f"at most {H.MAX_CLIENT_ID_CHARS} characters) or None{why}, got {shown!r}")
        if retry_throttle_tokens is not None:
            _check_option("retry_throttle_tokens", retry_throttle_tokens, "a number > 0 and <= 1000, or None",
                          lambda t: 0 < t <= 1000)
        self.retry_throttle_tokens = retry_throttle_tokens
        self._retry_tokens = retry_throttle_tokens or 0.0
        """The RESOURCE_EXHAUSTED retry bucket's tokens now (gRFC A6)."""
        self.retries_throttled = 0
        """RESOURCE_EXHAUSTED answers raised without a retry because the bucket was at half or below, since the
        client was made."""
        self.attempt_timeout_ms = attempt_timeout_ms
        self.attempt_timeout_floor_ms = attempt_timeout_floor_ms
        self.adaptive_attempt_timeout = adaptive_attempt_timeout
        self._latency: dict[str, _LatencyEstimate] = {}
        self.attempt_timeouts = 0
        """Attempts abandoned after their per-attempt timeout (and retried), since the client was made."""
        self.retries_at_ingress = 0
        """Retries sent to the ingress that answered ``<p>.ingresses`` first, not through the queue group, since the
        client was made."""
        self._probe_off_until = 0.0
        self.nc = nc
        self.retry_unavailable = retry_unavailable
        self.retry_resource_exhausted = retry_resource_exhausted
        self.client_id = client_id
        self.subjects = Subjects(prefix)
        self.retry_backoff_ms = retry_backoff_ms
        self._owns = owns_connection
        self._rng = random.Random()
        try:  # the loop the connection works on (nats-py's tasks run there)
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    @classmethod
    async def connect(cls, servers: str | list[str] = "nats://127.0.0.1:4222", prefix: str = "inferbus", *,
                      retry_backoff_ms: float = 5.0, retry_unavailable: bool = True,
                      retry_resource_exhausted: bool = False, client_id: str | None = None,
                      attempt_timeout_ms: float | None = None, attempt_timeout_floor_ms: float = 250.0,
                      adaptive_attempt_timeout: bool = True, max_in_flight: int | None = 1024,
                      retry_throttle_tokens: float | None = 10.0, **bus_options) -> "Client":
        """Connect with failover-friendly settings (see :class:`inferbus.bus.BusConfig`).

        ``servers`` are tried in the order given (``no_randomize`` defaults to True): for a server
        list spanning regions, put the local region's servers first (``Topology.client_urls(first=...)``
        builds such a list for the local topology). ``no_randomize=False`` spreads clients over the list.

        The keyword options from ``retry_backoff_ms`` to ``max_in_flight`` are :class:`Client`'s, with its defaults
        (``tests/test_client_errors.py`` checks that both list the same options with the same defaults: connect once
        left ``retry_backoff_ms`` out). ``bus_options`` are :class:`~inferbus.bus.BusConfig` fields, among them the
        credentials: ``user``/``password``, ``token``, ``nkeys_seed`` (file), ``user_credentials`` (``.creds``
        file), ``tls_ca_file``/``tls_cert_file``/``tls_key_file``.

        Raises:
            Unavailable: no server of ``servers`` accepted the connection within ``connect_attempts``
                tries of ``connect_timeout_s`` each (nothing listening, unreachable, or the server refused
                the credentials); the message names the servers and the cause: one, when every server's last
                try failed alike, else each server's (``h1:4222: not connected within 0.5 s (TimeoutError); h2:4222:
                [Errno 111] ...``);
                ``__cause__`` is nats-py's error.
            InvalidArgument: ``servers`` names no URL (e.g. ``""``) or is not a string or list (``None``), field
                ``servers``.
            ValueError: a bad BusConfig value (see :class:`~inferbus.bus.BusConfig`), or a bad client option
                (``max_in_flight``, ``attempt_timeout_ms``...: see :class:`Client`); the connection made for it is
                closed before this is raised.
            TypeError: an option that is neither the Client's nor a BusConfig field, named.
        """
        if not isinstance(servers, (str, list, tuple)):  # split_servers(None) was a bare "not iterable"
            raise InvalidArgument(f"Client.connect: servers must be a NATS URL, a comma-separated string of them or "
                                  f"a list, got {type(servers).__name__}", field="servers")
        servers = split_servers(servers)
        if not servers:  # BusConfig's ValueError named its own field, not this argument
            raise InvalidArgument("Client.connect: servers names no NATS URL; give one or more, e.g. "
                                  "nats://127.0.0.1:4222", field="servers")
        for url in servers:  # nats-py raises bare errors for these, deep in its connect
            problem = server_url_problem(url)
            if problem is not None:
                raise InvalidArgument(f"Client.connect: NATS URL {problem}", field="servers")
        unknown = sorted(set(bus_options) - {f.name for f in dataclasses.fields(BusConfig)})
        if unknown:  # (BusConfig's own TypeError named that internal class, a fresh-user trial)
            raise TypeError(f"Client.connect() got an unexpected keyword argument {unknown[0]!r}: neither a Client "
                            f"option nor a BusConfig field (inferbus.bus.BusConfig)")
        cfg = BusConfig(servers=servers, prefix=prefix, name="inferbus-client",
                        **{**_FAILOVER_DEFAULTS, **bus_options})
        holder: list[Client] = []
        failures: list[tuple[str, BaseException]] = []

        async def on_disconnect() -> None:
            if holder:
                holder[0]._connection_lost()

        try:
            nc = await connect(cfg, disconnected_cb=on_disconnect, connect_failures=failures)
        except (NoServersError, OSError, asyncio.TimeoutError) as exc:
            raise Unavailable(f"cannot reach NATS at {shown_servers(servers)}: "
                              f"{_connect_causes(failures, exc, cfg.connect_timeout_s)}") from exc
        try:
            client = cls(nc, prefix, owns_connection=True, retry_backoff_ms=retry_backoff_ms,
                         retry_unavailable=retry_unavailable, retry_resource_exhausted=retry_resource_exhausted,
                         client_id=client_id, attempt_timeout_ms=attempt_timeout_ms,
                         attempt_timeout_floor_ms=attempt_timeout_floor_ms,
                         adaptive_attempt_timeout=adaptive_attempt_timeout, max_in_flight=max_in_flight,
                         retry_throttle_tokens=retry_throttle_tokens)
        except BaseException:  # a bad client option (max_in_flight=0...): the connection made for it is closed, not
            await close_connection(nc)  # left open with its tasks (a fresh-user trial: one more per call)
            raise
        holder.append(client)
        return client

    @classmethod
    def _option_names(cls) -> dict[str, object]:
        """The keyword options of the constructor that :meth:`connect` takes too (all but ``owns_connection``,
        which connect sets), with their defaults."""
        return {p.name: p.default for p in inspect.signature(cls).parameters.values()
                if p.kind is p.KEYWORD_ONLY and p.name != "owns_connection"}

    def _backoff_ms(self, n: int) -> float:
        """The pause before retry ``n`` (1, 2, ...), ms: exponential with equal jitter (the class docstring)."""
        b = min(self.retry_backoff_ms * 2 ** (n - 1), _MAX_BACKOFF_MS)
        return b / 2 + self._rng.uniform(0, b / 2)

    def _connection_lost(self) -> None:
        """Fail every request in flight on the lost connection so :meth:`request` retries it at once
        (:func:`inferbus.bus.fail_pending_requests`)."""
        fail_pending_requests(self.nc, "connection to the NATS server lost")

    def attempt_timeout_for(self, subject: str, budget_ms: float) -> float | None:
        """The first attempt's timeout on ``subject`` for a request with ``budget_ms``, ms (None = the budget).

        See the class docstring for the rule.
        """
        if self.attempt_timeout_ms is not None:
            return self.attempt_timeout_ms
        if not self.adaptive_attempt_timeout:
            return None
        est = self._latency.get(subject)
        if est is None or est.n < _RTO_MIN_SAMPLES:
            return max(self.attempt_timeout_floor_ms, budget_ms / 2)
        return max(self.attempt_timeout_floor_ms, est.rto_ms())

    async def close(self) -> None:
        """Drain and close the connection if this client made it (:meth:`connect`); never raises for a
        connection that is reconnecting or already closed (it is closed without draining then), nor a
        ``CancelledError`` of nats-py's own (:func:`inferbus.bus.close_connection`); a cancellation of the caller
        still propagates. The drain gets at most 2 s (a server that stopped at that moment never answers its
        flush). Calls still waiting for an answer then raise :class:`~inferbus.schemas.Unavailable` ("the NATS
        connection is closed") at once."""
        if self._owns:
            await close_connection(self.nc, drain=True)
            # what the drain did not see answered never will be: the calls waiting for it end now (with UNAVAILABLE,
            # "the NATS connection is closed"), not at their attempt's timeout (a fresh-user trial: 2.2-2.5 s later)
            fail_pending_requests(self.nc, "this client was closed")

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def infer(self, model: str, inputs: dict[str, np.ndarray], *, version: str | int | None = None,
                    outputs: list[str] | None = None, timeout_s: float = 1.0, request_id: str | None = None,
                    raw: bool = True, parameters: dict | None = None, json: bool = False,
                    hedge: str | float | None = None, headers: Mapping[str, str] | None = None
                    ) -> dict[str, np.ndarray]:
        """Run ``model`` on ``inputs`` and return its outputs as numpy arrays.

        Args:
            model: model name. version: model version (None = the model's default; an int is taken as its
                decimal string).
            inputs: one array per model input; the OIP datatype follows the dtype
                (float32 → FP32, float16 → FP16, ml_dtypes.bfloat16 → BF16, object of bytes → BYTES).
            outputs: names to compute (None = all).
            timeout_s: whole budget in seconds, retries included, a finite number > 0; sent as ``Inferbus-Timeout-Ms``.
            request_id: idempotency key (a UUID4 when None or empty, as an empty id means none), reused across
                retries.
            raw: send tensors as little-endian ``raw`` bytes (True) or as ``data`` lists.
            json: encode as JSON instead of MessagePack.
            parameters: the request's OIP ``parameters``: names (str) → values, each a string, a number or a
                boolean (OIP v2's ``$parameter``), at most :data:`~inferbus.schemas.MAX_PARAMETERS` (128) of them;
                the server ignores parameters it does not read.
            hedge: hedge policy for this request, sent as ``Inferbus-Hedge``: a delay in ms
                (e.g. ``20``), ``"p95"``/``"p99"``/``"auto"`` (the model's observed quantile) or
                ``"off"``; None = the model's configured policy. A hedged request is sent to a
                second worker after the delay; the first answer wins; the model runs at most twice.
            headers: more NATS headers to send (``{"traceparent": "00-...-01"}``: W3C trace context, forwarded
                to the worker when well formed), as Triton's clients take ``headers``; not inferbus's own (the
                arguments above set those).

        Returns:
            ``{output name: np.ndarray}``.

        Raises:
            NotFound, InvalidArgument (also before sending: a model or version that is empty or holds '.', '*',
            '>' or whitespace, a model name longer than 128 bytes of UTF-8 (field ``model``), a version over
            2**63 - 1 (``model_version``); ``inputs`` that is not a mapping or holds None; ``outputs`` given as one
            string;
            ``timeout_s`` that is not a finite number > 0; a ``request_id`` that is not a string or is longer
            than 256 characters; a ``hedge`` that is not a policy, field ``hedge``; ``parameters`` that is not a
            mapping of names or holds more than 128 entries, field ``parameters``; a value that is no string,
            number or boolean, or in MessagePack an integer outside [-2**63, 2**64 - 1], or in JSON a NaN or
            infinity, field ``parameters["<name>"]``; the ingress would refuse both),
            DeadlineExceeded, ResourceExhausted, Unavailable,
            PayloadTooLarge (before sending when the body exceeds the server's max_payload), Internal.
        """
        res = await self.infer_result(model, inputs, version=version, outputs=outputs, timeout_s=timeout_s,
                                      request_id=request_id, raw=raw, parameters=parameters, json=json, hedge=hedge,
                                      headers=headers)
        return res.outputs

    async def infer_result(self, model: str, inputs: dict[str, np.ndarray], *, version: str | int | None = None,
                           outputs: list[str] | None = None, timeout_s: float = 1.0, request_id: str | None = None,
                           raw: bool = True, parameters: dict | None = None, json: bool = False,
                           hedge: str | float | None = None, headers: Mapping[str, str] | None = None
                           ) -> InferResult:
        """Like :meth:`infer` but returns the whole :class:`InferResult` (parameters, timings, version)."""
        started_at = time.monotonic()  # the budget covers encoding the tensors too (1 MB takes milliseconds)
        _check_timeout(timeout_s)
        if timeout_s > H.MAX_TIMEOUT_MS / 1000.0:  # an ingress grants at most that: the rest would be a silent cut
            raise InvalidArgument(f"timeout_s must be at most {H.MAX_TIMEOUT_MS / 1000.0:g} s, the longest budget an "
                                  f"ingress grants, got {timeout_s!r}", field="timeout_s")
        _check_request_id(request_id)
        _subject_token(model, "model")
        version = _version_token(version)
        if not isinstance(inputs, Mapping):
            raise InvalidArgument(f"inputs must map each input name to an array (e.g. {{'pixels': x}}), got "
                                  f"{type(inputs).__name__}", field="inputs")
        for name, arr in inputs.items():
            if arr is None:
                raise InvalidArgument(f"input {name!r} is None; give an array (e.g. a numpy array of the model's "
                                      f"datatype)", field=f"inputs.{name}")
            if _is_masked(arr):  # its bytes hold the fill value where masked (1e20 for a float)
                raise InvalidArgument(f"input {name!r} is a masked array: a tensor has no mask, and its masked "
                                      f"elements would be sent as the fill value; send arr.filled(value) or arr.data",
                                      field=f"inputs.{name}")
        if isinstance(outputs, (str, bytes)):
            raise InvalidArgument(f"outputs must be a list of output names (e.g. [{outputs!r}]), not one string",
                                  field="outputs")
        for what, many in (("inputs", inputs), ("outputs", outputs or ())):
            if len(many) > MAX_TENSORS:  # the ingress refuses it from the list's header; said here without the trip
                raise InvalidArgument(f"{len(many)} {what}: a request lists at most {MAX_TENSORS} {what}", field=what)
        if parameters is not None:
            if not isinstance(parameters, Mapping):
                raise InvalidArgument(f"parameters must map names (str) to values (OIP v2's $parameter: bool, "
                                      f"number or string), got {type(parameters).__name__}", field="parameters")
            bad = [k for k in parameters if not isinstance(k, str)]
            if bad:
                raise InvalidArgument(f"parameters' names must be strings, got the {type(bad[0]).__name__} "
                                      f"{bad[0]!r}", field="parameters")
            if len(parameters) > MAX_PARAMETERS:
                raise InvalidArgument(f"parameters holds {len(parameters)} entries; a parameters map holds at most "
                                      f"{MAX_PARAMETERS}", field="parameters")
            bad = [k for k, v in parameters.items() if not isinstance(v, (str, int, float, bool, np.number, np.bool_))
                   or isinstance(v, (complex, np.complexfloating))]
            if bad:
                raise InvalidArgument(f"parameter {bad[0]!r} is a {type(parameters[bad[0]]).__name__}: OIP v2's "
                                      f"$parameter value is a string, a number or a boolean",
                                      field=parameter_field(bad[0]))
            if not json:  # MessagePack carries integers in [-2**63, 2**64 - 1]; msgspec's refusal named no key
                bad = [k for k, v in parameters.items() if isinstance(v, (int, np.integer))
                       and not isinstance(v, (bool, np.bool_)) and not -2**63 <= int(v) < 2**64]
                if bad:
                    raise InvalidArgument(f"parameter {bad[0]!r} is {parameters[bad[0]]}: MessagePack carries "
                                          f"integers from -2**63 to 2**64 - 1; send it as a string",
                                          field=parameter_field(bad[0]))
            if json:  # JSON has no NaN or infinity: msgspec would write null, which the ingress refuses as no value
                bad = [k for k, v in parameters.items() if isinstance(v, (float, np.floating)) and not math.isfinite(v)]
                if bad:
                    raise InvalidArgument(f"parameter {bad[0]!r} is {parameters[bad[0]]}: JSON has no NaN or "
                                          f"infinity; send it as a string or the request as MessagePack",
                                          field=parameter_field(bad[0]))
        if hedge is not None:  # the header's value, as the ingress parses it: refused here, without the round trip
            try:
                parse_policy(str(hedge))
            except HedgePolicyError as exc:
                raise InvalidArgument(str(exc), field="hedge") from None
        extra = _extra_headers(headers)
        if hedge is not None:
            extra[H.HEDGE] = str(hedge)
        rid = request_id or uuid.uuid4().hex
        # the id travels in the Inferbus-Request-Id header only: the body then depends on the tensors alone, so
        # a repeated input is the same bytes and the ingress's raw index answers it from L1 without decoding
        arrays = {name: np.asarray(arr) if not isinstance(arr, np.ndarray) else arr for name, arr in inputs.items()}
        max_payload = getattr(self.nc, "max_payload", 0) or 0
        if max_payload:  # what the body holds at least (raw bytes; a byte an element as data): refused before the
            # encoding, which took seconds for 768 MB and ended DEADLINE_EXCEEDED past the budget (a fresh-user trial)
            least = sum(a.nbytes if raw and a.dtype != object else a.size for a in arrays.values())
            if least > max_payload:
                raise PayloadTooLarge(f"request of at least {least} bytes (its tensors) exceeds the server's "
                                      f"max_payload ({max_payload} bytes)")
        tensors = []
        for name, arr in arrays.items():
            try:
                tensors.append(input_from_numpy(name, arr, raw=raw))
            except InvalidArgument as err:  # e.g. a BYTES element that is neither bytes nor str: name the input
                if err.field is None:
                    err.field = f"inputs.{name}"
                raise
        req = InferRequest(
            inputs=tensors,
            parameters=parameters,
            outputs=[RequestedOutput(name=n) for n in outputs] if outputs else None,
        )
        ct = "application/json" if json else None
        try:
            body = encode_request(req, ct)
        except InvalidArgument as err:  # the tensors were encodable (above): a parameter value is not
            if err.field is None and parameters:
                err.field = "parameters"
            raise
        resp, rct = await self.request(self.subjects.infer(model, version), body, timeout_s=timeout_s,
                                       request_id=rid, content_type=ct,
                                       headers=extra or None,
                                       started_at=started_at)
        r = decode_response(resp, rct)
        outs = {o.name: output_to_numpy(o, field=f"outputs[{i}]") for i, o in enumerate(r.outputs)}
        return InferResult(outs, r.model_name, r.model_version, r.id or rid, dict(r.parameters or {}))

    async def request(self, subject: str, body: bytes, *, timeout_s: float, request_id: str | None = None,
                      content_type: str | None = None, headers: dict | None = None,
                      started_at: float | None = None, at_ingress: str | None = None) -> tuple[bytes, str | None]:
        """Send one encoded request with budget, idempotency id and UNAVAILABLE retries.

        ``timeout_s`` counts from ``started_at`` (``time.monotonic()`` seconds; None = now), so a caller
        can charge its own encoding to the budget; the ingress gets what is left as ``Inferbus-Timeout-Ms``.
        ``at_ingress``: the id of a live ingress (one that answered ``<p>.ingresses``) that the first attempt goes to,
        on its own subject (:meth:`Subjects.at_ingress`; ignored for a subject that has none), instead of the queue
        group, which may hand it to a hung member (a model-management write asks first:
        :func:`inferbus.model_admin.model_control`); later attempts follow the rule of the class docstring. A "no
        responders" there (that ingress is gone) sends the next attempt through the queue group at once.

        Returns:
            ``(response body, response content type)``.

        Raises:
            InvalidArgument: ``timeout_s`` is not a finite number > 0 (0, negative, NaN, infinity; nothing sent);
            a ``subject`` whose protocol line (with this connection's reply subject) would be longer than the NATS
            server's ``max_control_line``, 4096 bytes assumed (field ``subject``, nothing sent: the server would
            close the connection for good, :data:`~inferbus.bus._subjects.MAX_CONTROL_LINE_BYTES`).
            the typed error of an error reply; DeadlineExceeded when the budget runs out while an attempt
            waits for its answer (at once, nothing sent, when it was spent before sending), its message naming
            the attempts and what ended them by kind (``17 attempts: 16 no responders, 1 timed out``; an
            attempt with no answer that started or ended while this client was not connected to NATS counts
            as ``while disconnected``, not ``timed out``);
            Unavailable when the budget runs out between UNAVAILABLE retries (NATS "no responders", a lost
            connection, an UNAVAILABLE reply: the next pause would not fit): the last one, its message followed
            by the same tally (``... no ingress is serving (17 attempts: 17 no responders)``), its
            ``retry_after_ms`` kept;
            Unavailable at once, not retried, when NATS answers "no responders" on a subject of one ingress
            (``<p>.ingresses.<id>.<...>``, :meth:`Subjects.at_ingress`): no ingress of that id is subscribed, a
            known answer (a queue group's "no responders" is retried, as its members restart);
            PayloadTooLarge before sending when ``body`` plus headers exceed the server's
            max_payload (the server would close the connection instead of answering);
            Unavailable at once, not retried, when the connection is closed or draining
            (after :meth:`close`, or once nats-py gave up reconnecting).
            RuntimeError: called on another event loop than the one the client was made on (its connection
                works only there: a second ``asyncio.run``).
        """
        _check_timeout(timeout_s)
        _check_request_id(request_id)
        if isinstance(subject, str) and (problem := control_line_problem(subject, reply_bytes(self.nc))) is not None:
            # the server would close the connection for good (nats-py does not reconnect after its -ERR)
            raise InvalidArgument(problem, field="subject")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is not None:
                raise RuntimeError("this Client's connection belongs to another event loop (each asyncio.run has its "
                                   "own, and the first one has ended): connect a new Client in this one, or keep "
                                   "one loop running (inferbus.SyncClient does that for code without one)")
            self._loop = loop
        now = time.monotonic()
        deadline = (now if started_at is None else started_at) + timeout_s
        if deadline <= now:
            raise DeadlineExceeded(f"the budget of {_fmt_ms(timeout_s * 1000)} ms was spent before sending (encoding "
                                   f"the request took {_fmt_ms((now - started_at) * 1000)} ms); nothing was sent")
        hdrs = dict(headers or {})
        if request_id:
            hdrs[H.REQUEST_ID] = request_id
        if content_type:
            hdrs[H.CONTENT_TYPE] = content_type
        if self.client_id and H.CLIENT_ID not in hdrs:
            hdrs[H.CLIENT_ID] = self.client_id
        max_payload = getattr(self.nc, "max_payload", 0) or 0
        hdrs[H.TIMEOUT_MS] = H.format_ms(timeout_s * 1000.0)
        hdrs[H.DEADLINE_UNIX_MS] = f"{time.time() * 1000.0 + timeout_s * 1000.0:.0f}"  # reset per attempt
        if max_payload and len(body) + H.header_bytes(hdrs) + 16 > max_payload:
            raise PayloadTooLarge(f"request of {len(body)} bytes (plus headers) exceeds the server's max_payload "
                                  f"({max_payload} bytes)")
        slots = self._slots
        waited_ms = 0.0
        if slots is not None:
            if slots.locked():  # every slot taken: wait for one within the budget (a client-side bulkhead)
                t_wait = time.monotonic()
                try:
                    await asyncio.wait_for(slots.acquire(), max(deadline - t_wait, 0.0))
                except asyncio.TimeoutError:
                    raise DeadlineExceeded(
                        f"no answer within {_fmt_ms(timeout_s * 1000)} ms: all {self.max_in_flight} of this client's "
                        f"request slots stayed busy (Client(max_in_flight=...)); nothing was sent") from None
                waited_ms = (time.monotonic() - t_wait) * 1000.0
            else:
                await slots.acquire()
        try:
            first_at = self._at_ingress(subject, at_ingress) if _ingress_token(at_ingress) else None
            return await self._attempts(subject, body, hdrs, deadline, timeout_s, request_id, first_at)
        except DeadlineExceeded as err:
            if waited_ms >= 1.0:  # say where the budget went: queued in this client, not only at the server
                raise DeadlineExceeded(f"{err.message} ({_fmt_ms(waited_ms)} ms of it waiting for one of this "
                                       f"client's {self.max_in_flight} request slots)") from None
            raise
        finally:
            if slots is not None:
                slots.release()

    async def _attempts(self, subject: str, body: bytes, hdrs: dict, deadline: float, timeout_s: float,
                        request_id: str | None, first_at: str | None = None) -> tuple[bytes, str | None]:
        """The attempt loop of :meth:`request` (retries, attempt timeouts), holding one request slot; the first
        attempt goes to ``first_at`` (a subject of one ingress) when given."""
        last_err: Exception | None = None
        attempt = 0
        sent = 0
        blocked = 0  # attempts refused by this client's own full outbound buffer (nothing sent)
        attempt_ms = self.attempt_timeout_for(subject, timeout_s * 1000.0)
        met: Counter[str] = Counter()  # what ended each attempt, by kind, for the message of the error that ends them
        no_responders_ms = 0.0  # the slowest "no responders" reply seen (ms)
        buffer_full = False  # the last try found the reconnect buffer full (nothing sent)
        exhausted = 0  # RESOURCE_EXHAUSTED replies retried (retry_resource_exhausted)
        at_ingress = first_at  # the next attempt's subject when it goes to one ingress (after an attempt timed out)
        while True:
            target, at_ingress = at_ingress or subject, None
            left_ms = H.remaining_ms(deadline)
            if left_ms <= 0:
                if buffer_full:  # the pause for a full reconnect buffer overshot the budget: as when it would not
                    # fit (below), DEADLINE_EXCEEDED naming the buffer (a loaded CI box gave UNAVAILABLE here)
                    raise _no_answer(timeout_s, sent, last_err, "the last try", met, self._link_down(),
                                     count_one=True)
                if isinstance(last_err, (Unavailable, ResourceExhausted)):  # the budget ran out between retries (a
                    raise _with_tally(last_err, sent, met)  # pause that fitted, overshot by the loop): what kept
                    # the request from being answered, with the attempts' tally (RESOURCE_EXHAUSTED was said as
                    # DEADLINE_EXCEEDED "92 attempts: 92 RESOURCE_EXHAUSTED" in a fresh-user trial)
                raise _no_answer(timeout_s, sent, last_err, "the last", met, self._link_down())
            hdrs[H.TIMEOUT_MS] = H.format_ms(left_ms)
            # the same deadline on the wall clock: an ingress that takes the request after it (queued in the bus
            # behind an overload) refuses it for the price of a header instead of computing an answer nobody awaits
            now_ms = time.time() * 1000.0
            hdrs[H.DEADLINE_UNIX_MS] = f"{now_ms + left_ms:.0f}"
            if sent and request_id:  # a retry: an ingress without the first copy finds it through its peers
                hdrs[H.ATTEMPT] = str(sent + 1)
            # the last attempt that fits gets the whole remaining budget
            wait_ms = left_ms if attempt_ms is None or attempt_ms + _RTO_MIN_RETRY_MS >= left_ms else attempt_ms
            if wait_ms < left_ms:  # when this attempt is given up: an ingress that takes it later does not run it
                hdrs[H.ATTEMPT_DEADLINE_UNIX_MS] = f"{now_ms + wait_ms:.0f}"
            else:
                hdrs.pop(H.ATTEMPT_DEADLINE_UNIX_MS, None)
            t_sent = time.monotonic()
            connected = self.nc.is_connected  # an attempt made while reconnecting is buffered, not sent yet
            sent += 1
            buffer_full = False
            try:
                msg = await self.nc.request(target, body, timeout=wait_ms / 1000.0, headers=hdrs)
            except (ConnectionClosedError, ConnectionDrainingError) as exc:
                # closed for good (Client.close, or nats-py gave up reconnecting): no retry can succeed
                raise Unavailable(f"the NATS connection is {'closed' if self.nc.is_closed else 'draining'}; "
                                  f"connect a new Client") from exc
            except OutboundBufferLimitError:
                # nothing left this process: the connection is down (reconnecting) and the buffer that keeps
                # what is published meanwhile (BusConfig.pending_size_bytes) is full. Wait, within the budget.
                sent -= 1
                blocked += 1
                last_err = Unavailable(f"the connection to NATS is reconnecting and its buffer is full "
                                       f"({self.nc.pending_data_size} bytes wait to be written)")
                buffer_full = True
                pause_ms = min(5.0 * blocked, 50.0)
                if H.remaining_ms(deadline) <= pause_ms:  # with what the attempts sent before met, if any
                    raise _no_answer(timeout_s, sent, last_err, "the last try", met, self._link_down(),
                                     count_one=True) from None
                await asyncio.sleep(pause_ms / 1000.0)
                continue
            except NoRespondersError:
                met["no responders"] += 1
                no_responders_ms = max(no_responders_ms, (time.monotonic() - t_sent) * 1000.0)
                if target != subject:
                    last_err = Unavailable(f"no responders on {target}: the ingress that answered the probe is gone")
                    continue  # not a refusal: the next attempt goes through the queue group, at once
                else:  # a subject of one ingress (health --ingress ID, a hand-built one) names the id nobody has
                    at = self.subjects.ingress_of(subject)
                    last_err = Unavailable(f"no responders on {subject}: no ingress "
                                           f"{'is serving' if at is None else f'with id {at!r} is serving'}")
                    if at is not None:
                        # the bus's own answer that nothing subscribes to that one ingress's subject: known, not
                        # retried (``health --ingress nope`` made 17 attempts over its whole budget first). A queue
                        # group's "no responders" is retried: its ingresses restart and come back under other ids
                        raise _with_tally(last_err, sent, met)
            except _ConnectionLost as exc:
                met["connection lost"] += 1
                last_err = Unavailable(f"{exc} while waiting for the answer (retried once reconnected, while the "
                                       f"budget lasted)")
            except NatsTimeout:
                # an attempt this client was not connected for (at its start or end) says nothing of the servers:
                # counted apart (a fresh-user trial read "3 timed out" of a client whose own NATS server was down)
                down = not (connected and self.nc.is_connected)
                if wait_ms >= left_ms:  # the last attempt had the rest of the budget; say what the others met
                    # (a fresh-user trial: 16 of 17 attempts met "no responders" and the error said only "17 attempts")
                    only_no_responders = len(met) == 1 and "no responders" in met
                    met["while disconnected" if down else "timed out"] += 1
                    if only_no_responders and wait_ms < 2 * no_responders_ms + _RTO_MIN_RETRY_MS:
                        # every earlier attempt met no responders and the last had less time than such a reply took
                        # here: its timeout says nothing new (a busy CI box: a health probe of a prefix nobody serves
                        # said DEADLINE_EXCEEDED instead of UNAVAILABLE)
                        raise _with_tally(last_err, sent, met, f"the last, with {wait_ms:.0f} ms of the "
                                                                       f"budget left, had no reply in time") from None
                    raise _no_answer(timeout_s, sent, last_err, "before the last", met, self._link_down(),
                                     at=self.subjects.ingress_of(target) if target != subject else None) from None
                # the attempt timed out: the process holding it may be gone; send it again at once
                # (same request id: a copy still running is joined, not run twice, where it is reached)
                self.attempt_timeouts += 1
                met["while disconnected" if down else "timed out"] += 1
                at = self.subjects.ingress_of(target) if target != subject else None  # (the caller's own: known)
                last_err = DeadlineExceeded(f"attempt {sent}{f' (at ingress {at})' if at else ''} had no answer "
                                            f"within {wait_ms:.0f} ms"
                                            + (" (this client was not connected to NATS then)"
                                               if down and self.nc.is_connected else ""))
                attempt_ms = attempt_ms * 2 if attempt_ms is not None else None
                at_ingress = await self._retry_subject(subject, deadline)
                continue
            else:
                err = decode_error(msg.headers, msg.data)
                if err is None:
                    if self._retry_tokens < (self.retry_throttle_tokens or 0.0):  # gRFC A6: +0.1 per answer
                        self._retry_tokens = min(self.retry_throttle_tokens, self._retry_tokens + _RETRY_TOKEN_RATIO)
                    if sent == 1:  # Karn's rule: only unambiguous samples
                        est = self._latency.get(subject)
                        if est is None:
                            if len(self._latency) >= 10_000:
                                self._latency.clear()
                            est = self._latency[subject] = _LatencyEstimate()
                        est.add((time.monotonic() - t_sent) * 1000.0)
                    return msg.data, (msg.headers or {}).get(H.CONTENT_TYPE)
                if isinstance(err, (ResourceExhausted, Unavailable)):
                    met[err.code.value] += 1
                if isinstance(err, ResourceExhausted) and self.retry_resource_exhausted:
                    # the server's hint is the floor of the pause; over it the pause backs off as UNAVAILABLE's does:
                    # clients that all retried at the hint (1-50 ms from a rate limit) made ~90 tries per call
                    exhausted += 1
                    if self.retry_throttle_tokens is not None:  # gRFC A6: -1 per failure, retry above half
                        self._retry_tokens = max(0.0, self._retry_tokens - 1.0)
                        if self._retry_tokens <= self.retry_throttle_tokens / 2:
                            self.retries_throttled += 1
                            raise _with_tally(err, sent, met, "not retried: this client's retries are throttled while "
                                                              "RESOURCE_EXHAUSTED answers outnumber its answered "
                                                              "requests")
                    pause_ms = max(float(err.retry_after_ms or 0), self._backoff_ms(exhausted))
                    if pause_ms + _RTO_MIN_RETRY_MS >= H.remaining_ms(deadline):  # no time left for an answer: tally
                        raise _with_tally(err, sent, met)
                    last_err = err  # (if the pause overshoots the budget, this is what the call ends with)
                    await asyncio.sleep(pause_ms / 1000.0)
                    continue
                if not isinstance(err, Unavailable):
                    raise err
                last_err = err
            # retry UNAVAILABLE within the budget, same request id
            if not self.retry_unavailable:
                raise last_err  # type: ignore[misc]
            attempt += 1
            hint = getattr(last_err, "retry_after_ms", None)
            pause_ms = self._backoff_ms(attempt)
            if hint is not None:  # the server's hint: the first pause, and no later pause is shorter
                pause_ms = float(hint) if attempt == 1 else max(float(hint), pause_ms)
            if H.remaining_ms(deadline) <= pause_ms:  # the budget ends before the next pause would: the last
                raise _with_tally(last_err, sent, met)  # UNAVAILABLE, with what every attempt met
            if pause_ms > 0:
                await asyncio.sleep(pause_ms / 1000.0)


    def _link_down(self) -> bool | str:
        """For :func:`_no_answer`: False while connected, ``"closed"`` once the connection is closed for good, else
        True (nats-py is reconnecting)."""
        if self.nc.is_connected:
            return False
        return "closed" if self.nc.is_closed else True

    def _at_ingress(self, subject: str, ingress_id: str) -> str | None:
        """:meth:`Subjects.at_ingress`, or None (the queue group) when that subject's protocol line would be too long
        for the server (:func:`~inferbus.bus._subjects.control_line_problem`; ``subject`` itself fits)."""
        at = self.subjects.at_ingress(subject, ingress_id)
        if at is not None and control_line_problem(at, reply_bytes(self.nc)) is not None:
            return None
        return at

    async def _retry_subject(self, subject: str, deadline: float) -> str | None:
        """Where the retry of a request on ``subject`` (inference, metadata, readiness, health, server, a
        model-management write) whose attempt timed out goes: the subject of the
        ingress that answers ``<p>.ingresses`` first (:meth:`Subjects.at_ingress`), asked with at most
        ``_INGRESS_PROBE_MAX_MS`` and a quarter of the budget left (``deadline``, monotonic s); None (the queue group)
        for another subject, while not connected, without an answer in time, or when no ingress answers the probe
        (older ingresses: not asked again for ``_INGRESS_PROBE_OFF_S``)."""
        if self.subjects.at_ingress(subject, "_") is None or not self.nc.is_connected:
            return None
        now = time.monotonic()
        if now < self._probe_off_until:
            return None
        wait_ms = min(_INGRESS_PROBE_MAX_MS, H.remaining_ms(deadline) / 4)
        if wait_ms < 1.0:
            return None
        try:
            msg = await self.nc.request(self.subjects.ingresses, b"", timeout=wait_ms / 1000.0)
        except NoRespondersError:
            self._probe_off_until = now + _INGRESS_PROBE_OFF_S
            return None
        except Exception:  # no answer in time, a lost connection: the queue group it is
            return None
        ingress_id = msg.data.decode(errors="replace")
        if not _ingress_token(ingress_id):
            return None
        at = self._at_ingress(subject, ingress_id)
        if at is not None:
            self.retries_at_ingress += 1
        return at

    async def models(self, timeout_s: float = 1.0) -> ModelList:
        """The served models' OIP v2 metadata (``<p>.models``), as one ingress answers it.

        Args:
            timeout_s: whole budget in seconds, retries included, a finite number > 0 (default 1.0).

        Raises:
            InvalidArgument: ``timeout_s`` is not a finite number > 0 (nothing sent).
            Unavailable, DeadlineExceeded: no ingress answered within the budget, as :meth:`request` says.
        """
        body, ct = await self.request(self.subjects.models, b"", timeout_s=timeout_s)
        return decode(body, ModelList, ct)

    async def model(self, name: str, version: str | int | None = None, *, timeout_s: float = 1.0) -> ModelMetadata:
        """One model's OIP v2 metadata: of its default version, or of ``version`` (``<p>.models.<name>.<version>``,
        as KServe's ``GET v2/models/{name}/versions/{version}``; ``parameters.version`` names it). The version is
        the second argument, as in Triton's ``get_model_metadata(name, version)``; ``timeout_s`` (the budget, s)
        is keyword-only (it came second before: ``model("digits", 2)`` asked for the default version in 2 s).

        Raises:
            NotFound: an unknown model, or a version it does not serve (``field`` ``model_version``).
            InvalidArgument (before sending): a name that cannot be one subject token, or is longer than 128 bytes
                of UTF-8 (field ``model``); a version that is not a string of digits or an int from 0 to 2**63 - 1
                (``model_version``).
        """
        subject = self.subjects.model(_subject_token(name, "model"))
        version = _version_token(version)
        if version is not None:
            subject = f"{subject}.{version}"
        body, ct = await self.request(subject, b"", timeout_s=timeout_s)
        return decode(body, ModelMetadata, ct)

    async def model_ready(self, name: str, version: str | int | None = None, *, timeout_s: float = 1.0,
                          ingress: str | None = None) -> bool:
        """Whether one model version is ready to serve (OIP v2 model ready, ``<p>.models.<name>[.<version>].ready``,
        in the place of Triton's ``is_model_ready(name, version)``): of its default version, or of ``version``. Unlike
        Triton's HTTP client, which returns False for a model the server does not know, an unknown model or version
        raises NotFound here, as its metadata does: a misspelt name is not read as "not ready yet".

        Args:
            timeout_s: whole budget in seconds, retries included, a finite number > 0 (default 1.0).
            ingress: the id of the ingress to ask (``<p>.ingresses.<ingress>.models.<name>[.<version>].ready``, as
                :meth:`health` does: one node's view), None: any of the queue group's.

        Returns:
            True when a live worker whose breaker is not open serves it and the answering ingress can route it.

        Raises:
            NotFound: an unknown model, or a version it does not serve (``field`` ``model_version``).
            InvalidArgument (before sending): as :meth:`model`; ``ingress`` cannot be one subject token (field
                ``ingress``).
            Unavailable, DeadlineExceeded: no ingress (no ingress of that id) answered within the budget, as
                :meth:`request` says.
        """
        subject = self.subjects.model_ready(_subject_token(name, "model"), _version_token(version))
        if ingress is not None:
            subject = self.subjects.at_ingress(subject, _subject_token(ingress, "ingress"))
        body, ct = await self.request(subject, b"", timeout_s=timeout_s)
        return decode(body, ModelReady, ct).ready

    async def server_metadata(self, timeout_s: float = 1.0) -> ServerMetadata:
        """OIP v2 server metadata (``<p>.server``): ``name`` ``"inferbus"``, the answering ingress's ``version``
        and its protocol ``extensions``, as Triton's ``get_server_metadata``.

        Raises:
            InvalidArgument: ``timeout_s`` is not a finite number > 0 (nothing sent).
            Unavailable, DeadlineExceeded: no ingress answered within the budget, as :meth:`request` says.
        """
        body, ct = await self.request(self.subjects.server, b"", timeout_s=timeout_s)
        return decode(body, ServerMetadata, ct)

    async def health(self, timeout_s: float = 1.0, ingress: str | None = None) -> Health:
        """Liveness/readiness of one ingress replica: any of the queue group's (``<p>.health``), or the one whose id
        is ``ingress`` (``<p>.ingresses.<ingress>.health``; its id is ``parameters.ingress_id`` of a health reply
        and ``<node>-i<k>`` for ``inferbus up``'s), which with several nodes on one NATS is how one node's view is
        read (the queue group's answer comes from any node).

        Args:
            timeout_s: whole budget in seconds, retries included, a finite number > 0 (default 1.0).
            ingress: the id of the ingress to ask (None: any).

        Raises:
            InvalidArgument: ``timeout_s`` is not a finite number > 0; ``ingress`` cannot be one subject token
                (field ``ingress``; nothing sent either way).
            Unavailable, DeadlineExceeded: no ingress answered within the budget, as :meth:`request` says;
                Unavailable at once (field ``ingress``) when NATS answers "no responders" for the ingress of that
                id (none is subscribed), its message naming the subject and the ids that do answer
                ``<p>.ingresses``.
        """
        subject = self.subjects.health
        if ingress is not None:
            subject = self.subjects.at_ingress(subject, _subject_token(ingress, "ingress"))
        try:
            body, ct = await self.request(subject, b"", timeout_s=timeout_s)
        except Unavailable as err:
            if ingress is None or not err.message.startswith("no responders on"):
                raise
            # which ids do answer (a fresh-user trial read "no ingress is serving" of an id no ingress had)
            ids = await self.ingress_ids(wait_s=0.05)
            raise Unavailable(f"{err.message}; the ingresses that answer under prefix {self.subjects.prefix!r}: "
                              f"{', '.join(ids) if ids else 'none'}", field="ingress") from err
        return decode(body, Health, ct)

    async def ingress_ids(self, wait_s: float = 0.1) -> list[str]:
        """The ids of the ingresses that answer ``<p>.ingresses`` within ``wait_s`` seconds (each answers with its
        id), sorted; empty when none does or this client is not connected. Never raises for the bus's errors."""
        if not self.nc.is_connected:
            return []
        inbox = self.nc.new_inbox()
        ids: set[str] = set()

        async def on_reply(msg) -> None:
            if msg.data:
                ids.add(msg.data.decode(errors="replace"))

        try:
            sub = await self.nc.subscribe(inbox, cb=on_reply)
            try:
                await self.nc.publish(self.subjects.ingresses, b"", reply=inbox)
                await asyncio.sleep(wait_s)
            finally:
                await sub.unsubscribe()
        except Exception:  # closed or reconnecting meanwhile: what arrived
            pass
        return sorted(ids)


class SyncClient:
    """A blocking :class:`Client` for code without an event loop (a trading strategy's thread, a notebook, a
    web framework's worker), with the same methods, arguments, retries and typed errors, returning plain values.

    It runs a :class:`Client` on an event loop of its own (uvloop where installed) on a daemon thread; each call
    hands its coroutine to that loop (``asyncio.run_coroutine_threadsafe``) and waits for the result. Calls
    from several threads at once are safe and run concurrently on the one connection. The hand-over costs two
    thread wake-ups per call: measured on the 2-core development box against a NATS echo, p50 +160–200 µs
    over :class:`Client` (anyio's blocking portal, tried first, cost +310–350 µs). Latency-critical code that
    has an event loop should use :class:`Client`; do not call a SyncClient from a coroutine (it would block
    that loop).

    Use ``SyncClient.connect(...)`` (the arguments of :meth:`Client.connect`), and :meth:`close` or ``with``
    (each open SyncClient holds a thread and a connection). Closing it while other threads wait in calls makes
    those calls raise Unavailable at once; Ctrl-C while a call waits cancels it on the loop thread too.
    """

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self.client = client
        """The :class:`Client` on the loop thread (its ``nc`` belongs to that loop: do not use it here)."""
        self._loop: asyncio.AbstractEventLoop | None = loop
        self._thread = thread
        self._lock = threading.Lock()
        self._pending: set[concurrent.futures.Future] = set()
        """Calls waiting for their answer (cancelled by :meth:`close`)."""

    @classmethod
    def connect(cls, servers: str | list[str] = "nats://127.0.0.1:4222", prefix: str = "inferbus",
                **options) -> "SyncClient":
        """Start the loop thread and connect: the arguments and errors of :meth:`Client.connect`."""
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:  # e.g. Windows
            loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="inferbus-sync-client", daemon=True)
        thread.start()
        try:
            client = asyncio.run_coroutine_threadsafe(Client.connect(servers, prefix, **options), loop).result()
        except BaseException:
            _stop_loop(loop, thread)
            raise
        return cls(client, loop, thread)

    def _call(self, coro_fn, *args, **kwargs):
        """Run ``coro_fn(*args, **kwargs)`` on the loop thread and wait for it.

        Raises:
            Unavailable: the client is closed, or was closed by another thread while this call waited.
            RuntimeError: called from the client's own loop thread (it would wait for itself forever).
            KeyboardInterrupt: while waiting (the call is cancelled on the loop thread too, not left retrying).
            whatever the call raises (the typed errors of :class:`Client`).
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("SyncClient called from its own event loop's thread (from a callback or a coroutine "
                               "run there): it would wait for itself; use the async Client (SyncClient.client)")
        with self._lock:
            loop = self._loop
            if loop is None:
                raise Unavailable("this SyncClient is closed; connect a new one")
            fut = asyncio.run_coroutine_threadsafe(coro_fn(*args, **kwargs), loop)
            self._pending.add(fut)
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            raise Unavailable("this SyncClient was closed while the call waited for its answer") from None
        except BaseException:
            if not fut.done():  # interrupted while waiting (Ctrl-C): stop the call there too
                fut.cancel()
            raise
        finally:
            with self._lock:
                self._pending.discard(fut)

    def infer(self, model: str, inputs: dict[str, np.ndarray], **kwargs) -> dict[str, np.ndarray]:
        """:meth:`Client.infer`, blocking: ``{output name: np.ndarray}``; the same keyword arguments and errors."""
        return self._call(self.client.infer, model, inputs, **kwargs)

    def infer_result(self, model: str, inputs: dict[str, np.ndarray], **kwargs) -> InferResult:
        """:meth:`Client.infer_result`, blocking."""
        return self._call(self.client.infer_result, model, inputs, **kwargs)

    def request(self, subject: str, body: bytes, **kwargs) -> tuple[bytes, str | None]:
        """:meth:`Client.request`, blocking."""
        return self._call(self.client.request, subject, body, **kwargs)

    def models(self, timeout_s: float = 1.0) -> ModelList:
        """:meth:`Client.models`, blocking."""
        return self._call(self.client.models, timeout_s)

    def model(self, name: str, version: str | int | None = None, *, timeout_s: float = 1.0) -> ModelMetadata:
        """:meth:`Client.model`, blocking."""
        return self._call(self.client.model, name, version, timeout_s=timeout_s)

    def model_ready(self, name: str, version: str | int | None = None, *, timeout_s: float = 1.0,
                    ingress: str | None = None) -> bool:
        """:meth:`Client.model_ready`, blocking."""
        return self._call(self.client.model_ready, name, version, timeout_s=timeout_s, ingress=ingress)

    def server_metadata(self, timeout_s: float = 1.0) -> ServerMetadata:
        """:meth:`Client.server_metadata`, blocking."""
        return self._call(self.client.server_metadata, timeout_s)

    def health(self, timeout_s: float = 1.0, ingress: str | None = None) -> Health:
        """:meth:`Client.health`, blocking."""
        return self._call(self.client.health, timeout_s, ingress)

    def ingress_ids(self, wait_s: float = 0.1) -> list[str]:
        """:meth:`Client.ingress_ids`, blocking."""
        return self._call(self.client.ingress_ids, wait_s)

    def close(self) -> None:
        """Close the client (as :meth:`Client.close`) and stop the loop thread; idempotent. Calls other threads
        are waiting in raise :class:`~inferbus.schemas.Unavailable` at once (they are cancelled, not left to
        wait for their budget)."""
        with self._lock:
            loop, self._loop = self._loop, None
            pending = list(self._pending)
        if loop is None:
            return
        for fut in pending:
            fut.cancel()
        try:
            asyncio.run_coroutine_threadsafe(self.client.close(), loop).result()
        finally:
            _stop_loop(loop, self._thread)

    def __enter__(self) -> "SyncClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _cancel_the_rest() -> None:
    """Cancel every other task of the running loop and wait for them (at most 2 s)."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in rest:
        t.cancel()
    if rest:
        await asyncio.wait(rest, timeout=2.0)



def _sync_connect_signature() -> inspect.Signature:
    """:meth:`SyncClient.connect`'s signature as :func:`help` and editors show it: :meth:`Client.connect`'s (it takes
    the same arguments and hands them on), returning a SyncClient."""
    sig = inspect.signature(Client.connect.__func__)
    return sig.replace(return_annotation="SyncClient")


SyncClient.connect.__func__.__signature__ = _sync_connect_signature()

def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Cancel what still runs on ``loop`` (nats-py's subscription tasks of a connection whose server went away),
    stop it on ``thread``, wait for the thread, close the loop. (Stopped with them pending, the interpreter printed
    ``Task was destroyed but it is pending!`` for each: a fresh-user trial.)"""
    try:
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop).result(timeout=3.0)
    except Exception:  # the loop is not running any more, or a task would not end: stop it as it is
        pass
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    if not thread.is_alive():
        loop.close()
