"""The aggregator's L2 fills keep the model's cache TTL from the moment the fill arrived, not from the moment it
is written: a fill that waited in the aggregator's queue behind a stalled Valkey is written with what is left of
its TTL, or not at all once that ran out (a fresh-user trial: the answers queued during a Valkey stall were
written afterwards with their whole ``cache_ttl_ms`` and served as L2 hits past it)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import nats
import pytest
import redis.asyncio as aioredis

from conftest import wait_micro_service
from inferbus.schemas._internal import CacheFill, encode_internal

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PREFIX = "aggttl"
PAUSE_MS = 900
"""Valkey refuses writes this long (``CLIENT PAUSE ... WRITE``): under the aggregator's 1 s socket timeout, so the
batch it is writing when the pause starts succeeds, late, and the fills behind it wait in the queue."""


async def _stats(nc) -> dict:
    m = await nc.request("$SRV.STATS.inferbus-aggregator", b"", timeout=2)
    return json.loads(m.data)["endpoints"][0]["data"]


async def _start_aggregator(nats_server, valkey_server, monkeypatch, aggregator_id: str, prefix: str):
    """``(aggregator, its task, a NATS connection, a Redis client)``: an aggregator actor run on this loop (no GC
    freeze, no READY line) against the test's servers, once its micro service answers."""
    from inferbus.actors import _aggregator
    from inferbus.actors._config import AggregatorConfig
    from inferbus.bus import BusConfig

    monkeypatch.setattr(_aggregator, "serving_gc", lambda: None)  # no gc.freeze() in the test process
    monkeypatch.setattr(_aggregator, "announce_ready", lambda: None)
    agg = _aggregator.Aggregator(AggregatorConfig(aggregator_id=aggregator_id, redis_url=valkey_server.url,
                                                  bus=BusConfig(servers=(nats_server.url,), prefix=prefix)))
    task = asyncio.create_task(agg.run())
    nc = await nats.connect(nats_server.url)
    r = aioredis.from_url(valkey_server.url)
    try:
        await wait_micro_service(nc, "inferbus-aggregator", task)
    except BaseException:
        await _stop_aggregator(task, nc, r)
        raise
    return agg, task, nc, r


async def _stop_aggregator(task, nc, r) -> None:
    await r.aclose()
    await nc.close()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_fill_that_waited_behind_a_stalled_valkey_keeps_its_ttl_from_arrival(nats_server, valkey_server,
                                                                                      monkeypatch):
    agg, task, nc, r = await _start_aggregator(nats_server, valkey_server, monkeypatch, "a1", PREFIX)
    try:

        async def fill(key: str, ttl_ms: int) -> None:
            await nc.publish(f"{PREFIX}._cache.fill", encode_internal(CacheFill(key, ttl_ms, key.encode())))
            await nc.flush()

        await fill("warm", 60_000)  # the aggregator's connection is open before the stall
        deadline = time.monotonic() + 30
        while await r.get(f"{PREFIX}:warm") is None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)

        await r.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        t_pause = time.monotonic()
        await fill("first", 60_000)  # taken at once: its SET waits in Valkey for the pause
        await asyncio.sleep(0.05)
        await fill("short", 600)  # waits in the queue for ~0.85 s: more than its TTL
        await fill("long", 60_000)  # waits as long: written with ~59.1 s left
        t_queued = time.monotonic()
        while await r.get(f"{PREFIX}:first") is None:  # the pause is over and the first batch was written
            assert time.monotonic() < t_pause + 10
            await asyncio.sleep(0.01)
        for _ in range(200):  # the queued fills' batch written (or dropped as expired)
            if (await _stats(nc))["queued"] == 0 and await r.get(f"{PREFIX}:long") is not None:
                break
            await asyncio.sleep(0.01)
        assert await r.get(f"{PREFIX}:long") == b"long"
        pttl = await r.pttl(f"{PREFIX}:long")
        waited_ms = (time.monotonic() - t_queued) * 1000
        assert pttl <= 60_000 - waited_ms + 50, (pttl, waited_ms)  # its wait counted against its TTL
        # 'short' arrived more than its 600 ms before it could be written: never in L2 (before: written late with
        # its whole 600 ms, alive ~1.5 s after the answer was computed)
        assert await r.get(f"{PREFIX}:short") is None
        st = await _stats(nc)
        assert st["expired"] == 1 and st["fill_errors"] == 0, st
    finally:
        await _stop_aggregator(task, nc, r)


async def test_a_fill_expires_when_its_ingress_said_whatever_its_way_took(nats_server, valkey_server, monkeypatch):
    """A fresh-user trial: a fill carried no time, so fills that waited in the bus while the aggregator was stopped
    (SIGSTOP) were written with their whole TTL when it woke (answers with a 100 ms TTL were L2 hits 6 s later), and a
    SET that Valkey ran late (stopped with the pipeline sent) got a PX worked out before. A fill now carries its
    expiry (``expires_unix_ms``) and is written ``PXAT``: here a fill whose expiry is 300 ms away lives no longer
    whatever its ``ttl_ms``, one already past is not written, and one whose SET waits out a 900 ms write pause in
    Valkey past its expiry is gone when the pause ends."""
    agg, task, nc, r = await _start_aggregator(nats_server, valkey_server, monkeypatch, "a2", PREFIX + "2")
    p = PREFIX + "2"
    try:

        async def fill(key: str, expires_in_ms: float) -> None:
            at = int(time.time() * 1000 + expires_in_ms)
            await nc.publish(f"{p}._cache.fill", encode_internal(CacheFill(key, 60_000, key.encode(), at)))
            await nc.flush()

        async def written(key: str) -> None:
            deadline = time.monotonic() + 10
            while await r.get(f"{p}:{key}") is None:
                assert time.monotonic() < deadline, key
                await asyncio.sleep(0.01)

        await fill("near", 300)
        await written("near")
        assert 0 < await r.pttl(f"{p}:near") <= 300  # not the 60 s of its ttl_ms
        await fill("past", -5)
        await fill("mark", 60_000)  # written after 'past' (one queue, in order)
        await written("mark")
        assert await r.get(f"{p}:past") is None and (await _stats(nc))["expired"] == 1
        await r.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        t_pause = time.monotonic()
        await fill("late", 400)  # its SET is sent at once and run by Valkey after the pause: past its expiry
        await fill("after", 60_000)
        await written("after")
        assert time.monotonic() - t_pause >= 0.4
        assert await r.get(f"{p}:late") is None
    finally:
        await _stop_aggregator(task, nc, r)


async def test_the_resumed_line_counts_the_fills_that_expired_behind_the_outage(nats_server, valkey_server, monkeypatch,
                                                                             caplog):
    """A fresh-user trial: a 10 s Valkey freeze, 300 fills lost (284 of them expired in the queue behind the failing
    write, 100 ms TTLs), and the line said ``cache fills resumed (16 lost to the failure)``. Now it counts what
    expired or was dropped while the writes failed too."""
    import re

    caplog.set_level(logging.INFO, logger="inferbus.actors._aggregator")
    agg, task, nc, r = await _start_aggregator(nats_server, valkey_server, monkeypatch, "a3", PREFIX + "3")
    try:

        async def fill(key: str, ttl_ms: int) -> None:
            await nc.publish(f"{PREFIX}3._cache.fill", encode_internal(CacheFill(key, ttl_ms, key.encode())))
            await nc.flush()

        await fill("warm", 60_000)
        deadline = time.monotonic() + 30
        while await r.get(f"{PREFIX}3:warm") is None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await r.execute_command("CLIENT", "PAUSE", 2500, "WRITE")  # past the aggregator's 1 s socket timeout
        paused_at = time.monotonic()  # (the pause began before this instant)
        await fill("stuck", 60_000)  # its write times out: the outage's first failure
        deadline = time.monotonic() + 10
        while agg.stats["fill_errors"] == 0:
            assert time.monotonic() < deadline, agg.stats
            await asyncio.sleep(0.02)
        for i in range(20):  # 100 ms each: they expire waiting behind the next failing write
            await fill(f"short-{i}", 100)
        # the pause is over (3 s after it began; it was a fixed 3 s from here, after the first failure's 1 s timeout)
        await asyncio.sleep(max(0.0, paused_at + 3.0 - time.monotonic()))
        await fill("after", 60_000)
        deadline = time.monotonic() + 10
        while await r.get(f"{PREFIX}3:after") is None:
            assert time.monotonic() < deadline, agg.stats
            await asyncio.sleep(0.02)
        err = caplog.text  # (an INFO record of the aggregator's logger since 2026-12-07, a print before)
        m = re.search(r"cache fills resumed \((\d+) lost to the failure: (\d+) refused or timed out, (\d+) expired and "
                      r"(\d+) dropped while they waited\)", err)
        assert m, err[-2000:]
        total, failed, expired, dropped = map(int, m.groups())
        assert failed == agg.stats["fill_errors"] >= 1 and dropped == 0, (m.group(0), agg.stats)
        # each short fill expired or failed in a write (one written in time would have been no loss)
        assert expired + failed >= 20 and total == failed + expired + dropped, (m.group(0), agg.stats)
        assert expired == agg.stats["expired"], agg.stats
    finally:
        await _stop_aggregator(task, nc, r)
