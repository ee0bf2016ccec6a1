"""A hung ingress (SIGSTOP: its process alive, its socket open) among two, against the embedded nats-server.

Seen by a fresh-user trial: with NATS's default server PINGs (every 2 minutes), the stopped ingress stayed in the
queue group and took half of the requests for as long as it was stopped; the SDK's retries landed on it again half
of the time, and ~10 % of requests failed for the whole hang. The embedded server now PINGs a silent connection
every second and closes it after two unanswered PINGs, so the queue group stops handing the hung ingress requests
within seconds, and it comes back by itself (nats-py reconnects) when the process resumes.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from inferbus.client import Client
from inferbus.schemas import DeadlineExceeded, Unavailable

from conftest import start_deployment
from conftest import uvloop_backend as anyio_backend  # noqa: F401 (process-heavy tests: one loop)
from test_reliability_lib import models_subset

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    root = tmp_path_factory.mktemp("hang")
    models = models_subset(root / "models", ["typed"])
    d = start_deployment(root / "dep", workers=1, prefix="hng", extra=["--models", str(models), "--no-cache",
                                                                        "--ingress", "2"])
    yield d
    d.stop()


def typed(i: int) -> dict:
    return {"a": np.array([[i]], np.int32), "b": np.ones((1, 4), np.float16)}


async def ingress_pids(client: Client, n: int = 2, timeout_s: float = 15.0) -> set[int]:
    """The pids of the ingresses answering health (the queue group picks one per request)."""
    pids: set[int] = set()
    t0 = time.monotonic()
    while len(pids) < n:
        assert time.monotonic() - t0 < timeout_s, f"only ingresses {pids} answered"
        try:
            pids.add((await client.health(timeout_s=0.5)).parameters["pid"])
        except (DeadlineExceeded, Unavailable):
            pass
    return pids


async def test_a_hung_ingress_stops_taking_requests_within_seconds_and_serves_again_when_resumed(dep):
    client = await Client.connect(dep.nats_url, "hng", adaptive_attempt_timeout=False)
    victim = None
    try:
        victim = sorted(await ingress_pids(client))[0]
        os.kill(victim, signal.SIGSTOP)
        t0 = time.monotonic()
        streak, failed, i = 0, 0, 0
        while streak < 40:  # 40 answered in a row, each within 0.3 s: none of them went to the hung one
            assert time.monotonic() - t0 < 20, f"the hung ingress still takes requests ({failed} failed)"
            i += 1
            try:
                out = await client.infer("typed", typed(i), timeout_s=0.3)
                assert out["a_times_2"][0, 0] == 2 * i
                streak += 1
            except (DeadlineExceeded, Unavailable):
                streak, failed = 0, failed + 1
        cut_s = time.monotonic() - t0
        print(f"hung ingress out of the queue group after {cut_s:.1f} s ({failed} of {i} requests failed)")
        assert cut_s < 12, cut_s
        for j in range(100):  # and it stays out while hung
            out = await client.infer("typed", typed(1000 + j), timeout_s=1.0)
            assert out["a_times_2"][0, 0] == 2 * (1000 + j)
    finally:
        if victim is not None:
            os.kill(victim, signal.SIGCONT)
    assert victim in await ingress_pids(client, 2, timeout_s=20)  # resumed: it reconnected and answers again
    await client.close()
