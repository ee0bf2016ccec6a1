"""Publishing with a header block encoded once (a hot-path helper over nats-py).

nats-py's ``publish(headers=...)`` re-encodes the header dict on every call
(per key: strip, a regex check, translate, encode), which costs about as much
CPU as the model of a small MLP for a ten-header message (bench/micro.py,
docs/performance.md). Headers that are the same for many messages (a load
generator's, a worker's ``Content-Type``) or that differ in one value can be
encoded once with :func:`header_block` and published with :func:`publish_raw`.

``publish_raw`` writes the same ``HPUB``/``PUB`` protocol line nats-py writes,
into nats-py's own pending buffer, and kicks its flusher the same way, so
ordering with ``nc.publish`` on the same connection is kept. It uses three
private members of ``nats.aio.client.Client`` (``_send_command``,
``_flush_queue``, ``_flush_pending``; present from nats-py 2.2 to 2.16 at
least); when they are missing it falls back to ``nc.publish``.
"""

from __future__ import annotations

import re

from nats.errors import ConnectionClosedError, MaxPayloadError
from nats.protocol.command import hpub_cmd, pub_cmd

_KEY = re.compile(r"^[!-9;-~]+$")  # printable ASCII except ':' (RFC 7230 token-ish, as nats-py checks)
_CTL = re.compile(r"[\r\n]")


class HeaderError(ValueError):
    """A header name or value that cannot be sent (bad name characters, CR/LF in a value)."""


def header_block(headers: dict[str, str]) -> bytes:
    """Encode ``headers`` as a NATS header block (``NATS/1.0\\r\\n`` ... ``\\r\\n``), once.

    Args:
        headers: name → value; names are printable ASCII without ':' or spaces,
            values are text without CR or LF (leading/trailing spaces are stripped,
            as nats-py does).

    Raises:
        HeaderError: a name or value that nats-py would reject or that would break the protocol.
    """
    parts = [b"NATS/1.0\r\n"]
    for k, v in headers.items():
        k = k.strip()
        if not _KEY.match(k):
            raise HeaderError(f"header name {k!r}: printable ASCII, no ':' or whitespace")
        v = str(v).strip()
        if _CTL.search(v):
            raise HeaderError(f"header {k!r}: value must not contain CR or LF")
        parts.append(f"{k}: {v}\r\n".encode())
    parts.append(b"\r\n")
    return b"".join(parts)


_CT_BLOCKS = {json: header_block({"Content-Type": "application/json" if json else "application/msgpack"})
              for json in (False, True)}


def reply_block(json: bool, request_id: str | None = None) -> bytes:
    """The header block of a successful answer: ``Content-Type`` (JSON or MessagePack) and, when given,
    ``Inferbus-Request-Id``; the block without an id is built once per Content-Type.

    Raises:
        HeaderError: ``request_id`` holds CR or LF (callers pass ids as nats-py parsed them, or through
            ``headers.header_value``).
    """
    if not request_id:
        return _CT_BLOCKS[json]
    if "\r" in request_id or "\n" in request_id:
        raise HeaderError("header 'Inferbus-Request-Id': value must not contain CR or LF")
    return b"".join((_CT_BLOCKS[json][:-2], b"Inferbus-Request-Id: ", request_id.strip().encode(), b"\r\n\r\n"))


def parse_block(block: bytes) -> dict[str, str]:
    """The dict a header block encodes (for the fallback path and for tests)."""
    out = {}
    for line in block.split(b"\r\n")[1:]:
        k, sep, v = line.partition(b":")
        if sep:
            out[k.decode()] = v.strip().decode()
    return out


async def publish_raw(nc, subject: str, payload: bytes, *, reply: str = "", headers: bytes | None = None,
                      flush: bool = True) -> None:
    """Publish ``payload`` with a pre-encoded header block (None = no headers).

    Behaviour matches ``nc.publish``: buffered while reconnecting, written by
    nats-py's flusher; the subject is not validated (pass subjects you built or
    received from the server).

    ``flush=False`` only appends to nats-py's pending buffer (nothing is sent
    until :func:`send_pending`, the next flushing publish or nats-py's own
    flush): for a caller that publishes several messages in a row and then sends
    them in one write with :func:`send_pending`.

    Raises:
        nats.errors.ConnectionClosedError: the connection is closed.
        nats.errors.MaxPayloadError: headers + payload exceed the server's max_payload.
    """
    send = getattr(nc, "_send_command", None)
    if send is None or not hasattr(nc, "_flush_queue"):  # pragma: no cover - another nats-py
        await nc.publish(subject, payload, reply=reply, headers=parse_block(headers) if headers else None)
        return
    if nc.is_closed:
        raise ConnectionClosedError
    size = len(payload) + (len(headers) if headers else 0)
    if size > nc.max_payload:
        raise MaxPayloadError
    if headers:
        await send(hpub_cmd(subject, reply, headers, payload))
    else:
        await send(pub_cmd(subject, reply, payload))
    nc.stats["out_msgs"] += 1
    nc.stats["out_bytes"] += len(payload)
    if flush:
        await _kick_flusher(nc)


async def _kick_flusher(nc) -> None:
    """Wake nats-py's flusher task as ``nc.publish`` does: once, unless a wake-up is already queued."""
    fq = getattr(nc, "_flush_queue", None)
    if fq is not None and fq.empty() and not nc.is_closed:
        await nc._flush_pending()


async def send_pending(nc, *, now: bool = True) -> bool:
    """Send what nats-py has buffered for ``nc``: in one socket write at once (``now``), else by its flusher.

    nats-py's flusher is a task: a publish queues a future that wakes it on a
    later turn of the event loop, after every callback already ready (on a busy
    actor: the handlers of the requests queued behind this one, and their
    bookkeeping). An actor that has just produced answers calls this with
    ``now=True`` to put them on the wire first, saving the flusher's future,
    queue hand-off and task switch; with ``now=False`` (more requests already
    wait to be handled, whose answers can share the write) it kicks the flusher
    as ``nc.publish`` does.

    ``now`` writes straight to the connection's asyncio transport (uvloop tries
    the ``send`` at once) only when the client is connected and that transport
    holds no unsent bytes. Otherwise (reconnecting, a backlog the flusher is
    draining, another transport than nats-py's TCP one) the flusher is kicked,
    so that ordering, buffering during reconnects and back-pressure stay
    nats-py's. Uses the private ``_pending`` (a list of byte strings),
    ``_pending_data_size``, ``_flush_queue``, ``_flush_pending`` and
    ``_transport._io_writer`` of nats-py (checked against 2.16); where they
    are missing or of another type it kicks the flusher instead.

    Returns:
        True when the bytes were written here; False when the flusher was kicked,
        was already due, or nothing was pending.
    """
    if not getattr(nc, "_pending_data_size", 0):
        return False
    if now:
        writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
        if writer is not None and nc.is_connected:
            transport = writer.transport
            pending = nc._pending
            if type(pending) is list and not transport.is_closing() and transport.get_write_buffer_size() == 0:
                nc._pending = []
                nc._pending_data_size = 0
                transport.writelines(pending)
                return True
    await _kick_flusher(nc)
    return False
