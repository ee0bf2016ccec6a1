"""inferbus.bus.publish_raw: pre-encoded header blocks arrive as nats-py's publish would send them."""

from __future__ import annotations

import asyncio

import nats
import pytest

from inferbus.bus import HeaderError, header_block, publish_raw

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def test_header_block_rejects_what_would_break_the_protocol():
    assert header_block({"A": "1", "B-c": " x "}) == b"NATS/1.0\r\nA: 1\r\nB-c: x\r\n\r\n"
    with pytest.raises(HeaderError):
        header_block({"bad key": "1"})
    with pytest.raises(HeaderError):
        header_block({"K": "a\r\nPUB x 1"})


async def test_publish_raw_round_trip_and_order(nats_server):
    nc = await nats.connect(nats_server.url)
    got = []
    done = asyncio.Event()

    async def cb(msg):
        got.append((msg.data, msg.reply, msg.headers))
        if len(got) == 4:
            done.set()

    await nc.subscribe("t.raw", cb=cb)
    await nc.flush()
    block = header_block({"Inferbus-Timeout-Ms": "250.000", "Content-Type": "application/msgpack"})
    await publish_raw(nc, "t.raw", b"one", reply="r.1", headers=block)
    await nc.publish("t.raw", b"two", headers={"X": "y"})
    await publish_raw(nc, "t.raw", b"three")
    await publish_raw(nc, "t.raw", b"", headers=block)
    await asyncio.wait_for(done.wait(), 5)
    await nc.close()
    assert [g[0] for g in got] == [b"one", b"two", b"three", b""]
    assert got[0][1] == "r.1"
    assert got[0][2] == {"Inferbus-Timeout-Ms": "250.000", "Content-Type": "application/msgpack"}
    assert got[2][2] is None
    assert got[3][2]["Content-Type"] == "application/msgpack"
