"""The L2 cache under a slow Valkey (issue 5, item 7, cache): real Valkey behind ``chaos.proxy.TcpProxy``.

* 100 ms of latency in front of Valkey with a 30 ms L2 timeout: lookups time out (cancelled mid-command,
  the classic way a pooled connection ends up answering the *next* command with the previous reply), and
  every reply still matches its own input; after the latency is healed, L2 hits match too.
* a pool of 2 connections per ingress and 100 concurrent misses: all succeed, the pool drains back to 0.
"""

from __future__ import annotations

import asyncio
import random

import anyio
import numpy as np
import pytest

from chaos.proxy import TcpProxy
from inferbus.client import Client

from conftest import start_deployment
from test_reliability_lib import models_subset

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
def anyio_backend(request):
    return request.param


def _typed(k: int):
    return {"a": np.array([[k]], np.int32), "b": np.full((1, 4), (k % 50) / 8, np.float16)}


def _check(k: int, out) -> bool:
    f = _typed(k)
    return (out["a_times_2"][0, 0] == 2 * k) and out["b_sum"][0, 0] == f["b"].astype(np.float32).sum()


async def _all_ingress_health(client, n: int) -> dict[str, dict]:
    """Health parameters of each of the ``n`` ingress replicas (the queue group picks one per request)."""
    seen: dict[str, dict] = {}
    for _ in range(200):
        p = (await client.health(timeout_s=2)).parameters
        seen[p["ingress_id"]] = p
        if len(seen) == n:
            break
    assert len(seen) == n, sorted(seen)
    return seen


async def test_slow_valkey_and_small_pool_never_mix_answers(valkey_server, tmp_path):
    proxy = await TcpProxy(("127.0.0.1", valkey_server.port)).start()
    dep = None
    try:
        proxy.latency(100)
        models = models_subset(tmp_path / "models", ["typed"], {"typed": {"cache_ttl_ms": 5000}})
        dep = await anyio.to_thread.run_sync(lambda: start_deployment(
            tmp_path / "dep", workers=1, prefix="l2", extra=[
                "--models", str(models), "--redis-url", f"redis://127.0.0.1:{proxy.port}/0", "--l2-lookup",
                "--l2-timeout-ms", "30", "--l2-pool-size", "2", "--ingress", "2"]))
        client = await Client.connect(dep.nats_url, "l2")
        sem = asyncio.Semaphore(50)
        wrong = []

        async def one(k: int):
            async with sem:
                res = await client.infer_result("typed", _typed(k), timeout_s=5)
                if not _check(k, res.outputs):
                    wrong.append(k)
                return res.parameters.get("cache_level")

        # 1. 100 ms in front of Valkey, 30 ms timeout: 60 inputs, 5 times each, shuffled, 50 at once
        keys = [k for k in range(1000, 1060) for _ in range(5)]
        random.Random(3).shuffle(keys)
        await asyncio.gather(*(one(k) for k in keys))
        assert not wrong, wrong
        health = await _all_ingress_health(client, 2)
        assert sum(p["counts"]["l2_timeouts"] for p in health.values()) > 0
        # 2. pool of 2, 100 concurrent misses: all succeed and the pool drains back to 0
        await asyncio.gather(*(one(k) for k in range(5000, 5100)))
        assert not wrong, wrong
        for _ in range(100):
            health = await _all_ingress_health(client, 2)
            if all(p["l2_pool_in_use"] == 0 for p in health.values()):
                break
            await asyncio.sleep(0.05)
        assert all(p["l2_pool_in_use"] == 0 and p["l2_pool_size"] == 2 for p in health.values()), health
        # 3. healed: entries filled through the slow proxy are now L2 hits on the other replica, all correct
        proxy.heal()
        # (step 2's keys were asked once, so each sits in one replica's L1 only: the other finds it in L2;
        # step 1's keys are in both L1s in ~98 % of shuffles)
        levels = await asyncio.gather(*(one(k) for k in list(range(1000, 1060)) * 2 + list(range(5000, 5100))))
        assert not wrong, wrong
        assert "l2" in levels, levels
        await client.close()
        print(f"L2 under 100 ms latency: {sum(p['counts']['l2_timeouts'] for p in health.values())} lookups "
              f"timed out, 0 mixed answers; after healing {levels.count('l2')} L2 hits")
    finally:
        if dep is not None:
            await anyio.to_thread.run_sync(dep.stop)
        await proxy.stop()
