"""Failure handling against real processes: a killed worker, no live worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import nats
import numpy as np
import pytest

from inferbus.actors import IngressConfig
from inferbus.bus import BusConfig
from inferbus.client import Client
from inferbus.schemas import InferbusError, Unavailable
from inferbus.schemas._internal import LoadReport, decode_internal

from conftest import MODELS, start_deployment
from conftest import uvloop_backend as anyio_backend  # noqa: F401 (process-heavy tests: one loop)

pytestmark = [pytest.mark.anyio]


async def _reports(nc, prefix):
    latest: dict[str, LoadReport] = {}
    changed = asyncio.Event()

    async def cb(msg):
        r = decode_internal(msg.data)
        if isinstance(r, LoadReport):
            latest[r.worker_id] = r
            changed.set()

    sub = await nc.subscribe(f"{prefix}._load", cb=cb)
    return latest, changed, sub


@pytest.mark.timeout(120)
async def test_killed_worker_is_restarted_and_no_request_hangs(tmp_path):
    dep = start_deployment(tmp_path / "dep", workers=2)
    try:
        nc = await nats.connect(dep.nats_url)
        latest, changed, sub = await _reports(nc, dep.prefix)
        while len(latest) < 2:
            changed.clear()
            await asyncio.wait_for(changed.wait(), 5)
        victim = sorted(latest)[0]
        old_pid = latest[victim].pid
        client = Client(nc, dep.prefix)
        x = np.load(MODELS / "digits" / "data" / "test.npz")["X"].astype(np.float32)
        timeout_s = 2.0
        outcomes = []
        stop = asyncio.Event()

        async def caller(k):
            i = k
            while not stop.is_set():
                i += 7
                t0 = time.monotonic()
                try:
                    res = await client.infer_result("digits", {"pixels": x[i % len(x)][None] + np.float32(i * 1e-4)},
                                                    timeout_s=timeout_s)
                    outcomes.append(("ok", time.monotonic() - t0, res.parameters["worker_id"]))
                except InferbusError as err:
                    outcomes.append((err.code.value, time.monotonic() - t0, None))

        tasks = [asyncio.create_task(caller(k)) for k in range(4)]
        await asyncio.sleep(1.0)
        os.kill(old_pid, signal.SIGKILL)
        t_kill = time.monotonic()
        # the supervisor restarts it: a report from the same worker id with a new pid
        while not (victim in latest and latest[victim].pid != old_pid):
            changed.clear()
            await asyncio.wait_for(changed.wait(), 30)
        restart_s = time.monotonic() - t_kill
        await asyncio.sleep(1.5)
        stop.set()
        await asyncio.gather(*tasks)
        assert outcomes
        # no request waited past its budget (small slack for scheduling on a busy box)
        assert max(dt for _, dt, _ in outcomes) < timeout_s + 0.5
        failed = [o for o in outcomes if o[0] != "ok"]
        assert len(failed) <= 4, failed  # at most the requests in flight on the victim, and the SDK retries those
        # service resumed and the restarted worker takes traffic again
        assert all(o == "ok" for o, _, _ in outcomes[-20:])
        deadline = time.monotonic() + 20  # (a time, not a count of requests: a loaded CI box)
        while time.monotonic() < deadline:
            res = await client.infer_result("digits", {"pixels": x[:1] + np.float32(np.random.rand())})
            if res.parameters["worker_id"] == victim:
                break
        else:
            pytest.fail(f"restarted worker {victim} got no traffic")
        print(f"worker restart took {restart_s * 1000:.0f} ms; {len(outcomes)} requests, {len(failed)} failed")
        await sub.unsubscribe()
        await nc.close()
    finally:
        dep.stop()


@pytest.mark.timeout(60)
async def test_no_live_worker_is_fast_unavailable(nats_server, tmp_path):
    cfg = IngressConfig(ingress_id="lonely", bus=BusConfig(servers=(nats_server.url,), prefix="t1"),
                        models_dir=str(MODELS))
    proc = subprocess.Popen([sys.executable, "-m", "inferbus.actors", "ingress", cfg.to_json()],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout.readline().strip() == b"READY"
        client = await Client.connect(nats_server.url, "t1", retry_unavailable=False)
        h = await client.health()
        assert h.live and not h.ready
        assert await client.model_ready("digits") is False and await client.model_ready("digits", "2") is False
        t0 = time.perf_counter()
        with pytest.raises(Unavailable):
            await client.infer("digits", {"pixels": np.zeros((1, 64), np.float32)}, timeout_s=2)
        assert time.perf_counter() - t0 < 0.1
        # nobody serving the public subject at all: NATS no-responders → UNAVAILABLE, also fast
        t0 = time.perf_counter()
        nobody = Client(client.nc, "nobody", retry_unavailable=False)
        with pytest.raises(Unavailable):
            await nobody.infer("digits", {"pixels": np.zeros((1, 64), np.float32)}, timeout_s=2)
        assert time.perf_counter() - t0 < 0.1
        await client.close()
    finally:
        proc.terminate()
        proc.wait(10)
