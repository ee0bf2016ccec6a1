"""The SDK's per-attempt timeout and retry rule, against a real nats-server.

The "servers" here are plain NATS subscribers on the request subject (a real server, real
connections; no mock of NATS): one that swallows the first copy of each request id (as an ingress
SIGKILLed with the request in hand would), one that answers a client error, one that records what
it got. Each test asserts what the server side saw: how many copies, with which request id.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from inferbus.bus import headers as H
from inferbus.client import Client
from inferbus.schemas import DeadlineExceeded, InvalidArgument, NotFound, encode_error

pytestmark = pytest.mark.anyio

SUBJECT = "inferbus.infer.fake"


class Responder:
    """Answers requests on ``SUBJECT``: swallows the first ``drop`` copies of each id, answers the rest."""

    def __init__(self, nc, *, drop: int = 0, error=None, delay_s: float = 0.0) -> None:
        self.nc, self.drop, self.error, self.delay_s = nc, drop, error, delay_s
        self.seen: list[tuple[float, str]] = []

    async def start(self) -> "Responder":
        await self.nc.subscribe(SUBJECT, cb=self._on)
        await self.nc.flush()
        return self

    async def _on(self, msg) -> None:
        rid = (msg.headers or {}).get(H.REQUEST_ID, "")
        self.seen.append((time.monotonic(), rid))
        if sum(1 for _, r in self.seen if r == rid) <= self.drop:
            return  # lost with the process that held it
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.error is not None:
            hdrs, body = encode_error(self.error)
            await self.nc.publish(msg.reply, body, headers=hdrs)
        else:
            await self.nc.publish(msg.reply, b"ok:" + rid.encode())


async def _pair(url: str, **client_kw):
    import nats

    server_nc = await nats.connect(url)
    client = await Client.connect(url, **client_kw)
    return server_nc, client


@pytest.mark.timeout(30)
async def test_lost_attempt_is_retried_with_the_same_id_within_the_budget(nats_server):
    server_nc, client = await _pair(nats_server.url, attempt_timeout_ms=150)
    try:
        r = await Responder(server_nc, drop=1).start()
        t0 = time.monotonic()
        body, _ = await client.request(SUBJECT, b"x", timeout_s=2.0, request_id="rid-1")
        took = time.monotonic() - t0
        assert body == b"ok:rid-1"
        assert [rid for _, rid in r.seen] == ["rid-1", "rid-1"]  # the same id both times
        assert 0.14 <= r.seen[1][0] - r.seen[0][0] < 1.0  # sent again after the attempt timeout, not the budget
        assert took < 1.5 and client.attempt_timeouts == 1
    finally:
        await client.close()
        await server_nc.close()


@pytest.mark.timeout(30)
async def test_attempt_timeouts_back_off_and_the_budget_still_bounds_the_request(nats_server):
    server_nc, client = await _pair(nats_server.url, attempt_timeout_ms=100)
    try:
        r = await Responder(server_nc, drop=100).start()  # never answers
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await client.request(SUBJECT, b"x", timeout_s=1.0, request_id="rid-2")
        took = time.monotonic() - t0
        assert 0.95 <= took < 1.6
        gaps = [b - a for (a, _), (b, _) in zip(r.seen, r.seen[1:])]
        # 100, 200, 400 ms, then the rest of the budget: 4 copies, each gap at least the doubled timeout
        assert len(r.seen) == 4 and {rid for _, rid in r.seen} == {"rid-2"}, r.seen
        assert gaps[0] >= 0.09 and gaps[1] >= 0.19 and gaps[2] >= 0.39, gaps
    finally:
        await client.close()
        await server_nc.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("error", [InvalidArgument("bad input", field="inputs[0]"), NotFound("no such model")])
async def test_client_errors_are_never_retried(nats_server, error):
    server_nc, client = await _pair(nats_server.url, attempt_timeout_ms=100)
    try:
        r = await Responder(server_nc, error=error).start()
        with pytest.raises(type(error)):
            await client.request(SUBJECT, b"x", timeout_s=1.0, request_id="rid-3")
        await asyncio.sleep(0.3)  # longer than an attempt timeout: nothing more arrives
        assert len(r.seen) == 1
    finally:
        await client.close()
        await server_nc.close()


@pytest.mark.timeout(30)
async def test_adaptive_attempt_timeout_follows_observed_latency_with_a_floor(nats_server):
    server_nc, client = await _pair(nats_server.url, attempt_timeout_floor_ms=120)
    try:
        await Responder(server_nc).start()
        # before 16 answers: half the budget
        assert client.attempt_timeout_for(SUBJECT, 1000.0) == 500.0
        for i in range(20):
            await client.request(SUBJECT, b"x", timeout_s=1.0, request_id=f"warm-{i}")
        # fast answers (~1 ms on loopback): srtt + 4 rttvar is far below the floor
        assert client.attempt_timeout_for(SUBJECT, 1000.0) == 120.0
        assert client.attempt_timeout_for("inferbus.infer.other", 1000.0) == 500.0  # per subject
        fixed = Client(client.nc, attempt_timeout_ms=80)
        assert fixed.attempt_timeout_for(SUBJECT, 1000.0) == 80
        assert Client(client.nc, adaptive_attempt_timeout=False).attempt_timeout_for(SUBJECT, 1000.0) is None
        with pytest.raises(ValueError):
            Client(client.nc, attempt_timeout_ms=0)
    finally:
        await client.close()
        await server_nc.close()


@pytest.mark.timeout(30)
async def test_a_slow_answer_within_the_last_attempt_is_taken(nats_server):
    # a server slower than the attempt timeout still answers within the budget: the copies share the id,
    # and the answer to the last copy is taken (a real worker would have joined them into one computation)
    server_nc, client = await _pair(nats_server.url, attempt_timeout_ms=150)
    try:
        r = await Responder(server_nc, delay_s=0.25).start()
        body, _ = await client.request(SUBJECT, b"x", timeout_s=1.0, request_id="rid-4")
        assert body == b"ok:rid-4" and {rid for _, rid in r.seen} == {"rid-4"}
    finally:
        await client.close()
        await server_nc.close()
