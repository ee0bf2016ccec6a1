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


def parse_block(block: bytes) -> dict[str, str]:
    """The dict a header block encodes (for the fallback path and for tests)."""
    out = {}
    for line in block.split(b"\r\n")[1:]:
        k, sep, v = line.partition(b":")
        if sep:
            out[k.decode()] = v.strip().decode()
    return out


async def publish_raw(nc, subject: str, payload: bytes, *, reply: str = "", headers: bytes | None = None) -> None:
    """Publish ``payload`` with a pre-encoded header block (None = no headers).

    Behaviour matches ``nc.publish``: buffered while reconnecting, written by
    nats-py's flusher; the subject is not validated (pass subjects you built or
    received from the server).

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
    fq = nc._flush_queue
    if fq is not None and fq.empty():
        await nc._flush_pending()
