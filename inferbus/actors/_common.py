"""Pieces every actor process shares: process start-up, readiness line, error replies."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys

from ..bus import closed_on_purpose, connect, connected_server
from ..bus import headers as H
from ..bus._connect import _can_drain_apart, drain_subscription, end_drain
from ..schemas import MAX_REQUEST_ID_CHARS, InferbusError, encode_error

READY_LINE = "READY"


def set_affinity(cores: tuple[int, ...]) -> None:
    """Pin this process to ``cores`` (Linux): every thread it has now (``/proc/self/task``), so that threads they
    start later inherit it too; ignored where unsupported, and for a thread that ended meanwhile. (Linux's
    ``sched_setaffinity(0, ...)`` sets the calling thread's alone: a fresh-user trial found 2 of a pinned worker's
    4 threads, started before it pinned itself, still on every core.)"""
    if not cores or not hasattr(os, "sched_setaffinity"):
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the calling thread
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, set(cores))
        except OSError:
            pass


def serving_gc() -> None:
    """GC policy for serving: freeze what start-up allocated, collect young objects less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def announce_ready() -> None:
    """Print the readiness line the node supervisor waits for."""
    print(READY_LINE, flush=True)


def install_loop() -> None:
    """Use uvloop when available."""
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover
        pass


class StopSignal:
    """When this process was first asked to stop (SIGTERM or SIGINT; :func:`run_actor`), monotonic seconds, or None.

    Set by a Python-level signal handler, which runs between two bytecodes of the main thread even while a task
    keeps the event loop busy (nats-py's subscription task handles every message already in its buffer without
    giving the loop back: the loop's own handler, which cancels the actor, ran up to a second late behind a flood).
    A subscription callback that sees it set gives the loop a turn (:meth:`Ingress._on_infer`), and a stop measures
    its bound from it."""

    at: float | None = None


def run_actor(actor_run) -> None:
    """Run ``actor_run()`` (a coroutine function) on uvloop until it ends or SIGTERM/SIGINT arrives.

    A signal cancels the actor's main task, whose ``finally`` drains its NATS
    connection (orderly shutdown within the supervisor's shutdown timeout), and sets :attr:`StopSignal.at`.
    """
    import signal
    import time

    install_loop()
    ConnectionGuard.exit_on_close = True  # an actor process: a connection nats-py closed for good ends it

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
            loops_handler = signal.getsignal(sig)  # the loop's (it also wakes the loop through its wakeup fd)

            def on_signal(signum, frame, _then=loops_handler) -> None:
                if StopSignal.at is None:
                    StopSignal.at = time.monotonic()
                if callable(_then):
                    _then(signum, frame)

            signal.signal(sig, on_signal)
        try:
            await actor_run()
        except asyncio.CancelledError:
            pass

    asyncio.run(main())


def error_message(err: InferbusError, content_type: str | None = None,
                  request_id: str | None = None) -> tuple[dict[str, str], bytes]:
    """Headers and body of a typed error reply: NATS micro error headers, the body in the request's
    encoding (``content_type``: JSON when it says so, else msgpack) and ``Inferbus-Request-Id`` when given and
    not over :data:`~inferbus.schemas.MAX_REQUEST_ID_CHARS` (the refusal of a longer one does not echo it: the reply
    would be as large as the request, over ``max_payload`` with the error's headers)."""
    hdrs, body = encode_error(err, content_type)
    if request_id and len(request_id) <= MAX_REQUEST_ID_CHARS:
        hdrs[H.REQUEST_ID] = request_id
    return hdrs, body


async def reply_error(nc, reply: str | None, err: InferbusError, content_type: str | None = None,
                      request_id: str | None = None) -> None:
    """Publish a typed error reply (NATS micro headers + body) to ``reply``; no-op without a reply subject."""
    if not reply:
        return
    hdrs, body = error_message(err, content_type, request_id)
    await nc.publish(reply, body, headers=hdrs)


def log(msg: str, level: int = logging.WARNING, *, exc_info=None) -> None:
    """Write ``msg`` as a log record of the calling module's logger (``inferbus.actors._worker``...) at ``level``:
    WARNING by default (most lines of an actor say that something went wrong), ``logging.INFO`` for the ones that
    say what happened (a model loaded, a drain began); ``exc_info`` as :meth:`logging.Logger.log` takes it (the
    traceback then goes to the JSON format's ``exc`` field). In an actor process the records go to stderr in the
    ``--log-format`` given, at ``--log-level`` and above (:func:`inferbus._logs.configure_actor_process`); run in
    another program, to its logging (Python's last-resort handler writes WARNING and above to stderr)."""
    logging.getLogger(sys._getframe(1).f_globals.get("__name__", __name__)).log(level, msg, exc_info=exc_info)


EXIT_CONNECTION_CLOSED = 75
"""Exit status of an actor process whose NATS connection nats-py closed for good (EX_TEMPFAIL, sysexits.h)."""


class ConnectionGuard:
    """What :func:`connect_logged` does when nats-py closes a connection by itself."""

    exit_on_close = False
    """True in an actor process (:func:`run_actor` sets it): the process exits. False (actors run in another
    program's process, e.g. ``bench.pathcost`` or a test): the stderr line only."""


async def connect_logged(bus, name: str):
    """:func:`inferbus.bus.connect` for an actor process: one stderr line when the connection is lost and one
    when it is back, naming the server (``host:port``), so a process that failed over to another server of a
    spread deployment shows it in its log (nats-py does not move back by itself; docs/architecture.md).

    A connection that nats-py closes by itself (not through :func:`inferbus.bus.close_connection`:
    :func:`inferbus.bus.closed_on_purpose`) ends an actor process (:attr:`ConnectionGuard.exit_on_close`) at once,
    exit status :data:`EXIT_CONNECTION_CLOSED`,
    after one stderr line naming the server's error, so that its supervisor restarts it with a new connection.
    nats-py does not reconnect after a server ``-ERR`` such as "maximum payload exceeded": a fresh-user trial's
    ingress lived on without a connection, never restarted, and the node answered "no responders" for good."""
    holder: list = []

    async def disconnected() -> None:
        if holder and closed_on_purpose(holder[0]):  # our own close at a stop: no news
            return
        log(f"{name}: disconnected from NATS {connected_server(holder[0]) if holder else ''}".rstrip())

    async def reconnected() -> None:
        log(f"{name}: reconnected to NATS {connected_server(holder[0]) if holder else ''}".rstrip(), logging.INFO)

    async def closed() -> None:
        if holder and not closed_on_purpose(holder[0]):
            if not ConnectionGuard.exit_on_close:
                log(f"{name}: the NATS connection was closed ({holder[0].last_error!r}) and nats-py does not "
                    f"reconnect it")
                return
            log(f"{name}: the NATS connection was closed ({holder[0].last_error!r}) and nats-py does not reconnect "
                f"it; exiting (status {EXIT_CONNECTION_CLOSED}) for the supervisor to restart this process")
            os._exit(EXIT_CONNECTION_CLOSED)

    nc = await connect(bus, name=name, disconnected_cb=disconnected, reconnected_cb=reconnected, closed_cb=closed)
    holder.append(nc)
    return nc


async def supervise_loops(name: str, loops: dict, *, intensity: int = 5, period_s: float = 5.0):
    """Start an actor's long-running loops as task children of an OTP supervisor (lower level, DESIGN §7).

    Args:
        name: supervisor name (logs).
        loops: ``{child id: async callable taking no arguments}``; each runs for ever.
        intensity, period_s: more than ``intensity`` restarts in ``period_s`` seconds
            escalates: the supervisor stops the loops and ``run()`` raises
            ``IntensityExceeded``, which ends the actor process abnormally so the node
            supervisor restarts the whole process.

    Returns:
        The started :class:`~inferbus.supervisor.Supervisor`; await its ``run()``.
    """
    from ..supervisor import ChildSpec, Restart, Strategy, Supervisor, SupervisorSpec, TaskChild

    def spec(child_id: str, fn) -> ChildSpec:
        async def body(*, task_status) -> None:
            task_status.started()
            await fn()

        async def start():
            return await TaskChild.start(body, name=f"{name}:{child_id}")

        return ChildSpec(id=child_id, start=start, restart=Restart.PERMANENT, shutdown_timeout_s=1.0)

    sup = Supervisor(SupervisorSpec(strategy=Strategy.ONE_FOR_ONE, intensity=intensity, period_s=period_s),
                     [spec(k, v) for k, v in loops.items()], name=name,
                     on_child_exit=lambda cid, ex: None if ex.normal else log(f"{name}: loop {cid} exited: {ex.reason}"))
    await sup.start()
    return sup


def endpoint_subscription(svc, name: str):
    """The NATS subscription behind the nats.micro endpoint ``name`` (None, logged, if nats-py hides it)."""
    for ep in getattr(svc, "_endpoints", ()):
        if getattr(ep, "_name", None) == name and hasattr(getattr(ep, "_subscription", None), "pending_msgs"):
            return ep._subscription
    log(f"cannot see the {name!r} endpoint's subscription (nats-py internals changed): its backlog bound and "
        f"graceful drain are not applied")
    return None


def endpoint_error_counter(svc, name: str):
    """A function ``count(description)`` that counts one error reply in the ``$SRV.STATS`` of the nats.micro
    endpoint ``name`` (``num_errors``, ``last_error``), for handlers that answer errors themselves: nats.micro
    counts only handlers that raise, and ours reply with a typed error instead. A no-op, logged, if nats-py's
    endpoint no longer has those counters (its private ``_num_errors`` / ``_last_error``)."""
    for ep in getattr(svc, "_endpoints", ()):
        if getattr(ep, "_name", None) == name and isinstance(getattr(ep, "_num_errors", None), int):
            def count(description: str, ep=ep) -> None:
                ep._num_errors += 1
                ep._last_error = description
            return count
    log(f"cannot see the {name!r} endpoint's error counters (nats-py internals changed): $SRV.STATS counts no "
        f"errors for it")
    return lambda description: None


async def drain_endpoint(sub, timeout_s: float) -> None:
    """Stop ``sub`` (a micro endpoint's subscription) taking new messages and handle the ones it buffered.

    NATS's drain: the server stops delivering (UNSUB), then every message already received is handed
    to the handler before the subscription goes away (nats.micro's own ``stop`` unsubscribes at once,
    dropping them). Bounded by ``timeout_s``; errors (a closed connection) are logged, not raised.
    """
    if sub is None:
        return
    nc = getattr(sub, "_conn", None)
    if nc is None or not _can_drain_apart(nc) or not hasattr(sub, "_id"):
        try:  # nats-py's own (internals changed): its flush cancelled on the bound is nats-py's hazard
            await asyncio.wait_for(sub.drain(), max(timeout_s, 0.0))
        except Exception as exc:  # timeout, connection closed: what is left is dropped
            log(f"drain of {getattr(sub, 'subject', '?')} incomplete: {exc!r}")
        return
    # not sub.drain() under wait_for: cut short by the bound, that cancelled nats-py's flush, whose PONG then set a
    # cancelled future's result and ended the connection's read loop (InvalidStateError); and a drain cut short
    # left the subscription delivering
    task = asyncio.ensure_future(drain_subscription(nc, sub))
    try:
        done, _ = await asyncio.wait({task}, timeout=max(timeout_s, 0.0))
        if not done:
            log(f"drain of {getattr(sub, 'subject', '?')} incomplete after {timeout_s:g} s: what is left is dropped")
    finally:
        failed = await end_drain(nc, sub, task)  # forgotten: delivers nothing more, finished or not
        if failed is not None:
            log(f"drain of {getattr(sub, 'subject', '?')} failed: {failed!r}")
