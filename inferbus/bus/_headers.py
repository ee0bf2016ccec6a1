"""Header names (DESIGN §3) and the time budget carried by ``Inferbus-Timeout-Ms``.

The budget is the *remaining* time in milliseconds, recomputed and rewritten at
every hop (as gRPC does with ``grpc-timeout``), so no clock sync is needed
between hosts. Each actor turns it into a local monotonic deadline on receipt.
"""

from __future__ import annotations

import time

from .._limits import MAX_TIMEOUT_MS  # (defined there, so the CLI's help reads it without importing the bus)

REQUEST_ID = "Inferbus-Request-Id"
TIMEOUT_MS = "Inferbus-Timeout-Ms"
CONTENT_TYPE = "Content-Type"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
CLIENT_ID = "Inferbus-Client-Id"
MAX_CLIENT_ID_CHARS = 256
"""The longest ``Inferbus-Client-Id`` taken (characters): an ingress with per-client rate limits keeps a bucket per id
(up to 100,000 of them), so one id the size of a message would hold that much memory per client."""
MSG_TYPE = "Inferbus-Msg"
"""Version tag of a message between our own actors (e.g. ``inferbus.v1.forward``)."""
SEQ = "Inferbus-Seq"
INGRESS = "Inferbus-Ingress"
MODEL = "Inferbus-Model"
VERSION = "Inferbus-Version"
CACHE_KEY = "Inferbus-Cache-Key"
HEDGE = "Inferbus-Hedge"
ALONE = "Inferbus-Alone"
"""On a forward (ingress → worker), value ``1``: run this request in a model run of its own, not merged with others.
Set for a request that a worker which crashed was running (a suspected query of death), so that a second crash
is known to be its alone, and the requests that shared its first run are not taken for it."""
PIN = "Inferbus-Pin"
"""On a forward (ingress → worker) that wants the answer for the result cache: the pin (``sha256:<64 hex>``, the
digest of the version's files, :mod:`inferbus.actors._pinning`) the ingress keyed the request's cache entry with.
Sent only for a version re-pinned (``inferbus models load``) since the ingress started; a worker whose session of
the version was loaded from other files answers the request but gives no cache fill (docs/models.md, "Caches")."""
ATTEMPT = "Inferbus-Attempt"
"""Attempt number of a client's retry with the same request id (2, 3, ...; absent on the first). An ingress
that holds no copy of such a request asks its peers which worker does (``Subjects.rid_query``)."""
TERM = "Inferbus-Term"
"""Fencing term of the primary region, stamped by the ingress on forwarded requests (DESIGN §8).

A worker that knows a higher term refuses the request with UNAVAILABLE (the SDK
retries; the ingress stamps the new term by then) and stamps the term on replies."""
ATTEMPT_DEADLINE_UNIX_MS = "Inferbus-Attempt-Deadline-Unix-Ms"
"""When the client stops waiting for *this attempt* (wall clock, ms since the Unix epoch), set by the SDK on every
attempt but the last (the last waits for the whole budget, ``Inferbus-Deadline-Unix-Ms``). Past it (with the
``DEADLINE_SKEW_MS`` allowance) the client has sent the request again, to another ingress, or given up, so an
ingress that takes the attempt only then (it waited in the socket of a stopped or starved ingress) does not run it:
run, it would only compute the answer a second time, on another worker than the retry's (a fresh-user trial: 19-69
requests ran twice per 1-2 s SIGSTOP of one of two ingresses). Answered UNAVAILABLE (``retry_after_ms`` 0) with the
reason, or dropped without a reply while 64 or more requests wait behind it, as a request past its deadline is."""
WORKER_ID = "Inferbus-Worker-Id"
"""The worker that published an execution audit batch on ``<p>._audit`` (``--audit``): a drill tells a request
run on two workers (the retry trade of docs/failure-semantics.md) from one run twice on the same worker."""
DEADLINE_UNIX_MS = "Inferbus-Deadline-Unix-Ms"
"""Absolute deadline (wall clock, ms since the Unix epoch) set by the ingress on forwarded requests, and by the
SDK and the load generator on requests (optional for other clients; the ingress then serves a request by the
earlier of this and ``Inferbus-Timeout-Ms`` from its receipt, and refuses one already past it).

The relative budget cannot see time a message spends in a socket buffer of a
stopped or starved process; this header can. It is checked with a clock-skew
allowance (``DEADLINE_SKEW_MS``), so hosts need only loosely synced clocks."""
DEADLINE_SKEW_MS = 50.0
FWD = "Inferbus-Fwd"
"""The one routing header of a forwarded request (ingress → worker), replacing ten.

``v1;<seq>;<ingress>;<model>;<version>;<timeout_ms>;<deadline_unix_ms>;<term>;<cache_key>;<timings>``:
ten ``;``-separated fields (term and cache key may be empty; timings are
``name=µs`` pairs joined by ``,``). Encoding one header instead of ten saves the
ingress ~16 µs and the worker ~9 µs per request (docs/performance.md).
:func:`parse_fwd` turns it back into the individual header names (the worker reads the fields straight
into its job; tests and tools read them by name)."""
CLIENT_HEADERS = {n.lower(): n for n in (CONTENT_TYPE, REQUEST_ID, TIMEOUT_MS, DEADLINE_UNIX_MS, CLIENT_ID, ATTEMPT,
                                          HEDGE, ATTEMPT_DEADLINE_UNIX_MS)}
"""The headers a client may send to an ingress, by their lower-case spelling."""
EXACT_HEADERS = frozenset(CLIENT_HEADERS.values()) | {TRACEPARENT, TRACESTATE}
"""The client headers in their exact spelling, trace context included: a request whose header names are all here
needs no case-insensitive look (:func:`miscased_header`, :func:`trace_lines`)."""


_HEX = frozenset("0123456789abcdef")
MAX_TRACESTATE_CHARS = 512
"""The longest ``tracestate`` forwarded (W3C Trace Context: a platform may cut it at 512 characters)."""


def valid_traceparent(value: str) -> bool:
    """Whether ``value`` is a W3C Trace Context ``traceparent`` an ingress forwards: ``version-trace_id-parent_id-
    flags``, lower-case hex of 2, 32, 16 and 2 digits, a version other than ``ff``, ids not all zero (a later
    version may add fields after a dash: kept). W3C: a receiver that cannot parse it drops it, and ``tracestate``
    with it; a 5,000-character garbage value was forwarded as it came (a fresh-user trial, 2026-12-05)."""
    if len(value) < 55 or (len(value) > 55 and (value[:2] == "00" or value[55] != "-")):
        return False
    version, trace_id, parent_id, flags = value[:2], value[3:35], value[36:52], value[53:55]
    return (value[2] == value[35] == value[52] == "-" and _HEX.issuperset(version + trace_id + parent_id + flags)
            and version != "ff" and trace_id != "0" * 32 and parent_id != "0" * 16)


def trace_lines(headers: dict) -> str:
    """The trace-context header lines an ingress forwards to the worker from a request's ``headers``: ``traceparent``
    when :func:`valid_traceparent`, and ``tracestate`` only beside it and at most :data:`MAX_TRACESTATE_CHARS`
    characters, both spelled in lower case; ``""`` otherwise.

    Their names are read in any case when the lower-case one is absent (``Traceparent``, as Go's ``http.Header``
    canonicalizes it): W3C Trace Context, section 3.2.1, "vendors MUST expect the header name in any case", where
    NATS header names are otherwise case-sensitive (ADR-4)."""
    v, state = trace_context(headers)
    if v is None:
        return ""
    if state:
        return f"{TRACEPARENT}: {v}\r\n{TRACESTATE}: {state}\r\n"
    return f"{TRACEPARENT}: {v}\r\n"


def trace_context(headers: dict) -> tuple[str | None, str | None]:
    """``(traceparent, tracestate)`` of a request's ``headers`` as an ingress takes them (:func:`trace_lines`): the
    ``traceparent`` when :func:`valid_traceparent` else None, and the ``tracestate`` only beside it and at most
    :data:`MAX_TRACESTATE_CHARS` characters, else None; names read in any case (W3C Trace Context, section 3.2.1)."""
    v = headers.get(TRACEPARENT)
    state = headers.get(TRACESTATE)
    if v is None or (state is None and not headers.keys() <= EXACT_HEADERS):  # (`traceparent` beside a `TraceState`)
        for k, val in headers.items():
            low = k.lower()
            if low == TRACEPARENT and v is None:
                v = val
            elif low == TRACESTATE and state is None:
                state = val
    if not v or not valid_traceparent(v):
        return None, None
    return v, state if state and len(state) <= MAX_TRACESTATE_CHARS else None


def miscased_header(headers: dict) -> tuple[str, str] | None:
    """``(given, ours)`` for the first header in ``headers`` that is one of :data:`CLIENT_HEADERS` in another
    case (``inferbus-timeout-ms``, ``content-type``) while ours is absent; None when there is none.

    NATS header names are case-sensitive (ADR-4, "NATS Message Headers"), so such a header would be silently
    ignored: a budget typed in lower case would grant the default one, a lower-case ``content-type`` would have a
    JSON body read as MessagePack. The ingress refuses the request instead (INVALID_ARGUMENT)."""
    if headers.keys() <= EXACT_HEADERS:  # the SDK's and the load generator's requests: one set comparison, no loop
        return None
    for k in headers:
        ours = CLIENT_HEADERS.get(k.lower())
        if ours is not None and ours != k and ours not in headers:
            return k, ours
    return None


FWD_VERSION = "v1"
TIMINGS = "Inferbus-Timings"
FWD_FIELDS = (SEQ, INGRESS, MODEL, VERSION, TIMEOUT_MS, DEADLINE_UNIX_MS, TERM, CACHE_KEY, TIMINGS)
"""The header names of the nine ``Inferbus-Fwd`` fields after the version tag, in order."""
_NEWLINES = str.maketrans({"\r": " ", "\n": " "})


def fwd_value(seq: int, ingress: str, model: str, version: str, timeout_ms: float, deadline_unix_ms: float,
              term: str, cache_key: str, timings: str) -> str:
    """The ``Inferbus-Fwd`` value (fields must not contain ``;``: ids, names and keys are tokens)."""
    return (f"v1;{seq};{ingress};{model};{version};{max(timeout_ms, 0.0):.3f};{deadline_unix_ms:.1f};"
            f"{term};{cache_key};{timings}")


def fwd_fields(value: str, headers: dict) -> list | None:
    """The nine fields of an ``Inferbus-Fwd`` value, in ``FWD_FIELDS`` order, as strings or None.

    An empty field counts as absent: the header of that name in ``headers``, if any, applies (None
    otherwise). Returns None when the value is not a ``v1`` forward header with ten fields.
    """
    parts = value.split(";")
    if len(parts) != 10 or parts[0] != FWD_VERSION:
        return None
    del parts[0]
    if not all(parts):
        parts = [v or headers.get(name) for name, v in zip(FWD_FIELDS, parts)]
    return parts


def parse_fwd(value: str, headers: dict) -> dict | None:
    """``headers`` plus the fields of an ``Inferbus-Fwd`` value under their own header names (:func:`fwd_fields`;
    None for a malformed value)."""
    parts = fwd_fields(value, headers)
    if parts is None:
        return None
    return {**headers, **{name: v for name, v in zip(FWD_FIELDS, parts) if v is not None}}


MAX_ATTEMPT = 1_000_000
"""The largest ``Inferbus-Attempt`` an ingress takes (far past any retry policy: the SDK's default is 3)."""


def attempt_number(raw: str) -> int:
    """The attempt an ``Inferbus-Attempt`` value names: 1 for the first send, 2, 3, ... for retries (the SDK
    sends it on retries only).

    The syntax is ASCII decimal digits (surrounding spaces allowed, as nats-py strips them), no sign, from 1 to
    :data:`MAX_ATTEMPT`.

    Raises:
        InvalidArgument: any other value (``field`` = the header's name). A retry's number that no client could
            have meant would otherwise route as a retry or not depending on a guess.
    """
    v = raw.strip()
    if v.isascii() and v.isdigit() and len(v) <= 7 and 1 <= int(v) <= MAX_ATTEMPT:  # int() refuses 4,301+ digits
        return int(v)
    from ..schemas import InvalidArgument

    raise InvalidArgument(f"{ATTEMPT} must be the attempt's number (1 for the first send, 2, 3, ... for retries; at "
                          f"most {MAX_ATTEMPT}), got {str(raw)[:40]!r}", field=ATTEMPT)


def query_content_type(headers: dict | None) -> str | None:
    """The ``Content-Type`` of a metadata, health or model-management request, its header name in any case: such a
    request has nothing a miscased header could change but its body's and its reply's encoding, so it is read, not
    refused as an inference request's is (fresh-user trials: a JSON client's ``content-type`` got MessagePack back,
    and an unknown model operation's error did too)."""
    if not headers:
        return None
    ct = headers.get(CONTENT_TYPE)
    if ct is None:
        ct = next((v for k, v in headers.items() if k.lower() == "content-type"), None)
    return ct


def header_value(v: str) -> str:
    """A header value as nats-py sends it (stripped; CR/LF turned into spaces)."""
    v = v.strip()
    if "\r" in v or "\n" in v:
        v = v.translate(_NEWLINES)
    return v
STATUS = "Status"  # NATS server status header (503 = no responders)

DEFAULT_TIMEOUT_MS = 1000.0
# MAX_TIMEOUT_MS (600 s), the longest budget: imported from inferbus._limits above


def deadline_from_headers(headers: dict | None, now: float | None = None, default_ms: float = DEFAULT_TIMEOUT_MS,
                          strict: bool = False) -> float:
    """Local ``time.monotonic()`` deadline from the ``Inferbus-Timeout-Ms`` header.

    Args:
        headers: message headers or None.
        now: receipt time (monotonic seconds); defaults to now.
        default_ms: budget when the header is absent.
        strict: a malformed value (not a number, NaN, empty) raises instead of counting as absent
            (the ingress: a client's typo must not silently grant the default budget).

    Returns:
        Deadline in monotonic seconds; the budget is clamped to [0, ``MAX_TIMEOUT_MS``]. Without
        ``strict`` a malformed header is treated as absent (internal hops).

    Raises:
        InvalidArgument: ``strict`` and the header is malformed (``field`` = the header's name).
    """
    if now is None:
        now = time.monotonic()
    return now + budget_ms(headers.get(TIMEOUT_MS) if headers else None, default_ms, strict) / 1000.0


def header_number(raw: str) -> float:
    """A numeric header value (``Inferbus-Timeout-Ms``, ``Inferbus-Deadline-Unix-Ms``) as a float; NaN when
    malformed.

    The syntax is ASCII decimal as JSON and most clients write it (``750``, ``750.5``, ``7.5e2``, optional sign
    and surrounding spaces) plus ``inf``/``infinity``. Python's ``float()`` alone also takes digit-group
    underscores (``1_000``) and any Unicode decimal digits (``١٠٠٠``), which no other language's client would
    send or read the same way: those are malformed here.
    """
    if not raw.isascii() or "_" in raw:
        return float("nan")
    try:
        return float(raw)
    except ValueError:
        return float("nan")


def budget_ms(raw: str | None, default_ms: float = DEFAULT_TIMEOUT_MS, strict: bool = False) -> float:
    """The time budget an ``Inferbus-Timeout-Ms`` value grants, ms, clamped to [0, ``MAX_TIMEOUT_MS``].

    ``raw`` None (absent) grants ``default_ms``; a malformed value (not a number as :func:`header_number`
    reads it, NaN) too, unless ``strict``: then it raises InvalidArgument (``field`` = the header's name).
    The rule of :func:`deadline_from_headers`, for a value already taken from its header.
    """
    ms = default_ms
    if raw is not None:
        ms = header_number(raw)
        if ms != ms:  # NaN
            if strict:
                from ..schemas import InvalidArgument

                raise InvalidArgument(f"{TIMEOUT_MS} must be a number of milliseconds, got {str(raw)[:40]!r}",
                                      field=TIMEOUT_MS)
            ms = default_ms
    return min(max(ms, 0.0), MAX_TIMEOUT_MS)


def wall_deadline_left_s(deadline_unix_ms: float, now_unix_s: float | None = None,
                         skew_ms: float = DEADLINE_SKEW_MS) -> float:
    """Seconds left until a wall-clock deadline (``Inferbus-Deadline-Unix-Ms``, ms since the epoch) plus the
    clock-skew allowance ``skew_ms``; negative once it passed by more than the allowance.

    The one reading of the header's deadline: the ingress serves a request by it, the worker refuses a job
    past it (:func:`wall_deadline_passed`)."""
    return (deadline_unix_ms + skew_ms) / 1000.0 - (time.time() if now_unix_s is None else now_unix_s)


def wall_deadline_passed(deadline_unix_ms: float | None, now_unix_s: float | None = None,
                         skew_ms: float = DEADLINE_SKEW_MS) -> bool:
    """True when a wall-clock deadline (``Inferbus-Deadline-Unix-Ms``, ms since the epoch) is set and passed by
    more than ``skew_ms`` (time in a socket buffer of a stopped process, which a relative budget cannot see)."""
    return deadline_unix_ms is not None and wall_deadline_left_s(deadline_unix_ms, now_unix_s, skew_ms) < 0


def remaining_ms(deadline: float, now: float | None = None) -> float:
    """Milliseconds left until ``deadline`` (monotonic seconds); may be negative."""
    return (deadline - (time.monotonic() if now is None else now)) * 1000.0


def format_ms(ms: float) -> str:
    """Header value for a budget, 3 decimals (µs resolution)."""
    return f"{max(ms, 0.0):.3f}"


def header_bytes(headers: dict | None) -> int:
    """Bytes the NATS protocol spends on ``headers`` (``NATS/1.0\\r\\n``, ``Key: value\\r\\n`` each, ``\\r\\n``).

    The server's ``max_payload`` limits headers plus body together, and a client
    that publishes past it has its connection closed by the server, so every
    publisher checks ``len(body) + header_bytes(headers) <= max_payload`` first.
    """
    if not headers:
        return 0
    return 12 + sum(len(k.encode()) + len(str(v).encode()) + 4 for k, v in headers.items())
