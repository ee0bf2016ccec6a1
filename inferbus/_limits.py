"""Bounds of the node's options: one place for the configuration checks (:mod:`inferbus.actors`) and the ranges
``inferbus up --help`` states, so the two cannot drift apart.

A module of its own, outside :mod:`inferbus.actors` (whose package import starts every actor module), so the CLI
reads these without importing the actors; it imports only nats-py's subscription defaults.
"""

from __future__ import annotations

from nats.aio.subscription import DEFAULT_SUB_PENDING_BYTES_LIMIT, DEFAULT_SUB_PENDING_MSGS_LIMIT

MAX_NODE_PROCESSES = 1024
"""The most workers, and the most ingresses, one node starts (each is an OS process; a larger count is a typo,
and ``--ingress 99999999999999999999`` kept ``inferbus up`` busy starting processes)."""
MIN_MAX_PAYLOAD_BYTES = 64 * 1024
"""The least ``NodeConfig.nats_max_payload_bytes``: room for the actors' own messages (a ``$SRV.INFO`` answer with
every endpoint, a model list, a load report) with a margin. Chosen here, not taken from NATS."""
MAX_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
"""nats-server's ceiling for ``max_payload``: its configuration reference (docs.nats.io, ``max_payload``) allows
up to 64MB, and no more than ``max_pending`` (64MB by default, which the embedded server keeps)."""
MAX_MAILBOX_SIZE = 1_000_000_000
"""Largest ``WorkerConfig.mailbox_size`` in requests (a 20-digit value crashed every worker on serialization)."""
MAX_HEALTH_WINDOW_S = 86_400
"""Longest ``WorkerConfig.health_window_s``, seconds (a day; the least is 1 s)."""
MAX_BACKLOG_MSGS = DEFAULT_SUB_PENDING_MSGS_LIMIT // 2
"""Largest ``IngressConfig.max_backlog_msgs``: half of nats-py's per-subscription pending limit, so the
ingress refuses a backlog itself long before nats-py would drop messages silently (slow consumer)."""
MAX_BACKLOG_BYTES = DEFAULT_SUB_PENDING_BYTES_LIMIT // 2
"""Largest ``IngressConfig.max_backlog_bytes`` (half of nats-py's pending-bytes limit, same reason)."""


def binary_size(n: int) -> str:
    """``n`` bytes in the largest binary unit that divides it (``65536`` → ``"64 KiB"``), for messages and help."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"
