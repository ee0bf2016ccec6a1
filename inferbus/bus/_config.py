"""Bus configuration: NATS connection options and the subject prefix.

Config is parsed and validated once at start-up into these frozen records and
passed explicitly; nothing below reads environment variables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

_TOKEN_RE = re.compile(r"^[A-Za-z0-9_\-]+$")

SUBJECT_TOKENS = frozenset({"infer", "models", "health", "server", "ingresses", "nodes"})
"""The public tokens inferbus puts right after a prefix (``<p>.infer.>``, ``<p>.models.>``, ...); every token
after it that starts with ``_`` is internal (``<p>._w.<id>``, ``<p>._load``, ...)."""


def prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` cannot be a deployment's subject prefix, else None.

    Each dot-separated token is letters, digits, ``_`` or ``-``. No token after the first may be one inferbus puts
    right after a prefix (:data:`SUBJECT_TOKENS`, or one starting with ``_``): a deployment on ``inferbus`` would take
    the messages of one on ``inferbus.ingresses.n1-i0`` or ``inferbus.models`` (its ``<p>.ingresses.n1-i0.infer.>``
    and ``<p>.models.>`` subscriptions match their subjects), and answer another deployment's requests (a
    fresh-user trial: ``--prefix inferbus.ingresses.n1-i0`` got the retries of the deployment on ``inferbus``).
    At most :data:`~inferbus.bus._subjects.MAX_PREFIX_BYTES` (128) characters: every subject starts with it, and the
    NATS server bounds a subject's length (:data:`~inferbus.bus._subjects.MAX_CONTROL_LINE_BYTES`)."""
    from ._subjects import MAX_PREFIX_BYTES

    if len(prefix) > MAX_PREFIX_BYTES:
        return (f"must be at most {MAX_PREFIX_BYTES} characters (every subject starts with it, and the NATS server "
                f"bounds a subject's length), got {len(prefix)}: {prefix[:40]!r}...")
    tokens = prefix.split(".")
    if not all(_TOKEN_RE.match(tok) for tok in tokens):
        return f"must be dot-separated tokens of letters, digits, '_' or '-', got {prefix!r}"
    for tok in tokens[1:]:
        if tok in SUBJECT_TOKENS or tok.startswith("_"):
            parent = ".".join(tokens[:tokens.index(tok, 1)])
            return (f"{prefix!r} has the token {tok!r}, which inferbus puts after a prefix: a deployment on prefix "
                    f"{parent!r} would take this one's messages; name it otherwise (e.g. "
                    f"{prefix.replace('.' + tok, '-' + tok.lstrip('_'), 1)!r})")
    return None


@dataclass(frozen=True)
class BusConfig:
    """How an actor connects to NATS.

    The reconnect and ping settings are chosen for fast failover: a client
    notices a dead server after ``ping_interval_s * max_outstanding_pings``
    at most and reconnects to the next server of ``servers`` at once.
    """

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    """NATS URLs, tried in order (randomized by nats-py unless ``no_randomize``)."""
    prefix: str = "inferbus"
    """First token(s) of every subject; letters, digits, ``_`` and ``-`` per token, no token after the first that
    inferbus puts after a prefix, at most 128 characters (:func:`prefix_problem`)."""
    name: str = "inferbus"
    """Client connection name, visible in the server's ``/connz``."""
    connect_timeout_s: float = 2.0
    """Per-server timeout of the first connect (TCP connect, then the server's INFO), seconds (> 0)."""
    reconnect_timeout_s: float = 0.5
    """Per-server timeout of a reconnect once connected, seconds (> 0): nats-py's ``connect_timeout`` is set to it
    after the first connect. A server that is stopped (SIGSTOP) or blackholed accepts the TCP connection and never
    sends INFO, so each such server in the list held a reconnect for ``connect_timeout_s``: a fresh-user trial froze
    a whole primary region (three servers first in the client's list) and SDK clients had no answer for 3.1-4.7 s;
    with 0.25 s, 1.35 s. Raise it for servers more than a few round trips away (TLS over a WAN)."""
    reconnect_time_wait_s: float = 0.05
    """Wait between reconnect attempts to the same server, seconds (>= 0)."""
    max_reconnect_attempts: int = -1
    """Reconnect attempts per server once connected; -1 = reconnect for ever."""
    connect_attempts: int = 3
    """Attempts per server for the *initial* connect (then ``NoServersError``), so a wrong URL or
    wrong credentials fail fast instead of retrying for ever (>= 1)."""
    ping_interval_s: float = 1.0
    """Client PING interval in seconds (> 0)."""
    max_outstanding_pings: int = 2
    """Unanswered PINGs before the connection is declared stale."""
    busy_stale_grace_s: float = 10.0
    """How long unanswered PINGs do not count while the server keeps delivering messages on the connection, seconds
    (0 = off; :func:`inferbus.bus.connect`). The PONG comes in the same stream after everything the server queued
    before it, so a process reading a backlog slower than it comes gets its PONGs late while its connection is
    alive: nats-py declared it stale and reconnected, and what the server held for it was lost (an ingress given
    30,000 requests at once lost 10,000-14,000 of them so). Past this grace the stale check applies as usual (a link
    that delivers but takes nothing more)."""
    pending_size_bytes: int = 64 * 1024 * 1024
    """Bytes buffered while reconnecting before publishes fail; also what a publish finds waiting to be written
    when it makes nats-py flush first (a forced flush: see :attr:`flush_timeout_s`)."""
    flush_timeout_s: float = 1.0
    """How long a publish waits for a forced flush (more than :attr:`pending_size_bytes` waiting to be written) before
    it goes on with its message left buffered, seconds (nats-py's ``flush_timeout``; its default waits without end).
    A connection lost while such a flush waited never finished it: 60 SDK calls of 5 MB each, their node stopped,
    waited past their budget, some for over 10 minutes (a fresh-user trial, 2026-12-05)."""
    no_randomize: bool = False
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkeys_seed: str | None = None
    """Path of an nkey seed file (``nats.connect(nkeys_seed=...)``)."""
    user_credentials: str | None = None
    """Path of a ``.creds`` file (JWT + nkey)."""
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    extra: dict = field(default_factory=dict)
    """Further keyword arguments passed through to ``nats.connect`` unchanged."""

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError("BusConfig.servers: give at least one URL such as nats://127.0.0.1:4222")
        for url in self.servers:
            problem = server_url_problem(url)
            if problem is not None:
                raise ValueError(f"BusConfig.servers: {problem}")
        if (problem := prefix_problem(self.prefix)) is not None:
            raise ValueError(f"BusConfig.prefix {problem}")
        if self.connect_timeout_s <= 0 or self.ping_interval_s <= 0:
            raise ValueError("BusConfig: connect_timeout_s and ping_interval_s must be > 0 seconds")
        if not self.reconnect_timeout_s > 0:  # NaN too
            raise ValueError("BusConfig.reconnect_timeout_s must be > 0 seconds")
        if not 0 < self.flush_timeout_s < float("inf"):  # NaN too
            raise ValueError("BusConfig.flush_timeout_s must be a finite number > 0 seconds")
        if self.connect_attempts < 1:
            raise ValueError("BusConfig.connect_attempts must be >= 1 (tries per server for the first connect)")
        if self.reconnect_time_wait_s < 0:
            raise ValueError("BusConfig.reconnect_time_wait_s must be >= 0 seconds")
        if not self.busy_stale_grace_s >= 0:  # NaN too
            raise ValueError("BusConfig.busy_stale_grace_s must be >= 0 seconds")

    def rotated(self, k: int) -> "BusConfig":
        """This config with ``servers`` rotated to start at server ``k mod n``, tried in that order.

        For spreading a node's processes over a NATS deployment's servers (``NodeConfig.spread_servers``):
        process ``k`` connects to server ``k mod n`` and keeps the others, in order, to reconnect to.
        """
        return replace(self, servers=rotate_servers(self.servers, k), no_randomize=True)

    def to_dict(self) -> dict:
        """A JSON-safe dict, used to hand the config to child processes."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["servers"] = list(self.servers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BusConfig":
        d = dict(d)
        d["servers"] = tuple(d.get("servers", cls.servers))
        return cls(**d)


def server_url_problem(url: str) -> str | None:
    """What is wrong with one NATS server URL, or None when nats-py can take it: a scheme of ``nats``, ``tls``,
    ``ws`` or ``wss`` (none given = ``nats``, as nats-py reads ``host:port``), a host, and a port that is a number
    from 1 to 65535 when given. nats-py itself raises a bare ``ValueError`` or ``nats.errors.Error`` deep in its
    connect for these (``Port out of range 0-65535``, ``invalid connect url option``)."""
    from urllib.parse import urlsplit

    shown = shown_url(url)  # never the password or token (a fresh-user trial saw them in these messages)
    try:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        port = parts.port
    except ValueError as exc:  # a port not a number or out of range, an unclosed IPv6 bracket
        if "@" in url:  # urllib's words can quote a piece of the password (a '/' in it ends the host part)
            return (f"{shown!r}: the port is not a number from 1 to 65535, or the URL is malformed (a '/', '?', '#' "
                    f"or '@' in a user name or password must be percent-encoded)")
        return f"{shown!r}: {exc}"
    if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname or port == 0:
        return f"{shown!r}: expected nats://HOST:PORT (or tls://, ws://, wss://), port 1 to 65535"
    return None


def shown_url(url: str) -> str:
    """One URL (NATS, Redis, ...) for a message or a log line, with the password or token in its user part replaced by
    ``***``: ``nats://u:***@h:4222``, ``nats://***@h:4222``, ``redis://u:***@h:6379/0``. The user part ends at the
    last ``@``, so a password holding ``@``, ``/``, ``?`` or ``#`` (malformed unless percent-encoded) is masked whole.
    A URL without a scheme, which nats-py reads as ``nats://`` (``u:p@h:4222``), is masked alike and stays
    without one. A URL without ``@`` is kept as given."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" not in rest:
        return url
    userinfo, _, host = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}{sep}{user + ':***' if colon else '***'}@{host}"


def shown_servers(servers) -> str:
    """NATS URLs for a message or a log line: comma-separated, each as :func:`shown_url` shows it (a fresh-user trial
    saw ``--nats-url nats://u:wrong@h:4222`` printed back whole in "cannot reach NATS at ...")."""
    return ", ".join(shown_url(u) for u in split_servers(servers))


def split_servers(servers) -> tuple[str, ...]:
    """NATS URLs from one comma-separated string (``--nats-url``) or a sequence, stripped, empty entries
    dropped, order kept: ``split_servers(" a, ,b") == ("a", "b")``."""
    return tuple(u.strip() for u in (servers.split(",") if isinstance(servers, str) else servers) if u.strip())


def rotate_servers(servers, k: int) -> tuple[str, ...]:
    """``servers`` (as :func:`split_servers` takes them) starting at index ``k mod n``:
    ``rotate_servers("a,b,c", 4) == ("b", "c", "a")``.

    Raises:
        ValueError: no URL in ``servers``.
    """
    urls = split_servers(servers)
    if not urls:
        raise ValueError("rotate_servers: no server URL given")
    i = k % len(urls)
    return urls[i:] + urls[:i]
