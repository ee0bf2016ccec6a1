"""``inferbus region status`` against a real nats-server where region managers are heard but do not answer (a
hung manager: its heartbeats were sent, its control subject is subscribed, no reply comes)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import nats
import pytest

from inferbus.bus import Subjects
from inferbus.schemas._region import RegionHeartbeat, encode_region

from conftest import ROOT, cli_startup_s, uvloop_backend as anyio_backend  # noqa: F401 (CLI processes under test: one loop)

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

    startup_s = await asyncio.to_thread(cli_startup_s, "region", "status", "--nats-url", "{url}", "--json")
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
    assert set(doc["regions"]) == set(regions) and doc["primary"] == [] and doc["primaries"] == []
    assert all("error" in doc["regions"][r] for r in regions), doc
    assert sorted(asked) == sorted(s.region_control(r) for r in regions)
    # the four waits overlap: one 2 s timeout plus listening and slack over the start-up measured before (in turn
    # they are 8 s of waits alone)
    assert took_s - startup_s < 2 + 2.5, (took_s, startup_s)


class _FakeManager:
    """A region manager's wire side on a real nats-server under ``prefix``: heartbeats of ``region`` as primary every
    50 ms, and an ``ok`` answer (one step) to every status, promote and demote asked on its control subject."""

    def __init__(self, url: str, prefix: str, region: str = "r1", role: str = "primary", holder: str | None = None,
                 peer_roles: dict | None = None, heartbeat_age_ms: dict | None = None):
        self.url, self.prefix, self.region, self.role = url, prefix, region, role
        self.heartbeat_age_ms = heartbeat_age_ms or {}
        self.holder = region if holder is None else holder
        self.peer_roles = peer_roles or {}
        self.asked: list[str] = []

    async def __aenter__(self):
        from inferbus.schemas._region import RegionCommand, RegionReply, RegionStatus, RegionStep, decode_region

        s = Subjects(self.prefix)
        self.nc = await nats.connect(self.url)

        async def answer(msg):
            cmd = decode_region(msg.data)
            assert isinstance(cmd, RegionCommand)
            self.asked.append(cmd.action)
            st = RegionStatus(region=self.region, role=self.role, term=1, lease_rev=1, lease_holder=self.holder,
                              lease_age_ms=1.0, heartbeat_age_ms=self.heartbeat_age_ms, peer_roles=self.peer_roles, valkey="",
                              cache_role="master",
                              model_writes=self.role == "primary", manager_id=f"{self.region}-m",
                              monotonic_now=time.monotonic())
            await msg.respond(encode_region(RegionReply(ok=True, region=self.region,
                                                        steps=[RegionStep(name=f"fake {cmd.action}", ms=1.0)],
                                                        status=st)))

        await self.nc.subscribe(s.region_control(self.region), cb=answer)
        self.stop = asyncio.Event()

        async def heartbeats():
            seq = 0
            while not self.stop.is_set():
                seq += 1
                await self.nc.publish(s.region_heartbeats, encode_region(RegionHeartbeat(
                    region=self.region, role=self.role, term=1, lease_rev=1, seq=seq, manager_id=f"{self.region}-m")))
                await asyncio.sleep(0.05)

        await self.nc.flush()
        self.beat = asyncio.ensure_future(heartbeats())
        return self

    async def __aexit__(self, *exc):
        self.stop.set()
        await self.beat
        await self.nc.close()


async def _region_cli(*args: str, timeout_s: float = 30.0, env: dict | None = None) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "inferbus.cli", "region", *args, cwd=ROOT,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                env={**os.environ, **env} if env else None)
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    return proc.returncode, out.decode(), err.decode(), time.monotonic() - t0


async def test_cluster_file_prefix_is_the_region_commands_prefix(nats_server, tmp_path):
    """``region status|promote|demote --cluster`` talk on the subjects of the prefix the cluster file records (a
    cluster started with ``cluster up --prefix ibt``): they took ``--prefix``'s default, ``inferbus``, heard no
    manager and said "no region manager heard ... and the prefix right?" (exit 1). ``--prefix`` given the same is
    accepted; a different one is refused in one line, exit 2, before connecting."""
    (tmp_path / "cluster.json").write_text(json.dumps(
        {"spec": {"prefix": "ibt", "witness": "W"}, "client_urls": [nats_server.url]}))
    async with _FakeManager(nats_server.url, "ibt") as mgr:
        rc, out, err, _ = await _region_cli("status", "--cluster", str(tmp_path), "--json")
        assert rc == 0, (rc, out, err)
        assert json.loads(out)["primary"] == "r1", out
        rc, out, err, _ = await _region_cli("status", "--cluster", str(tmp_path / "cluster.json"), "--prefix", "ibt")
        assert rc == 0 and "primary: r1" in out, (rc, out, err)
        rc, out, err, _ = await _region_cli("promote", "r1", "--cluster", str(tmp_path))
        assert rc == 0 and "fake promote" in out, (rc, out, err)
        rc, out, err, _ = await _region_cli("demote", "--cluster", str(tmp_path))
        assert rc == 0 and "demote r1" in out and "fake demote" in out, (rc, out, err)
        assert not [line for line in out.splitlines() if line != line.rstrip()], out  # a step with no detail
        assert mgr.asked == ["status", "status", "promote", "demote"]
        for argv in (("status",), ("status", "--json"), ("promote", "r1"), ("demote",)):
            rc, out, err, _ = await _region_cli(*argv, "--cluster", str(tmp_path), "--prefix", "inferbus")
            assert (rc, out) == (2, ""), (argv, rc, out, err)
            assert err == (f"error: region {argv[0]}: --prefix 'inferbus' is not the prefix of the cluster in "
                           f"{tmp_path / 'cluster.json'} ('ibt'); leave --prefix out or give 'ibt'\n"), err
        assert mgr.asked == ["status", "status", "promote", "demote"]  # nothing asked by the refused ones


async def test_a_cluster_file_that_records_no_prefix_takes_the_prefix_option(nats_server, tmp_path):
    """A hand-written cluster.json with only ``client_urls``: ``--prefix`` applies (default ``inferbus``); an invalid
    prefix in the file is one line naming the file, exit 2, before connecting."""
    (tmp_path / "cluster.json").write_text(json.dumps({"client_urls": [nats_server.url]}))
    async with _FakeManager(nats_server.url, "ibt"), _FakeManager(nats_server.url, "inferbus", region="r2"):
        rc, out, err, _ = await _region_cli("status", "--cluster", str(tmp_path), "--json")
        assert rc == 0 and json.loads(out)["primary"] == "r2", (rc, out, err)
        rc, out, err, _ = await _region_cli("status", "--cluster", str(tmp_path), "--json", "--prefix", "ibt")
        assert rc == 0 and json.loads(out)["primary"] == "r1", (rc, out, err)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"spec": {"prefix": "a b"}, "client_urls": [nats_server.url]}))
    rc, out, err, _ = await _region_cli("status", "--cluster", str(p))
    assert (rc, out) == (2, ""), (rc, out, err)
    assert err == (f"error: region status: --cluster {p}: its spec's prefix must be dot-separated tokens of "
                   f"letters, digits, '_' or '-', got 'a b'\n"), err


async def test_status_with_the_primary_out_of_reach_says_which_regions_did_not_answer(nats_server):
    """A fresh-user trial partitioned A from B: ``region status`` (through A's side) printed ``primary: none``, read
    as an outage, while B held the lease all along. Now the title names the regions that did not answer, those heard
    (B's heartbeats, its control hung) and those only an answering region knows of (A's ``peer_roles``: across a
    partition B's heartbeats do not come through either); ``--json`` has ``unanswered``. Not the lease holder as the
    cut-off side read it: a second trial saw that reading name A, stale."""
    s = Subjects("inferbus")
    nc = await nats.connect(nats_server.url)
    stop = asyncio.Event()

    async def hung(msg):  # B: heard (its heartbeats), not answering
        pass

    await nc.subscribe(s.region_control("B"), cb=hung)

    async def heartbeats():
        seq = 0
        while not stop.is_set():
            seq += 1
            await nc.publish(s.region_heartbeats, encode_region(RegionHeartbeat(
                region="B", role="primary", term=1, lease_rev=1, seq=seq, manager_id="B-m")))
            await asyncio.sleep(0.05)

    beat = asyncio.ensure_future(heartbeats())
    try:
        async with _FakeManager(nats_server.url, "inferbus", "A", role="standby", holder="A"):
            rc, out, err, _ = await _region_cli("status", "--nats-url", nats_server.url, "--timeout-s", "3")
            assert rc == 1 and ("primary: none among the regions that answered; no answer from B, which may be "
                                "primary beyond a partition" in " ".join(out.split())), (rc, out, err)  # (wrapped)
            rc, out, err, _ = await _region_cli("status", "--nats-url", nats_server.url, "--timeout-s", "3", "--json")
            doc = json.loads(out)
            assert rc == 1 and doc["primaries"] == [] and doc["unanswered"] == ["B"], doc
    finally:
        stop.set()
        await beat
    try:  # B not heard at all: A's peer_roles still name it
        async with _FakeManager(nats_server.url, "inferbus", "A", role="standby", peer_roles={"B": "silent"}):
            rc, out, err, _ = await _region_cli("status", "--nats-url", nats_server.url, "--timeout-s", "3", "--json")
            doc = json.loads(out)
            assert rc == 1 and doc["primaries"] == [] and doc["unanswered"] == ["B"], doc
            assert set(doc["regions"]) == {"A"}, doc
    finally:
        await nc.close()


async def test_status_fits_the_terminal_it_is_given(nats_server):
    """``region status`` printed its table 200 columns wide whatever the terminal (a fresh-user trial of the other
    listings); now it follows ``COLUMNS`` (piped too), and where its table does not fit, each region is a block of
    ``name=value`` items, nothing cut."""
    async with _FakeManager(nats_server.url, "inferbus", "r1", heartbeat_age_ms={"r2": 70.4, "r3": 12.0}):
        for columns in (60, 80):
            rc, out, err, _ = await _region_cli("status", "--nats-url", nats_server.url, "--timeout-s", "3",
                                                env={"COLUMNS": str(columns)})
            assert rc == 0 and "regions — primary: r1" in out, (rc, out, err)
            assert "…" not in out and max(map(len, out.splitlines())) <= columns, out
            assert "r1:" in out and "role=primary" in out and "term=" in out, out
            assert "heartbeat_age_ms=r2:70,r3:12" in out, out  # one item (it read "heartbeats_(age_ms)=r2 70, r3 12")
        rc, out, err, _ = await _region_cli("status", "--nats-url", nats_server.url, "--timeout-s", "3",
                                            env={"COLUMNS": "400"})
        row = next(line for line in out.splitlines() if line.startswith("│ r1 "))  # the table, where it fits
        assert "primary" in row, out
