"""Open a NATS connection from a :class:`BusConfig`."""

from __future__ import annotations

import asyncio
import logging
import ssl

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


async def close_connection(nc: Client, *, drain: bool = False, drain_timeout_s: float = 2.0) -> None:
    """Close ``nc`` (after draining it when ``drain``), never raising for a connection that is already closed,
    reconnecting (its server went away), or that fails while draining: such a one is closed without draining.

    The drain is given ``drain_timeout_s`` (default 2 s), then the connection is closed without it: nats-py's drain
    ends with a flush that waits 10 s for the server's PONG, and a server that stopped at that moment never sends
    it, while the connection still looked connected (a fresh-user trial: ``Client.close()`` took 10.0 s in 6 of 12
    closes right after the server's SIGTERM). A live server answers the flush within milliseconds.

    Works around a nats-py 2.16 race (``Client._close``): the close cancels the client's reconnect task and later
    awaits the socket's close waiter (``StreamWriter.wait_closed()``); when the reconnect task was itself awaiting
    that waiter, cancelling the task cancelled the waiter (asyncio cancels the future a task awaits), so
    ``close()`` raised ``CancelledError`` although nobody had cancelled its caller. Seen once in ~1,600 closes of
    a client whose server had just stopped, and once in CI (``test_close_after_the_server_went_away_does_not_raise``).
    The connection is closed by then (its status is set first); only nats-py's disconnected and closed callbacks of
    that close are skipped. Such a ``CancelledError`` is swallowed when the calling task has no cancellation request
    (``Task.cancelling() == 0``); a real cancellation of the caller still propagates.

    Raises:
        asyncio.CancelledError: only when the calling task itself was cancelled.
    """
    if nc.is_closed:
        return
    if drain:
        try:
            await asyncio.wait_for(nc.drain(), drain_timeout_s)
            return
        except asyncio.CancelledError:
            if _cancel_requested():
                raise
        except Exception:  # reconnecting, closed, or the drain timed out (ours or nats-py's): close it below
            pass
    if not nc.is_closed:
        try:
            await nc.close()
        except asyncio.CancelledError:
            if _cancel_requested():
                raise
        except Exception:  # e.g. ConnectionResetError flushing to a server that is gone; the status is CLOSED by then
            pass
    await _reconnect_task_ended(nc)


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


async def connect(config: BusConfig, *, name: str | None = None, **callbacks) -> Client:
    """Connect to NATS with failover-friendly settings.

    Args:
        config: servers, credentials, reconnect and ping settings.
        name: connection name (defaults to ``config.name``).
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
    failures = 0

    async def error_cb(exc: Exception) -> None:
        nonlocal failures
        if not nc.is_connected and not handshake_failed.done():
            failures += 1
            if (isinstance(exc, ssl.SSLError) and len(config.servers) == 1) or \
                    failures >= len(config.servers) * config.connect_attempts:
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
    # nats-py has one attempts setting for the first connect and for reconnects; once connected,
    # switch to the reconnect policy (-1 = for ever) so a lost server is retried without end.
    nc.options["max_reconnect_attempts"] = config.max_reconnect_attempts
    return nc


def connected_server(nc) -> str:
    """``host:port`` of the NATS server ``nc`` is connected to now (nats-py's ``connected_url``); empty when
    not connected. Processes on one server give the same string when started from the same URL list."""
    url = getattr(nc, "connected_url", None) if nc is not None else None
    return getattr(url, "netloc", "") or ""
