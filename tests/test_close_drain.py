"""``close_connection(nc, drain=True)`` (:mod:`inferbus.bus._connect`) on a real nats-server: a drain cut short (its
bound, a cancellation of the caller, a server that stopped answering) closes the connection within its bound and
leaves asyncio nothing to report. Before, it wrapped nats-py's ``Client.drain()`` in ``asyncio.wait_for``: cut
short, that one left its gather of the subscriptions' drains unretrieved (``_GatheringFuture exception was never
retrieved``), and against a SIGSTOPped server it took 10.5 s for a 0.5 s bound (its last flush waits 10 s)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time

import nats
import pytest

from conftest import wait_micro_service
from inferbus.bus import _connect, close_connection

N = 100
SLOW_S = 0.05
"""Each message's callback takes this long: ``N`` of them take 5 s, far over the drains cut short here."""
SLACK_S = 1.5
"""On top of a bound (a shared 2-core box)."""

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class _Reports:
    """What the running loop's exception handler is given (``never retrieved`` and the like), while installed."""

    def __init__(self) -> None:
        self.seen: list = []

    def __enter__(self) -> "_Reports":
        self.loop = asyncio.get_running_loop()
        self.old = self.loop.get_exception_handler()
        self.loop.set_exception_handler(lambda lp, ctx: self.seen.append(ctx.get("message")))
        return self

    def __exit__(self, *exc) -> None:
        self.loop.set_exception_handler(self.old)

    async def settled(self) -> list:
        """Collect garbage (a future never retrieved is reported when it is collected) and return the reports."""
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0.05)
        return self.seen


async def _nothing(msg) -> None:
    pass


async def _fill(url: str, subject: str, payload: bytes, sub) -> None:
    """Publish ``N`` messages on ``subject`` from a connection of its own and wait (10 s at most) until ``sub`` (a
    subscription with a slow callback) holds at least half of them in its buffer."""
    pub = await nats.connect(url)
    for _ in range(N):
        await pub.publish(subject, payload)
    await pub.flush()
    await pub.close()
    deadline = time.monotonic() + 10
    while sub._pending_queue.qsize() < N // 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


async def _backlogged(url: str, handled: list, n: int = N, reply: str = ""):
    """A connection with a subscription whose callback takes ``SLOW_S`` a message and ``n`` messages received for it
    (the callback has begun the first); each callback answers the message's reply subject after its wait."""
    nc = await nats.connect(url)

    async def slow(msg):
        await asyncio.sleep(SLOW_S)
        handled.append(msg.data)
        if msg.reply:
            await nc.publish(msg.reply, msg.data)

    sub = await nc.subscribe("slow", cb=slow)
    pub = await nats.connect(url)
    for i in range(n):
        await pub.publish("slow", str(i).encode(), reply=reply)
    await pub.flush()
    deadline = time.monotonic() + 10
    while sub._pending_queue.qsize() < n - 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await pub.close()
    return nc


async def test_a_drain_cut_short_by_its_bound_closes_and_leaves_no_future_unretrieved(nats_server):
    with _Reports() as reports:
        handled: list = []
        nc = await _backlogged(nats_server.url, handled)
        t0 = time.monotonic()
        await close_connection(nc, drain=True, drain_timeout_s=0.3)
        took = time.monotonic() - t0
        assert nc.is_closed
        assert took < 0.3 + SLACK_S, took
        assert len(handled) < N  # the bound cut it short
        del nc
        seen = await reports.settled()
        assert seen == [], seen


async def test_a_drain_cancelled_closes_then_raises_and_leaves_no_future_unretrieved(nats_server):
    """A second stop signal: the caller is cancelled during the drain. The drain ends at once, the connection is
    closed, the cancellation is raised."""
    with _Reports() as reports:
        handled: list = []
        nc = await _backlogged(nats_server.url, handled)
        task = asyncio.ensure_future(close_connection(nc, drain=True, drain_timeout_s=30))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - t0 < SLACK_S
        assert nc.is_closed
        assert len(handled) < N
        del nc, task
        seen = await reports.settled()
        assert seen == [], seen


async def test_a_drain_with_time_enough_handles_what_was_received_and_its_replies_arrive(nats_server):
    """Everything received before the UNSUB is handled, and what the callbacks published reaches the server before
    the close."""
    with _Reports() as reports:
        asker = await nats.connect(nats_server.url)
        answers: list = []

        async def answered(msg):
            answers.append(msg.data)

        await asker.subscribe("answers", cb=answered)
        await asker.flush()
        handled: list = []
        nc = await _backlogged(nats_server.url, handled, n=20, reply="answers")
        await close_connection(nc, drain=True, drain_timeout_s=20)
        assert nc.is_closed
        assert len(handled) == 20
        deadline = time.monotonic() + 10
        while len(answers) < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert sorted(answers, key=int) == [str(i).encode() for i in range(20)]
        await asker.close()
        seen = await reports.settled()
        assert seen == [], seen


async def test_a_drain_against_a_server_that_stopped_answering_ends_within_its_bound(nats_server):
    """The server is SIGSTOPped (its socket stays open, nothing is answered): the drain's round trip never comes
    back; the close comes at the drain's bound. Before: 10.5 s for a 0.5 s bound (nats-py's drain swallowed the
    cancellation of ``wait_for`` and went on to its last flush, 10 s) and a gather never retrieved."""
    with _Reports() as reports:
        nc = await nats.connect(nats_server.url)
        await nc.subscribe("a", cb=_nothing)
        await nc.flush()
        os.kill(nats_server.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            await close_connection(nc, drain=True, drain_timeout_s=0.5)
            took = time.monotonic() - t0
        finally:
            os.kill(nats_server.proc.pid, signal.SIGCONT)
        assert nc.is_closed
        assert took < 0.5 + SLACK_S, took
        del nc
        seen = await reports.settled()
        assert seen == [], seen


async def test_the_fallback_on_nats_py_own_drain_is_bounded_by_its_drain_timeout(nats_server, monkeypatch):
    """Where nats-py's internals are missing, its ``Client.drain()`` is used with its own ``drain_timeout``: cut
    short by that bound, it retrieves its gather; a cancellation of the caller waits for it, then is raised."""
    monkeypatch.setattr(_connect, "_can_drain_apart", lambda nc: False)
    with _Reports() as reports:
        handled: list = []
        nc = await _backlogged(nats_server.url, handled)
        t0 = time.monotonic()
        await close_connection(nc, drain=True, drain_timeout_s=0.3)
        assert time.monotonic() - t0 < 0.3 + SLACK_S
        assert nc.is_closed
        assert len(handled) < N

        nc = await _backlogged(nats_server.url, handled)
        task = asyncio.ensure_future(close_connection(nc, drain=True, drain_timeout_s=0.5))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert nc.is_closed
        del nc, task
        seen = await reports.settled()
        assert seen == [], seen


async def test_a_region_manager_stopped_with_a_backlog_stops_within_its_bound(nats_server, monkeypatch):
    """A region manager whose heartbeat callback is slow (``SLOW_S`` each, ``N`` waiting) is stopped (its
    SIGTERM): its connection's drain is cut at 2 s, the close follows, and asyncio reports nothing. Before, its
    ``asyncio.wait_for(nc.drain(), 2.0)`` left nats-py's gather unretrieved."""
    from inferbus.actors._region import RegionConfig, RegionManager
    from inferbus.bus import BusConfig, Subjects

    async def slow_hb(self, msg) -> None:
        await asyncio.sleep(SLOW_S)

    monkeypatch.setattr(RegionManager, "_on_hb", slow_hb)
    with _Reports() as reports:
        prefix = "tcdr"
        m = RegionManager(RegionConfig(region="A", bus=BusConfig(servers=(nats_server.url,), prefix=prefix),
                                       bucket="cdr", replicas=1, initial_primary=True))
        task = asyncio.create_task(m.run())
        deadline = time.monotonic() + 30
        while not m.is_primary():
            assert time.monotonic() < deadline and not task.done(), task
            await asyncio.sleep(0.02)
        subject = Subjects(prefix).region_heartbeats
        hb = next(s for s in m.nc._subs.values() if s.subject == subject)
        await _fill(nats_server.url, subject, b"not a heartbeat", hb)
        t0 = time.monotonic()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        took = time.monotonic() - t0
        assert m.nc.is_closed
        assert took < 2.0 + SLACK_S, took
        del m, task, hb
        seen = await reports.settled()
        assert seen == [], seen


async def test_an_aggregator_stop_cancelled_again_during_its_drain_leaves_no_future_unretrieved(nats_server,
                                                                                                 monkeypatch):
    """The aggregator's stop drains its connection; a second SIGTERM (its task cancelled again) during that drain
    ends it at once, the connection is closed and asyncio reports nothing. A slow subscription with a backlog is
    put on the aggregator's connection so that its drain lasts. Before, its bare ``nc.drain()`` swallowed the
    second cancellation, left nats-py's gather unretrieved and went on to its flush."""
    from inferbus.actors import _aggregator
    from inferbus.actors._config import AggregatorConfig
    from inferbus.bus import BusConfig

    monkeypatch.setattr(_aggregator, "serving_gc", lambda: None)  # no gc.freeze() in the test process
    monkeypatch.setattr(_aggregator, "announce_ready", lambda: None)
    with _Reports() as reports:
        agg = _aggregator.Aggregator(AggregatorConfig(aggregator_id="a1",
                                                      bus=BusConfig(servers=(nats_server.url,), prefix="tcda")))
        task = asyncio.create_task(agg.run())
        probe = await nats.connect(nats_server.url)
        await wait_micro_service(probe, "inferbus-aggregator", task)
        await probe.close()

        async def slow(msg) -> None:
            await asyncio.sleep(SLOW_S)

        sub = await agg.nc.subscribe("tcda.slow", cb=slow)
        await _fill(nats_server.url, "tcda.slow", b"x", sub)
        t0 = time.monotonic()
        task.cancel()
        await asyncio.sleep(0.3)  # in the drain (1 s bound, the backlog would take 5 s)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        took = time.monotonic() - t0
        assert agg.nc.is_closed
        assert took < 0.3 + SLACK_S, took
        del agg, task, sub
        seen = await reports.settled()
        assert seen == [], seen


async def test_an_endpoint_drain_cut_short_by_a_frozen_server_leaves_the_connection_working(nats_server):
    """``drain_endpoint`` (a worker's graceful stop of its ``infer`` subscription) against a SIGSTOPped server: it
    returns at its bound, the subscription delivers nothing more, and when the server answers again the drain's
    PONG does not end the connection's read loop. Before, it was nats-py's ``Subscription.drain()`` under
    ``asyncio.wait_for``: the bound cancelled nats-py's flush, whose PONG then set a cancelled future's result
    (``InvalidStateError`` in the read loop: nothing was read any more, this flush timed out)."""
    from inferbus.actors._common import drain_endpoint

    with _Reports() as reports:
        nc = await nats.connect(nats_server.url)
        sub = await nc.subscribe("ep", cb=_nothing)
        await nc.flush()
        os.kill(nats_server.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            await drain_endpoint(sub, 0.3)
            took = time.monotonic() - t0
        finally:
            os.kill(nats_server.proc.pid, signal.SIGCONT)
        assert took < 0.3 + SLACK_S, took
        assert sub._id not in nc._subs
        await nc.flush(timeout=5)  # the read loop is alive: the drain's PONG, then this one, were read
        assert nc.is_connected
        await nc.close()
        del nc, sub
        seen = await reports.settled()
        assert seen == [], seen
