"""chaos.proxy: the TCP fault proxy the region topology routes its gateways through (real sockets)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from chaos.proxy import FAULTS, TcpProxy, UnknownFault, make_fault, nats_gateway_peer
from conftest import TcpEcho

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


@pytest.fixture
def anyio_backend():
    return ("asyncio", {"use_uvloop": True})


async def _roundtrip(port: int, payload: bytes, first: bytes | None = None, timeout_s: float = 2.0):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        if first is not None:
            w.write(first)
            await w.drain()
            await asyncio.wait_for(r.readexactly(len(first)), timeout_s)
        t = time.monotonic()
        w.write(payload)
        await w.drain()
        data = await asyncio.wait_for(r.readexactly(len(payload)), timeout_s)
        return data, time.monotonic() - t
    finally:
        w.close()


async def test_forwards_and_counts():
    async with TcpEcho() as echo, TcpProxy(("127.0.0.1", echo.port)) as p:
        data, _ = await _roundtrip(p.port, b"hello" * 1000)
        assert data == b"hello" * 1000
        assert p.stats.accepted == 1 and p.stats.bytes_up == 5000 and p.stats.bytes_down == 5000


async def test_latency_delays_in_order_and_heals():
    async with TcpEcho() as echo, TcpProxy(("127.0.0.1", echo.port)) as p:
        f = p.latency(60, direction="up")
        data, dt = await _roundtrip(p.port, b"x" * 100)
        assert data == b"x" * 100 and dt >= 0.055
        p.heal(f)
        _, dt = await _roundtrip(p.port, b"y")
        assert dt < 0.05


async def test_cut_closes_established_connections_and_rejects_new_ones():
    async with TcpEcho() as echo, TcpProxy(("127.0.0.1", echo.port)) as p:
        r, w = await asyncio.open_connection("127.0.0.1", p.port)
        w.write(b"a")
        await w.drain()
        assert await asyncio.wait_for(r.readexactly(1), 2) == b"a"
        p.cut()
        assert await asyncio.wait_for(r.read(10), 2) == b""  # closed by the proxy
        w.close()
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await _roundtrip(p.port, b"b")
        assert p.stats.cut == 1 and p.stats.rejected >= 1
        p.heal()
        assert (await _roundtrip(p.port, b"c"))[0] == b"c"


async def test_drop_is_a_silent_blackhole():
    async with TcpEcho() as echo, TcpProxy(("127.0.0.1", echo.port)) as p:
        p.drop()
        with pytest.raises(asyncio.TimeoutError):
            await _roundtrip(p.port, b"lost", timeout_s=0.3)
        assert p.stats.dropped_bytes >= 4 and p.stats.active == 1  # connection still open


async def test_faults_by_peer_tag():
    """A NATS gateway CONNECT names the connecting cluster; a cut for peer B spares peer W."""

    def connect_line(gw: str) -> bytes:
        return b"CONNECT " + json.dumps({"gateway": gw, "name": f"{gw}1"}).encode() + b"\r\n"

    async with TcpEcho() as echo, TcpProxy(("127.0.0.1", echo.port), classify=nats_gateway_peer) as p:
        p.cut(peers={"B"})
        data, _ = await _roundtrip(p.port, b"ok", first=connect_line("W"))
        assert data == b"ok"
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await _roundtrip(p.port, b"no", first=connect_line("B"))


def test_fault_names_and_classifier():
    assert FAULTS == ("cut", "latency", "drop")
    with pytest.raises(UnknownFault, match="known faults: cut, latency, drop"):
        make_fault("explode")
    with pytest.raises(ValueError):
        make_fault("latency", latency_ms=-1)
    assert nats_gateway_peer(b'CONNECT {"gateway":"A","name":"A1"}\r\n') == "A"
    assert nats_gateway_peer(b"PING\r\n") is None and nats_gateway_peer(b"CONNECT {bad") is None
