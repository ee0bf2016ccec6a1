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
    interval_ms: int = 100
    draining: bool = False


class DoneItem(msgspec.Struct, array_like=True):
    seq: int
    ok: bool
    """True when the reply was a result (not an error)."""
    server_error: bool = False
    """True when the failure was the worker's fault (counts against its health)."""
    service_us: int = 0
    response: bytes | None = None
    """The encoded InferResponse (msgpack), only when the ingress asked for a cache fill."""


class DoneNotice(_Base, tag="inferbus.v1.done"):
    """Completions a worker sends to one ingress after replying to the clients (off the hot path)."""

    worker_id: str
    items: list[DoneItem]


class CacheFill(_Base, tag="inferbus.v1.cache_fill"):
    """A result for the aggregator to write to the L2 cache (``SET key value PX ttl_ms``)."""

    key: str
    ttl_ms: int
    response: bytes


class ProcessEvent(_Base, tag="inferbus.v1.event"):
    """A lifecycle event from a node supervisor: ``kind`` is ``down`` or ``up``."""

    kind: str
    child_id: str
    worker_id: str | None = None
    pid: int | None = None
    reason: str = ""


InternalMessage = LoadReport | DoneNotice | CacheFill | ProcessEvent

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
