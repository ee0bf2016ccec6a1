"""Copies of one request (same ``Inferbus-Request-Id``, same body) that a worker answers from one model run: the
answer goes back to each ingress once for its caches, not once per copy. Real nats-server, Valkey and inferbus
processes; the fills are read off the bus as the aggregator gets them."""

from __future__ import annotations

import asyncio
import collections
import json
import uuid

import nats
import numpy as np
import pytest

from conftest import start_deployment
from conftest import uvloop_backend as anyio_backend  # noqa: F401 (process-heavy tests: one loop)
from inferbus.bus import Subjects
from inferbus.schemas import decode_error
from inferbus.schemas._internal import CacheFill, decode_internal
from test_reliability_lib import set_fault

pytestmark = [pytest.mark.anyio]


@pytest.mark.timeout(120)
async def test_copies_joined_to_one_run_fill_the_cache_once_per_ingress(tmp_path):
    """A fresh-user trial sent 3 copies of each of 5 requests at once: the model ran 5 times, the other 10 copies
    joined those runs (right), and 15 cache fills of 5 answers went to Valkey: the worker sent the answer back with
    every copy's completion. With the model slowed so the copies surely join, one fill per request now."""
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="df", extra=["--fault-injection"])
    nc = await nats.connect(dep.nats_url)
    try:
        fills: collections.Counter = collections.Counter()

        async def on_fill(msg):
            f = decode_internal(msg.data)
            if isinstance(f, CacheFill):
                fills[f.key] += 1

        await nc.subscribe(Subjects("df").cache_fill, cb=on_fill)
        await set_fault(nc, "df", "n1-w0", compute_delay_ms=300)
        rng = np.random.default_rng(7)
        for _ in range(3):
            body = json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                           "data": rng.random(64).tolist()}]}).encode()
            hdrs = {"Content-Type": "application/json", "Inferbus-Request-Id": uuid.uuid4().hex}
            replies = await asyncio.gather(*(nc.request("df.infer.digits", body, timeout=10, headers=hdrs)
                                             for _ in range(3)))
            assert all(decode_error(r.headers, r.data) is None for r in replies), [r.data for r in replies]
            assert sorted((r.headers or {}).get("Inferbus-Dedup", "") for r in replies) == ["", "join", "join"], \
                [r.headers for r in replies]
        await asyncio.sleep(0.5)  # (fills leave with the completion notices, after the replies)
        await nc.flush()
        assert len(fills) == 3 and set(fills.values()) == {1}, fills
    finally:
        await nc.close()
        dep.stop()
