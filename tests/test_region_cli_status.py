"""``inferbus region status`` against a real nats-server where region managers are heard but do not answer (a
hung manager: its heartbeats were sent, its control subject is subscribed, no reply comes)."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import nats
import pytest

from inferbus.bus import Subjects
from inferbus.schemas._region import RegionHeartbeat, encode_region

from conftest import ROOT

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_status_asks_every_region_at_once(nats_server):
    """Four regions heard, none answering: each is reported as not answering (exit 1: no primary), and the
    command takes one 2 s status timeout in all, not one per region (asked in turn, it took 8 s and more)."""
    regions = ("r1", "r2", "r3", "r4")
    s = Subjects("inferbus")
    nc = await nats.connect(nats_server.url)
    asked = []

    async def hung(msg):  # a manager that hears the request and never answers
        asked.append(msg.subject)

    for r in regions:
        await nc.subscribe(s.region_control(r), cb=hung)
    stop = asyncio.Event()

    async def heartbeats():
        seq = 0
        while not stop.is_set():
            seq += 1
            for r in regions:
                await nc.publish(s.region_heartbeats, encode_region(RegionHeartbeat(
                    region=r, role="standby", term=0, lease_rev=0, seq=seq, manager_id=f"{r}-m")))
            await asyncio.sleep(0.05)

    beat = asyncio.ensure_future(heartbeats())
    try:
        await nc.flush()
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "inferbus.cli", "region", "status", "--nats-url", nats_server.url, "--json",
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        took_s = time.monotonic() - t0
    finally:
        stop.set()
        await beat
        await nc.close()
    assert proc.returncode == 1, (proc.returncode, out, err)
    doc = json.loads(out)
    assert set(doc["regions"]) == set(regions) and doc["primary"] == []
    assert all("error" in doc["regions"][r] for r in regions), doc
    assert sorted(asked) == sorted(s.region_control(r) for r in regions)
    # the four waits overlap: one 2 s timeout plus start-up and listening (in turn they are 8 s of waits alone)
    assert took_s < 6.5, took_s
