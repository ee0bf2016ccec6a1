"""An asyncio TCP proxy with named faults, for chaos drills and tests (no root needed).

One :class:`TcpProxy` listens on a local port and forwards each accepted
connection to one upstream ``(host, port)``. Faults are injected by name
(:data:`FAULTS`; an unknown name raises :class:`UnknownFault`):

* ``cut``: every matching connection is closed at once (both sides see EOF) and
  new matching connections are closed right after they are accepted, as a
  firewall that rejects would do. Heals when the fault is removed.
* ``latency``: every chunk of bytes is delayed by ``latency_ms`` (+ uniform
  ``jitter_ms``) in the chosen direction; order within a connection is kept.
* ``drop``: packet loss. At ``drop_pct=100`` (the default) a blackhole: bytes are
  read and discarded; connections stay open, so the peers only notice through
  their own timeouts (a silent partition). Below 100 % each chunk of bytes is
  "lost" with probability ``drop_pct`` and delivered again after ``rto_ms``
  (default 200 ms, Linux's minimum TCP retransmission timeout), with every later
  chunk of that direction queued behind it: that is what a TCP connection sees of
  IP packet loss (a stream proxy cannot discard bytes mid-stream without
  corrupting the protocol on top, which real loss never does).

Peers: a fault may apply to every connection or only to connections whose *peer
tag* is in ``peers``. The tag is computed by the proxy's ``classify`` function
from the first line the connecting side sends (e.g. :func:`nats_gateway_peer`
reads the gateway name from a NATS gateway ``CONNECT``), so one proxy in front
of a server can cut region A's connections while region W's pass.

Concurrency: everything runs on the loop that called :meth:`TcpProxy.start`;
fault methods must be called on that loop (they are plain synchronous methods).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "FAULTS", "Fault", "ProxyError", "ProxyStats", "TcpProxy", "UnknownFault", "make_fault", "nats_gateway_peer",
]

FAULTS = ("cut", "latency", "drop")
"""Names of the faults a proxy understands."""

_DIRECTIONS = ("both", "up", "down")
_CHUNK_BYTES = 64 * 1024
_FIRST_LINE_MAX_BYTES = 8192


class ProxyError(Exception):
    """Base of the errors of this module."""


class UnknownFault(ProxyError, ValueError):
    """A fault name that is not one of :data:`FAULTS`."""


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    Attributes:
        kind: ``"cut"``, ``"latency"`` or ``"drop"``.
        peers: peer tags the fault applies to; None = every connection (tagged or not).
        latency_ms: added delay per chunk, ms (``latency`` only, >= 0).
        jitter_ms: extra uniform random delay in [0, jitter_ms], ms (``latency`` only, >= 0).
        direction: ``"both"``, ``"up"`` (connecting side → upstream) or ``"down"`` (upstream → connecting side).
        drop_pct: ``drop`` only: per-chunk loss probability in percent, (0, 100]; 100 = blackhole.
        rto_ms: ``drop`` below 100 %: delay of a lost chunk (its retransmission), ms (> 0).
    """

    kind: str
    peers: frozenset[str] | None = None
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    direction: str = "both"
    drop_pct: float = 100.0
    rto_ms: float = 200.0

    def __post_init__(self) -> None:
        if self.kind not in FAULTS:
            raise UnknownFault(f"unknown fault {self.kind!r}; known faults: {', '.join(FAULTS)}")
        if self.direction not in _DIRECTIONS:
            raise ValueError(f"Fault.direction must be one of {_DIRECTIONS}, got {self.direction!r}")
        if self.latency_ms < 0 or self.jitter_ms < 0:
            raise ValueError("Fault.latency_ms and jitter_ms must be >= 0 ms")
        if not 0 < self.drop_pct <= 100:
            raise ValueError(f"Fault.drop_pct must be in (0, 100] percent, got {self.drop_pct!r}")
        if self.rto_ms <= 0:
            raise ValueError(f"Fault.rto_ms must be > 0 ms, got {self.rto_ms!r}")

    @property
    def blackhole(self) -> bool:
        """A ``drop`` that lets nothing through."""
        return self.kind == "drop" and self.drop_pct >= 100

    def applies(self, peer: str | None, direction: str) -> bool:
        """True when this fault affects bytes of a connection tagged ``peer`` flowing in ``direction``."""
        if self.direction != "both" and self.direction != direction:
            return False
        return self.peers is None or (peer is not None and peer in self.peers)


def make_fault(name: str, *, peers: Iterable[str] | None = None, **params) -> Fault:
    """Build a fault by name.

    Args:
        name: one of :data:`FAULTS`.
        peers: peer tags it applies to (None = all connections).
        params: ``latency_ms``, ``jitter_ms``, ``direction``, ``drop_pct``, ``rto_ms``.

    Raises:
        UnknownFault: ``name`` is not a known fault.
        ValueError: a parameter is out of range.
    """
    if name not in FAULTS:
        raise UnknownFault(f"unknown fault {name!r}; known faults: {', '.join(FAULTS)}")
    return Fault(name, frozenset(peers) if peers is not None else None, **params)


def nats_gateway_peer(first_line: bytes) -> str | None:
    """Classifier for a proxy in front of a nats-server gateway port.

    The soliciting server of a gateway connection sends ``CONNECT {json}`` whose
    ``gateway`` field names its own cluster; that name is the peer tag.
    Returns None for anything else.
    """
    if not first_line.startswith(b"CONNECT "):
        return None
    try:
        info = json.loads(first_line[8:].strip())
    except ValueError:
        return None
    gw = info.get("gateway") if isinstance(info, dict) else None
    return gw if isinstance(gw, str) else None


@dataclass(frozen=True)
class ProxyStats:
    """Counters of one proxy (a snapshot)."""

    accepted: int
    active: int
    rejected: int
    """Connections closed at accept time by a ``cut``."""
    cut: int
    """Established connections closed by a ``cut``."""
    bytes_up: int
    bytes_down: int
    dropped_bytes: int
    retransmitted: int = 0
    """Chunks delayed by a partial ``drop`` (lost, then delivered after ``rto_ms``)."""


@dataclass(eq=False)
class _Conn:
    client_w: asyncio.StreamWriter
    up_w: asyncio.StreamWriter | None = None
    peer: str | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)
    closed: bool = False

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        for w in (self.client_w, self.up_w):
            if w is not None:
                try:
                    w.transport.abort()
                except Exception:  # pragma: no cover - already closed
                    pass
        me = asyncio.current_task()
        for t in self.tasks:
            if t is not me:
                t.cancel()


class TcpProxy:
    """Forward TCP connections from a local port to ``upstream``, with injectable faults.

    Args:
        upstream: ``(host, port)`` every connection is forwarded to.
        listen_host: address to listen on (default 127.0.0.1).
        listen_port: port to listen on; 0 picks a free one (see :attr:`port` after :meth:`start`).
        name: label used in reprs and by callers to address proxies.
        labels: free-form tags (e.g. ``{"region": "A", "kind": "gateway"}``) for selecting proxies.
        classify: ``first_line -> peer tag | None``, applied to the first line (up to 8 KiB) the
            connecting side sends; None: connections carry no tag.
        connect_timeout_s: upstream connect timeout, seconds.

    Use ``async with TcpProxy(...) as p:`` or :meth:`start` / :meth:`stop`.
    """

    def __init__(self, upstream: tuple[str, int], *, listen_host: str = "127.0.0.1", listen_port: int = 0,
                 name: str = "", labels: dict[str, str] | None = None,
                 classify: Callable[[bytes], str | None] | None = None, connect_timeout_s: float = 2.0) -> None:
        self.upstream = upstream
        self.listen_host = listen_host
        self.port = listen_port
        self.name = name or f"proxy->{upstream[0]}:{upstream[1]}"
        self.labels = dict(labels or {})
        self.classify = classify
        self.connect_timeout_s = connect_timeout_s
        self.faults: list[Fault] = []
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[_Conn] = set()
        self._n = {"accepted": 0, "rejected": 0, "cut": 0, "bytes_up": 0, "bytes_down": 0, "dropped_bytes": 0,
                   "retransmitted": 0}
        self._rng = random.Random()

    def __repr__(self) -> str:
        return f"TcpProxy({self.name!r}, :{self.port} -> {self.upstream[0]}:{self.upstream[1]}, faults={self.faults})"

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> "TcpProxy":
        """Start listening; return once the port is bound."""
        self._server = await asyncio.start_server(self._on_client, self.listen_host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Stop listening and abort every connection. Idempotent."""
        if self._server is not None:
            self._server.close()
            for c in list(self._conns):
                c.abort()
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            except (asyncio.TimeoutError, Exception):
                pass
            self._server = None
        self._conns.clear()

    async def __aenter__(self) -> "TcpProxy":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def address(self) -> tuple[str, int]:
        return (self.listen_host, self.port)

    # ---- faults ------------------------------------------------------------------------------
    def inject(self, name: str, *, peers: Iterable[str] | None = None, **params) -> Fault:
        """Add the fault ``name`` (see :func:`make_fault`); a ``cut`` closes matching connections at once.

        Returns:
            The fault, to pass to :meth:`heal` later.

        Raises:
            UnknownFault: ``name`` is not one of :data:`FAULTS`.
        """
        fault = make_fault(name, peers=peers, **params)
        self.faults.append(fault)
        if fault.kind == "cut":
            for c in list(self._conns):
                if fault.applies(c.peer, "up") or fault.applies(c.peer, "down"):
                    self._n["cut"] += 1
                    c.abort()
        return fault

    def cut(self, peers: Iterable[str] | None = None) -> Fault:
        """Close matching connections now and reject new ones until healed."""
        return self.inject("cut", peers=peers)

    def latency(self, latency_ms: float, jitter_ms: float = 0.0, peers: Iterable[str] | None = None,
                direction: str = "both") -> Fault:
        """Delay matching bytes by ``latency_ms`` (+ up to ``jitter_ms``)."""
        return self.inject("latency", peers=peers, latency_ms=latency_ms, jitter_ms=jitter_ms, direction=direction)

    def drop(self, peers: Iterable[str] | None = None, direction: str = "both", drop_pct: float = 100.0,
             rto_ms: float = 200.0) -> Fault:
        """Packet loss on matching bytes: at 100 % a silent blackhole (connections stay open); below, each
        chunk is lost with probability ``drop_pct`` and retransmitted after ``rto_ms`` (order kept)."""
        return self.inject("drop", peers=peers, direction=direction, drop_pct=drop_pct, rto_ms=rto_ms)

    def heal(self, fault: Fault | None = None) -> None:
        """Remove ``fault`` (None = every fault). Cut connections stay closed; peers reconnect."""
        if fault is None:
            self.faults.clear()
        else:
            try:
                self.faults.remove(fault)
            except ValueError:
                pass

    def _find(self, kind: str, peer: str | None, direction: str) -> Fault | None:
        found = None
        for f in self.faults:
            if f.kind == kind and f.applies(peer, direction):
                if kind != "drop" or f.blackhole:
                    return f  # a blackhole wins over partial loss
                found = found or f
        return found

    @property
    def stats(self) -> ProxyStats:
        return ProxyStats(accepted=self._n["accepted"], active=len(self._conns), rejected=self._n["rejected"],
                          cut=self._n["cut"], bytes_up=self._n["bytes_up"], bytes_down=self._n["bytes_down"],
                          dropped_bytes=self._n["dropped_bytes"], retransmitted=self._n["retransmitted"])

    # ---- data path ---------------------------------------------------------------------------
    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._n["accepted"] += 1
        conn = _Conn(writer)
        if self._find("cut", None, "up"):
            self._n["rejected"] += 1
            conn.abort()
            return
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*self.upstream), self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError):
            conn.abort()
            return
        conn.up_w = up_w
        if conn.closed:  # cut while connecting
            up_w.transport.abort()
            return
        self._conns.add(conn)
        conn.tasks = [asyncio.current_task()]  # type: ignore[list-item]
        down = asyncio.create_task(self._pump(conn, up_r, writer, "down"))
        conn.tasks.append(down)
        try:
            await self._pump(conn, reader, up_w, "up")
            await asyncio.wait((down,))
        except asyncio.CancelledError:
            pass
        finally:
            conn.abort()
            self._conns.discard(conn)

    async def _pump(self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    direction: str) -> None:
        delayed: asyncio.Queue | None = None
        sender: asyncio.Task | None = None
        last_due = 0.0
        first = direction == "up" and self.classify is not None
        counter = "bytes_up" if direction == "up" else "bytes_down"
        try:
            while not conn.closed:
                if first:
                    try:
                        data = await reader.readuntil(b"\n")
                    except asyncio.LimitOverrunError:
                        data = await reader.read(_FIRST_LINE_MAX_BYTES)
                    except asyncio.IncompleteReadError as exc:
                        data = exc.partial
                    first = False
                    conn.peer = self.classify(data) if data else None
                    if self._find("cut", conn.peer, direction):
                        self._n["rejected"] += 1
                        return
                else:
                    data = await reader.read(_CHUNK_BYTES)
                if not data:
                    return
                if self._find("cut", conn.peer, direction):
                    self._n["cut"] += 1
                    return
                drop = self._find("drop", conn.peer, direction)
                if drop is not None and drop.blackhole:
                    self._n["dropped_bytes"] += len(data)
                    continue
                lost = drop is not None and self._rng.random() * 100.0 < drop.drop_pct
                self._n[counter] += len(data)
                lat = self._find("latency", conn.peer, direction)
                if lat is None and not lost and (delayed is None or delayed.empty()):
                    writer.write(data)
                    await writer.drain()
                    continue
                if delayed is None:
                    delayed = asyncio.Queue()
                    sender = asyncio.create_task(self._send_delayed(delayed, writer))
                    conn.tasks.append(sender)
                extra = 0.0
                if lat is not None:
                    extra = (lat.latency_ms + (self._rng.uniform(0, lat.jitter_ms) if lat.jitter_ms else 0.0)) / 1000.0
                if lost:
                    self._n["retransmitted"] += 1
                    extra += drop.rto_ms / 1000.0
                last_due = max(time.monotonic() + extra, last_due)
                delayed.put_nowait((last_due, data))
        except (ConnectionError, OSError, RuntimeError, asyncio.CancelledError):  # uvloop: closed transport
            pass
        finally:
            if sender is not None and delayed is not None and not conn.closed:
                # let delayed bytes out before closing, as a slow link would
                try:
                    delayed.put_nowait(None)
                    await asyncio.wait_for(asyncio.shield(sender), 5.0)
                except BaseException:
                    pass
            conn.abort()

    async def _send_delayed(self, q: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError, RuntimeError, asyncio.CancelledError):  # uvloop: closed transport
            return
