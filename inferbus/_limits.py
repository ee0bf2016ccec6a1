"""Bounds and choices of the node's options: one place for the configuration checks (:mod:`inferbus.actors`) and
the ranges ``inferbus up --help`` states, so the two cannot drift apart.

A module of its own, outside :mod:`inferbus.actors`, :mod:`inferbus.bus` and :mod:`inferbus.accelerators` (whose
package imports start every module of theirs, nats-py and numpy), so the CLI reads these without importing any of
them: it imports nothing. The bus and the accelerators re-export what is theirs (``MAX_TIMEOUT_MS``,
``MAX_WINDOW_US``, ``BACKENDS``).
"""

from __future__ import annotations

NATS_SUB_PENDING_MSGS_LIMIT = 512 * 1024
"""nats-py's default pending-messages limit of a subscription (``DEFAULT_SUB_PENDING_MSGS_LIMIT`` of
``nats.aio.subscription``, the same in every nats-py 2.x), written out so that this module does not import nats-py
(~60 ms on every ``inferbus`` command); tests/test_cli.py checks it against the installed nats-py."""
NATS_SUB_PENDING_BYTES_LIMIT = 128 * 1024 * 1024
"""nats-py's default pending-bytes limit of a subscription (``DEFAULT_SUB_PENDING_BYTES_LIMIT``; same note)."""

BACKENDS = ("onnxruntime", "jax", "tensorrt")
"""Backend names :func:`inferbus.accelerators.get_backend` knows (re-exported as ``inferbus.accelerators.BACKENDS``),
the choices of ``inferbus up --backends``."""
MAX_TIMEOUT_MS = 600_000.0
"""The longest time budget a request is granted, ms (10 minutes): ``Inferbus-Timeout-Ms`` values are clamped to
it, and ``--default-timeout-ms`` and the commands' ``--timeout-s`` go no higher (``inferbus.bus.headers``)."""
MAX_WINDOW_US = 1_000_000.0
"""Longest busy-polling window accepted (1 s): longer would keep a core busy through pauses no request gap needs
bridged (``inferbus.bus._busypoll.MAX_WINDOW_US``, ``--busy-poll-us``)."""

MAX_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
"""nats-server's ceiling for ``max_payload``: its configuration reference (docs.nats.io, ``max_payload``) allows
up to 64MB, and no more than ``max_pending`` (64MB by default, which the embedded server keeps)."""
MAX_HTTP_CONNECTIONS = 1000
"""The most open connections (and so request threads) of a node's HTTP port (``--http-max-connections``): each
accepted connection may hold a thread while its request runs, and more threads than this in one process is a typo
rather than a plan (put a proxy that pools connections in front)."""
MAX_HTTP_PROCESSES = 256
"""The most HTTP processes of a node (``--http-processes``): each is an OS process with its own NATS connection and
thread pool, and more than a large host has cores is a typo rather than a plan."""
MAX_NODE_PROCESSES = 1024
"""The most workers, and the most ingresses, one node starts (each is an OS process; a larger count is a typo,
and ``--ingress 99999999999999999999`` kept ``inferbus up`` busy starting processes)."""
MIN_MAX_PAYLOAD_BYTES = 64 * 1024
"""The least ``NodeConfig.nats_max_payload_bytes``: room for the actors' own messages (a ``$SRV.INFO`` answer with
every endpoint, a model list, a load report) with a margin. Chosen here, not taken from NATS."""
MAX_COUNT = 1_000_000_000
"""The largest count of requests or failures an option takes where nothing tighter bounds it (a billion):
``--mailbox-size``, ``--max-pending``, ``--min-window-requests``, ``--breaker-failures``, ``--l2-breaker-failures``,
and the rate limits and bursts (requests/s, requests). More is a typo, not a setting: a 20-digit
``--mailbox-size`` crashed every worker on serialization (MessagePack ints stop at 64 bits), and
``--rate-limit 1e300`` was a limit that limits nothing (0 is the way to say "off")."""
MAX_MAILBOX_SIZE = MAX_COUNT
"""Largest ``WorkerConfig.mailbox_size`` in requests (a 20-digit value crashed every worker on serialization)."""
MAX_PERIOD_S = 86_400
"""The longest time an option of seconds takes where nothing tighter bounds it (a day): ``--health-window-s``,
``--breaker-open-s``, ``--l2-breaker-open-s``, ``--forget-after-s`` (which also takes ``inf``, never). Longer
is no timer at all (``--breaker-open-s 1e300``: a breaker that never closes again), for which the options have
their own words where there are any (``--forget-after-s inf``)."""
MAX_HEALTH_WINDOW_S = MAX_PERIOD_S
"""Longest ``WorkerConfig.health_window_s``, seconds (a day; the least is 1 s)."""
MAX_INLINE_COMPUTE_US = 1_000_000.0
"""Largest ``WorkerConfig.inline_max_compute_us`` (1 s): a model that computes longer inline holds the worker's
event loop (its load reports, its other requests) for that long."""
MAX_CHUNK_ROWS = 2**31 - 1
"""Largest ``WorkerConfig.chunk_rows``: Triton's ``max_batch_size`` is an int32 (model_config.proto), so no
model's batch has more rows."""
MAX_L2_POOL_SIZE = 10_000
"""Most Redis connections one ingress opens for L2 lookups: Valkey's and Redis's default ``maxclients``."""
MAX_TENSOR_BYTES = 8 * MAX_MAX_PAYLOAD_BYTES
"""Largest ``IngressConfig.max_tensor_bytes`` (512 MiB): the most values one request can carry, a 64 MiB body (NATS's
ceiling) of one-byte MessagePack integers read as 8-byte elements (``data`` of an INT64 or FP64 input); shared
memory inputs are not supported, so no tensor is larger."""
MAX_BYTES_ELEMENTS = MAX_MAX_PAYLOAD_BYTES
"""Largest ``IngressConfig.max_bytes_elements``: each element of a BYTES input takes at least a byte of a body of at
most 64 MiB (NATS's ceiling)."""
MAX_DRILL_RATE_QPS = 1_000_000.0
"""The highest offered load of ``inferbus chaos run --rate``, requests/s (``chaos._options.MAX_RATE_QPS``)."""
MAX_DRILL_PROCESSES = 256
"""The most worker or ingress processes a drill starts (``chaos run --workers``, ``--ingress``;
``chaos._options.MAX_PROCESSES``)."""
MAX_GATEWAY_LATENCY_MS = 60_000.0
"""The most gateway latency or jitter a region drill injects, ms each way (``chaos run --latency-ms``)."""
MAX_REGION_HEARTBEAT_MS = 60_000
"""Longest ``region manager --heartbeat-ms`` (a minute): heartbeats exist for fast detection (~100 ms)."""
MAX_REGION_MS = 3_600_000
"""Longest ``region manager --lease-ms`` and ``--initial-wait-ms`` (an hour): a lease or a first wait longer is a
region without a primary for that long."""
MAX_BACKLOG_MSGS = NATS_SUB_PENDING_MSGS_LIMIT // 2
"""Largest ``IngressConfig.max_backlog_msgs``: half of nats-py's per-subscription pending limit, so the
ingress refuses a backlog itself long before nats-py would drop messages silently (slow consumer)."""
MAX_BACKLOG_BYTES = NATS_SUB_PENDING_BYTES_LIMIT // 2
"""Largest ``IngressConfig.max_backlog_bytes`` (half of nats-py's pending-bytes limit, same reason)."""


def binary_size(n: int) -> str:
    """``n`` bytes in the largest binary unit that divides it (``65536`` → ``"64 KiB"``), for messages and help."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def number_as_typed(value) -> str:
    """``value`` as a refusal of an option echoes it: Python's shortest exact form (``repr``: ``600.0001``, ``1e+300``,
    ``nan``, ``inf``), a float with no fraction without its ``.0`` (``601``, ``0``, ``-1``: what was typed for an
    option parsed as a float, which ``repr`` gave as ``601.0``); anything else (an int, a string), its ``repr``."""
    text = repr(value)
    return text[:-2] if isinstance(value, float) and text.endswith(".0") else text


def bound_text(x) -> str:
    """A range's end as every refusal writes it: ``86400``, ``0.5``, ``600`` (not ``600.0``); a million and up with
    thousands separators, ``1,000,000`` (``:g`` wrote ``1e+06``)."""
    return f"{x:,.15g}" if abs(x) >= 1e6 else f"{x:.15g}"


def interval(lo, hi, *, lo_open: bool = False) -> str:
    """The range ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``) as every refusal of a value out of a range with two
    ends names it, both ends given: ``must be in (0, 600] seconds, got 601``."""
    return f"{'(' if lo_open else '['}{bound_text(lo)}, {bound_text(hi)}]"

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The choices of ``inferbus up --log-level`` (and ``cluster up``'s), least severe first: the least severity of the
records the node and its actor processes write (:mod:`inferbus._logs`)."""
LOG_FORMATS = ("text", "json")
"""The choices of ``--log-format``: ``text`` (lines for people) or ``json`` (one JSON object per line)."""
