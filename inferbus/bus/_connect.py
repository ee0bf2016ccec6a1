"""Open a NATS connection from a :class:`BusConfig`."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import ssl
import weakref

from nats.aio.client import Client
from nats.errors import NoServersError

from ._config import BusConfig


class ConnectionLost(Exception):
    """The connection carrying a request was lost before its answer came (set by :func:`fail_pending_requests`)."""


_CONNECT_SLACK_S = 2.0
"""Seconds allowed beyond ``servers × connect_attempts × (5 × connect_timeout_s + reconnect_time_wait_s)`` for a
first connect (:func:`connect`)."""


_TLS_EOF_NOTE = "returning true from eof_received() has no effect when using ssl"
"""asyncio's warning (``asyncio.sslproto``; uvloop's SSL protocol says the same) when a TLS connection's peer closes
and the stream protocol asks to keep the write side open. nats-py upgrades a connection to TLS with
``loop.start_tls`` under an ``asyncio.StreamReaderProtocol`` that was created for plain TCP and so does not know it
runs over TLS (it answers True); the close is handled all the same. Printed on stderr at every stop of a TLS
connection, it told a user nothing: :func:`connect` filters out exactly this message."""


class _DropTlsEofNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != _TLS_EOF_NOTE


def _quiet_tls_eof_note() -> None:
    """Install the filter of :data:`_TLS_EOF_NOTE` on the ``asyncio`` logger, once per process."""
    logger = logging.getLogger("asyncio")
    if not any(isinstance(f, _DropTlsEofNote) for f in logger.filters):
        logger.addFilter(_DropTlsEofNote())


def fail_pending_requests(nc: Client, reason: str = "connection to the NATS server lost") -> int:
    """Fail every request in flight on ``nc`` at once with :class:`ConnectionLost`.

    nats-py does not fail a request whose connection is lost: it waits out its timeout, although
    the reply can never come (the reply subscription belonged to the old connection's server).
    Call this from ``disconnected_cb`` so callers can retry on the new connection at once.

    Reaches into nats-py's response map (``Client._resp_map``, new-style requests, which JetStream
    and KV calls use too); if a future nats-py renames it, requests simply wait for their timeout as
    before.

    Returns:
        The number of requests failed.
    """
    n = 0
    for fut in list(getattr(nc, "_resp_map", {}).values()):
        if not fut.done():
            fut.set_exception(ConnectionLost(reason))
            fut.exception()  # retrieved: a future whose caller already gave up logs no "never retrieved" at exit
            n += 1
    return n


def _cancel_requested() -> bool:
    """Whether the running task has a cancellation request pending (``Task.cancelling()``, Python 3.11+)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


_CLOSED_ON_PURPOSE: weakref.WeakSet = weakref.WeakSet()
"""Connections :func:`close_connection` was asked to close: :func:`closed_on_purpose` tells them from connections
nats-py closed by itself."""


def closed_on_purpose(nc: Client) -> bool:
    """Whether ``nc`` was closed (or is being closed) by :func:`close_connection`, not by nats-py itself.

    nats-py closes a connection for good, without reconnecting, when the server answers ``-ERR`` with anything but a
    stale connection or a permissions error (``Client._process_err``), e.g. after a publish over the server's
    ``max_payload`` that nats-py let through (it counts the payload, not the headers). A process whose connection
    went that way serves nothing more; its ``closed_cb`` can tell it from its own close with this."""
    return nc in _CLOSED_ON_PURPOSE


async def close_connection(nc: Client, *, drain: bool = False, drain_timeout_s: float = 2.0,
                           close_timeout_s: float | None = None) -> None:
    """Close ``nc`` (after draining it when ``drain``), never raising for a connection that is already closed,
    reconnecting (its server went away), or that fails while draining: such a one is closed without draining.

    The drain (:func:`_drain`) takes nothing new on any subscription (UNSUB), lets the callbacks handle what their
    subscriptions had received, and makes sure what the connection wrote reached the server (a PING/PONG round
    trip), all within ``drain_timeout_s`` (default 2 s); then the connection is closed, drained or not. A drain
    cut short (its bound, or a cancellation of the caller) leaves nothing of its own behind. Not nats-py's
    ``Client.drain()`` under ``asyncio.wait_for``, as before: cut short, that one left its gather of the
    subscriptions' drains unretrieved (asyncio logged ``_GatheringFuture exception was never retrieved``), and it
    ends with ``flush()`` waiting 10 s for a PONG, which a server stopping at that moment never sends (a fresh-user
    trial: ``Client.close()`` took 10.0 s in 6 of 12 closes right after the server's SIGTERM). When the nats-py
    internals :func:`_drain` uses are missing, nats-py's ``Client.drain()`` is used with its own ``drain_timeout``
    option set to ``drain_timeout_s`` (it then ends itself and retrieves its gather), never cancelled.

    Works around a nats-py 2.16 race (``Client._close``): the close cancels the client's reconnect task and later
    awaits the socket's close waiter (``StreamWriter.wait_closed()``); when the reconnect task was itself awaiting
    that waiter, cancelling the task cancelled the waiter (asyncio cancels the future a task awaits), so
    ``close()`` raised ``CancelledError`` although nobody had cancelled its caller. Seen once in ~1,600 closes of
    a client whose server had just stopped, and once in CI (``test_close_after_the_server_went_away_does_not_raise``).
    The connection is closed by then (its status is set first); only nats-py's disconnected and closed callbacks of
    that close are skipped. Such a ``CancelledError`` is swallowed when the calling task has no cancellation request
    (``Task.cancelling() == 0``); a real cancellation of the caller still propagates.

    Args:
        nc: the connection.
        drain: drain before closing (default False: close at once; what is buffered for writing is still sent).
        drain_timeout_s: bound of the drain (s, default 2.0).
        close_timeout_s: bound of nats-py's ``Client.close()`` (s); default None, unbounded (it is quick unless the
            server's socket takes nothing more, e.g. a blackholed path with a full send buffer). Past it the
            connection is left closed (its status) with its socket to the garbage collector.

    Raises:
        asyncio.CancelledError: only when the calling task itself was cancelled. A cancellation during the drain
            ends the drain at once; the connection is still closed, then the cancellation is raised.
    """
    _CLOSED_ON_PURPOSE.add(nc)
    if nc.is_closed:
        return
    cancelled: asyncio.CancelledError | None = None
    if drain and nc.is_connected and not nc.is_draining:
        try:
            if _can_drain_apart(nc):
                await _drain(nc, drain_timeout_s)
            else:
                await _nats_py_drain(nc, drain_timeout_s)
        except asyncio.CancelledError as exc:
            if _cancel_requested():
                cancelled = exc  # close all the same, then raise it
        except Exception:  # reconnecting, closed meanwhile: close it below
            pass
    if not nc.is_closed:
        try:
            if close_timeout_s is None:
                await nc.close()
            else:
                await asyncio.wait_for(nc.close(), close_timeout_s)
        except asyncio.CancelledError as exc:
            if _cancel_requested() and cancelled is None:
                cancelled = exc
        except Exception:  # e.g. ConnectionResetError flushing to a server that is gone, or close_timeout_s passed;
            pass  # the status is CLOSED by then
    await _reconnect_task_ended(nc)
    if cancelled is not None:
        raise cancelled


def _can_drain_apart(nc: Client) -> bool:
    """Whether nats-py has the internals :func:`_drain` uses (checked at 2.16)."""
    return all(hasattr(nc, a) for a in ("_subs", "_send_unsubscribe", "_send_ping", "_remove_sub", "_flush_queue",
                                        "_flusher_task", "_flush_pending")) and all(
        hasattr(sub, a) for sub in nc._subs.values() for a in ("_id", "_cb", "_pending_queue", "_stop_processing"))


async def _drain(nc: Client, timeout_s: float) -> bool:
    """NATS's drain of the whole connection within ``timeout_s``; whether it finished. Does not close ``nc``.

    1. Every subscription is unsubscribed (UNSUB), then a PING is sent after it (:func:`_round_trip`): its PONG
       comes after every message the server sent before the UNSUBs, so once it is back nothing more can come, and
       the subscriptions are forgotten (``Client._remove_sub``: a reconnect does not subscribe them again).
    2. Each subscription with a callback is waited for until its buffer is empty and its callback returned (its
       queue's ``join()``); a subscription read by ``next_msg`` or an iterator is not waited for.
    3. A last round trip: what the callbacks published reached the server.
    The subscriptions' message tasks are stopped at the end, finished or not (a callback still running is
    cancelled, as ``Client.close()`` does).

    Every wait is an ``asyncio.wait`` on futures this function owns or leaves to nats-py: nothing of nats-py's is
    cancelled, and the PONG's future is left to the PONG (``nc.flush(timeout)`` cancels it on its timeout, and
    nats-py 2.16 then sets the result of that cancelled future when the PONG comes, which raises
    ``InvalidStateError`` in its read loop and ends it). The drain gives up (False) as soon as the connection is no
    longer connected or has reconnected (its PONG is lost then).

    Cancellation: the drain ends at once, its own tasks cancelled and retrieved; the cancellation is raised.
    """
    loop = asyncio.get_running_loop()
    until = loop.time() + max(timeout_s, 0.0)
    reconnects = nc.stats["reconnects"]
    subs = list(nc._subs.values())
    forgotten: list = []
    joins: list[asyncio.Future] = []
    try:
        for sub in subs:
            await nc._send_unsubscribe(sub._id)
        if not await _round_trip(nc, until, reconnects):
            return False
        for sub in subs:
            nc._remove_sub(sub._id)
            forgotten.append(sub)
        joins = [asyncio.ensure_future(sub._pending_queue.join()) for sub in subs
                 if sub._cb is not None and sub._pending_queue is not None]
        if joins and not await _until(nc, joins, until, reconnects):
            return False
        return await _round_trip(nc, until, reconnects)
    finally:
        for sub in forgotten:  # no longer in nc._subs: Client.close() would not stop their tasks
            sub._stop_processing()
        for j in joins:
            j.cancel()
        if joins:
            await asyncio.gather(*joins, return_exceptions=True)


async def drain_subscription(nc: Client, sub, poll_s: float = 0.02) -> None:
    """UNSUB ``sub`` and return once every request the server delivered to it has been handled.

    A PING follows the UNSUB once nats-py has written it (:func:`_round_trip`: nats-py writes
    a PING at once, ahead of what waits in its buffer): its PONG comes after every message the server sent before
    the UNSUB, so once it is back nothing more can come for ``sub``, which is then forgotten
    (:meth:`Client._remove_sub`), and what its buffer holds is all there is (its ``queue.join()``). The PONG's future
    is never cancelled (``nc.flush(timeout)`` cancels it on its timeout, and nats-py 2.16 then sets that cancelled
    future's result when the PONG comes, which raises ``InvalidStateError`` in its read loop and ends it). A
    reconnect meanwhile (the server dropped a slow consumer, or nats-py found the connection stale because its own
    PINGs waited behind a flood) loses the PING and subscribes ``sub`` again, as nats-py does with every subscription
    it still has: UNSUB and PING are then sent again. A closed connection delivers nothing more: only the buffer is
    waited for.

    Unbounded: the caller bounds it (``asyncio.wait`` on its task, then cancels it: nothing of nats-py's is cancelled).
    Uses nats-py internals (:func:`_can_drain_apart`)."""
    while not nc.is_closed:
        if not nc.is_connected:  # reconnecting: what it writes now may go nowhere
            await asyncio.sleep(poll_s)
            continue
        reconnects = nc.stats["reconnects"]
        try:
            await nc._send_unsubscribe(sub._id)
        except Exception:  # the socket went away under it: once reconnected, again
            await asyncio.sleep(poll_s)
            continue
        if await _round_trip(nc, math.inf, reconnects):  # until the PONG, a reconnect or the close
            break
        await asyncio.sleep(poll_s)
    nc._remove_sub(sub._id)
    await sub._pending_queue.join()


async def end_drain(nc: Client, sub, drain: asyncio.Future) -> BaseException | None:
    """End a :func:`drain_subscription` task ``drain``, finished or not: cancel and retrieve it, forget ``sub``
    (``Client._remove_sub``: nothing more is delivered to it, and a reconnect does not subscribe it again), stop its
    message task (a callback still running is cut short) and send its UNSUB again (a reconnect during the drain may
    have subscribed it anew). Returns the drain's exception, None when it finished or was cancelled. Never raises
    for a connection gone."""
    drain.cancel()
    (outcome,) = await asyncio.gather(drain, return_exceptions=True)
    nc._remove_sub(sub._id)
    sub._stop_processing()
    try:
        await nc._send_unsubscribe(sub._id)
    except Exception:
        pass
    return outcome if isinstance(outcome, Exception) else None


async def _until(nc: Client, futures, until: float, reconnects: int, poll_s: float = 0.05) -> bool:
    """Wait until every one of ``futures`` is done, ``until`` (the loop's clock) passes, or ``nc`` stops being
    connected or reconnects (``reconnects``: its count before); whether they all are done. Cancels none."""
    loop = asyncio.get_running_loop()
    pending = {f for f in futures if not f.done()}
    while pending and nc.is_connected and nc.stats["reconnects"] == reconnects:
        left = until - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(left, poll_s))
    return not pending


async def _round_trip(nc: Client, until: float, reconnects: int) -> bool:
    """Whether the server answered a PING sent after all ``nc`` had buffered, by ``until`` (the loop's clock).

    What is buffered is written first (a future handed to nats-py's flusher task, set once it has written): nats-py
    writes a PING to the socket at once while other commands (an UNSUB, a publish) wait in its buffer for the
    flusher, so its own ``flush()`` can be answered before the server has seen them. The PONG's future is left to
    the PONG, never cancelled (see :func:`_drain`). False, not raised, for a connection closed or reconnecting."""
    loop = asyncio.get_running_loop()
    if not nc.is_connected:
        return False
    try:
        if nc._flusher_task is None or nc._flusher_task.done():
            await nc._flush_pending()  # nats-py writes inline then
        else:
            written = loop.create_future()
            put = asyncio.ensure_future(nc._flush_queue.put(written))  # waits only when the flusher's queue is full
            try:
                for step in (put, written):
                    if not await _until(nc, [step], until, reconnects):
                        return False
            finally:
                put.cancel()  # done by then, unless given up on
        pong = loop.create_future()
        await nc._send_ping(pong)
    except Exception:  # the socket went away under it
        return False
    return await _until(nc, [pong], until, reconnects)


async def _nats_py_drain(nc: Client, timeout_s: float) -> None:
    """nats-py's ``Client.drain()`` (closes ``nc``), bounded by its own ``drain_timeout`` option, never cancelled.

    On its timeout nats-py cancels its gather of the subscriptions' drains and retrieves it; cancelled from outside,
    it would leave that gather unretrieved. So a cancellation of the caller is held until the drain ends (its
    bound, plus its last flush: at most 10 s more when the server does not answer), then raised."""
    nc.options["drain_timeout"] = max(timeout_s, 0.001)
    task = asyncio.ensure_future(nc.drain())
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = exc
    if not task.cancelled():
        task.exception()  # retrieved; the caller closes what is left
    if cancelled is not None:
        raise cancelled


async def _reconnect_task_ended(nc: Client, bound_s: float = 1.0) -> None:
    """Wait (at most ``bound_s``) until nats-py's reconnect task of the closed ``nc`` has ended, cancelling it again
    while it runs: nats-py's close cancels it without waiting, and a cancel that lands as a connect attempt completes
    is lost (Python 3.11's ``wait_for``), so the task went on trying and kept ``asyncio.run()`` from returning (a
    fresh-user trial: 3 of ~24 closes right after the server's SIGTERM, once for over 60 s)."""
    task = getattr(nc, "_reconnection_task", None)  # nats-py's attribute; absent in another version: nothing to do
    deadline = asyncio.get_running_loop().time() + bound_s
    while task is not None and not task.done() and asyncio.get_running_loop().time() < deadline:
        task.cancel()
        await asyncio.wait({task}, timeout=0.05)


async def connect(config: BusConfig, *, name: str | None = None,
                  connect_failures: list[tuple[str, BaseException]] | None = None, **callbacks) -> Client:
    """Connect to NATS with failover-friendly settings.

    Args:
        config: servers, credentials, reconnect and ping settings.
        name: connection name (defaults to ``config.name``).
        connect_failures: when given, each failed try of the first connect is appended as ``("host:port",
            error)`` (the server it was made to, without credentials; ``"?"`` where nats-py did not say), so a
            caller can name every server's cause, not only the last (nats-py's ``error_cb`` gets the error alone).
        callbacks: ``error_cb``, ``disconnected_cb``, ``reconnected_cb``, ``closed_cb``.

    Returns:
        A connected ``nats.aio.client.Client``.

    Raises:
        ImportError: ``nkeys_seed`` or ``user_credentials`` is set and the ``nkeys`` package is missing
            (the message says to install ``inferbus[nkeys]``).
        nats.errors.NoServersError: no server in ``config.servers`` accepted the
            connection within ``connect_attempts`` tries each (unreachable, or
            credentials refused: the cause is passed to ``error_cb``), or the tries did not end within
            their bound (a TLS handshake that keeps failing, e.g. a certificate that does not verify).
    """
    kwargs: dict = dict(
        servers=list(config.servers),
        name=name or config.name,
        connect_timeout=config.connect_timeout_s,
        reconnect_time_wait=config.reconnect_time_wait_s,
        max_reconnect_attempts=config.connect_attempts,
        ping_interval=config.ping_interval_s,
        max_outstanding_pings=config.max_outstanding_pings,
        pending_size=config.pending_size_bytes,
        flush_timeout=config.flush_timeout_s,
        dont_randomize=config.no_randomize,
        allow_reconnect=True,
    )
    if config.user is not None:
        kwargs["user"] = config.user
        kwargs["password"] = config.password
    if config.token is not None:
        kwargs["token"] = config.token
    if config.nkeys_seed is not None or config.user_credentials is not None:
        try:
            import nkeys  # noqa: F401  (nats-py signs the server's nonce with it)
        except ImportError:
            raise ImportError("NKey and .creds authentication need the nkeys package: "
                              "pip install 'inferbus[nkeys]'") from None
    if config.nkeys_seed is not None:
        kwargs["nkeys_seed"] = config.nkeys_seed
    if config.user_credentials is not None:
        kwargs["user_credentials"] = config.user_credentials
    if config.tls_ca_file or config.tls_cert_file:
        ctx = ssl.create_default_context(cafile=config.tls_ca_file)
        if config.tls_cert_file:
            ctx.load_cert_chain(config.tls_cert_file, config.tls_key_file)
        kwargs["tls"] = ctx
    if "tls" in kwargs or any(str(u).startswith("tls://") for u in config.servers):
        _quiet_tls_eof_note()

    async def _quiet_error(exc: Exception) -> None:  # nats-py logs noisily by default
        pass

    kwargs.setdefault("error_cb", _quiet_error)
    kwargs.update(callbacks)
    kwargs.update(config.extra)
    nc = Client()
    # nats-py's first connect is bounded by its attempts, except when a TLS handshake fails (e.g. the server's
    # certificate does not verify): then it retries without end (nats-py 2.16; seen by a fresh-user trial, the
    # CLI hung until killed). With one server such a failure ends the connect at once (it is reported to
    # error_cb, which names it); in any case the connect is bounded by what its attempts may take (each can wait
    # connect_timeout_s for the socket, the INFO, the TLS upgrade, the first op and the PONG).
    bound_s = len(config.servers) * config.connect_attempts * (
        5 * config.connect_timeout_s + config.reconnect_time_wait_s) + _CONNECT_SLACK_S
    # nats-py tries each server until its failures exceed max_reconnect_attempts, that is that many times plus one
    # (and 0 means for ever), so the first connect ends here after connect_attempts failures per server: a
    # fresh-user trial timed connect_timeout_s=0.5, connect_attempts=1 at 2.06 s, two tries and a wait
    handshake_failed = asyncio.get_running_loop().create_future()
    user_error_cb = kwargs["error_cb"]
    tries_failed: set = set()

    async def error_cb(exc: Exception) -> None:
        if not handshake_failed.done() and not nc.is_connected:  # the first connect's tries (done once it ends)
            # one failed try can be reported twice: a server that refuses the credentials sends
            # 'Authorization Violation', then closing the socket it reset reports ECONNRESET. Counted as two, they
            # ended the connect before the next server was tried (26 of 40 connects to [refusing, good] failed).
            server, tried = _tried_server(nc)
            if tried not in tries_failed:
                tries_failed.add(tried)
                if connect_failures is not None:
                    connect_failures.append((server, exc))
            if (isinstance(exc, ssl.SSLError) and len(config.servers) == 1) or \
                    len(tries_failed) >= len(config.servers) * config.connect_attempts:
                handshake_failed.set_result(exc)
        await user_error_cb(exc)

    kwargs["error_cb"] = error_cb
    connecting = asyncio.ensure_future(nc.connect(**kwargs))
    try:
        await asyncio.wait({connecting, handshake_failed}, timeout=bound_s, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        connecting.cancel()
        raise
    if not connecting.done():  # the bound passed, or a handshake failed that no retry would mend
        connecting.cancel()
        try:
            await asyncio.wait_for(nc.close(), 1.0)
        except BaseException:  # closing a client that never connected: nothing else to release
            pass
        raise NoServersError() from None
    connecting.result()  # nats-py's own error (NoServersError, ...) when it gave up
    handshake_failed.cancel()  # connected: a later reconnect's failures are not the first connect's tries
    # nats-py has one attempts setting for the first connect and for reconnects; once connected,
    # switch to the reconnect policy (-1 = for ever) so a lost server is retried without end.
    nc.options["max_reconnect_attempts"] = config.max_reconnect_attempts
    nc.options["connect_timeout"] = config.reconnect_timeout_s  # a stopped server is given up in that long
    if config.busy_stale_grace_s > 0 and hasattr(nc, "_pings_outstanding") and isinstance(
            getattr(nc, "stats", None), dict) and "in_msgs" in nc.stats:
        # held on the client (a task only the loop references can be collected); ends when the client closes
        nc._inferbus_busy_keepalive = asyncio.ensure_future(
            _busy_keepalive(nc, config.ping_interval_s, config.busy_stale_grace_s))
    return nc


async def _busy_keepalive(nc, ping_interval_s: float, grace_s: float) -> None:
    """While the server keeps delivering messages on ``nc``, its unanswered PINGs do not count (for at most
    ``grace_s`` seconds in a row): nats-py's count (``_pings_outstanding``, nats-py 2.x; checked at 2.16) is set back
    to 0 twice per ping interval when messages arrived since the last look. Each PING's PONG comes after everything
    the server queued before it, so behind a backlog it comes late on a live connection (:attr:`BusConfig.busy_stale_grace_s`).
    A dead server delivers nothing, and is found stale as before."""
    loop = asyncio.get_running_loop()
    period_s = max(ping_interval_s / 2.0, 0.01)
    last = nc.stats["in_msgs"]
    since = None
    while not nc.is_closed:
        await asyncio.sleep(period_s)
        n = nc.stats["in_msgs"]
        if nc._pings_outstanding and n != last and nc.is_connected:
            now = loop.time()
            if since is None:
                since = now
            if now - since <= grace_s:
                nc._pings_outstanding = 0
        elif not nc._pings_outstanding:
            since = None  # a PONG came: the next grace starts afresh
        last = n


_unknown_tries = itertools.count()


def _tried_server(nc) -> tuple[str, tuple]:
    """``("host:port", try)`` for a failed connect try nats-py reports: the server it was made to (the pool's server
    stamped last: nats-py 2.x stamps ``Srv.last_attempt`` as a try starts and reports its failure to ``error_cb``
    before the next try) and a key that is the same for every report of that one try (the server and its stamp).
    ``("?", unique)`` when the pool is not there to read (another nats-py): each report then counts as a try."""
    try:
        srv = max((s for s in nc._server_pool if s.last_attempt is not None), key=lambda s: s.last_attempt)
        return f"{srv.uri.hostname}:{srv.uri.port}", (id(srv), srv.last_attempt)
    except (AttributeError, TypeError, ValueError):
        return "?", ("?", next(_unknown_tries))


def connected_server(nc) -> str:
    """``host:port`` of the NATS server ``nc`` is connected to now (nats-py's ``connected_url``, without its user
    part); empty when not connected. Processes on one server give the same string when started from the same URL list."""
    url = getattr(nc, "connected_url", None) if nc is not None else None
    # without a user and password or token in the URL (a fresh-user trial found the password in every health
    # reply's nats_server and in the reconnect log lines)
    return (getattr(url, "netloc", "") or "").rsplit("@", 1)[-1]
