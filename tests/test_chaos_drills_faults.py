"""Chaos library pieces that need no deployment (seconds): the fault and drill registries, partial
packet loss on the proxy, the soak's fault cycle, the drills' fault timed from the load's first request (a bare
nats-server), the RSS plateau rule, and the CLI's refusals
(options a drill does not take). The drills themselves run in tests/test_drills_node.py,
tests/test_region_failover.py, tests/test_chaos_drills_topology.py and (model-swap)
tests/test_models_control.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import pytest

from conftest import TcpEcho, check_fault_phases, cli_in_process

from chaos.drills import DRILLS, UnknownDrill, get_drill, option_names
from chaos.faults import FAULTS, Fault, FaultUnavailable, NodeTarget, UnknownFault, get_fault
from chaos.proxy import TcpProxy
from chaos.rss import RssSampler
from chaos.soak import fault_cycle, window_figures
from chaos.load import Driver, RequestRecord, sleep_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ISSUE_DRILLS = {"worker-crash", "worker-hang", "nats-node-loss", "cache-loss", "region-failover", "region-partition",
                "soak"}


@pytest.fixture
def anyio_backend():
    return ("asyncio", {"use_uvloop": True})


def test_every_drill_of_the_issue_is_registered_and_loads():
    assert ISSUE_DRILLS | {"gateway-degrade", "model-swap"} <= set(DRILLS)
    for name in DRILLS:
        fn, opts_cls = get_drill(name).load()
        assert asyncio.iscoroutinefunction(fn) and opts_cls() is not None
    with pytest.raises(UnknownDrill, match="known drills: .*nats-node-loss"):
        get_drill("nope")
    assert {"gateway_latency_ms", "gateway_drop_pct", "gateway_links"} <= option_names("region-partition")
    assert {"topology", "fault_every_s", "faults", "hang_s"} <= option_names("soak")
    assert "hang_s" in option_names("worker-hang") and not {"fault_every_s", "topology"} & option_names("worker-hang")


def test_every_fault_kind_of_the_issue_has_a_named_injector():
    kinds = {"kill-worker", "kill-ingress", "kill-aggregator", "hang-worker", "kill-nats-node", "kill-valkey",
             "gateway-cut", "gateway-latency", "gateway-drop", "slow-worker", "model-swap"}
    assert kinds <= set(FAULTS)
    with pytest.raises(UnknownFault, match="known: "):
        get_fault("explode")


async def test_topology_faults_refuse_a_single_node_and_model_swap_a_topology():
    target = NodeTarget(node=None)
    for name in ("kill-nats-node", "gateway-latency", "gateway-drop", "gateway-degrade", "gateway-cut",
                 "isolate-region", "kill-region"):
        with pytest.raises(FaultUnavailable, match="topology"):
            await get_fault(name)(target)
    with pytest.raises(FaultUnavailable, match="single node"):
        await get_fault("model-swap")(object())  # not a NodeTarget (e.g. a topology): says why


class _AnswersNothing:
    """What :class:`chaos.load.Driver` needs of a client: a real NATS connection (``nc``, for its audit subscription)
    and ``infer_result``, which here refuses every request at once (no model is served: only the load's timing is
    under test)."""

    def __init__(self, nc) -> None:
        self.nc = nc

    async def infer_result(self, model, feed, *, timeout_s, request_id):
        from inferbus.schemas import InferbusError

        raise InferbusError(f"{request_id}: no model here")


async def test_a_drills_fault_is_timed_from_the_loads_first_request(nats_server):
    """:meth:`Driver.wait_into_load`, with which every region and topology drill times its fault: the load's set-up
    (its audit subscription, here 0.4 s of round trip over a proxy adding 200 ms each way) does not count, so a
    fault asked for 0.3 s into the load comes 0.3 s after its first request, 15 requests planned before it (a drill
    that slept ``fault_at_s`` from its own start injected it here before the first request). :meth:`fault_phases`
    records it on the load's clock, a heal or none (region-failover's kill is not healed during the load)."""
    import nats

    async with TcpProxy(("127.0.0.1", nats_server.port)) as p:
        nc = await nats.connect(f"nats://127.0.0.1:{p.port}", connect_timeout=2)
        try:
            p.latency(200)
            driver = Driver(_AnswersNothing(nc), "digits", [{}], [{}], rate_qps=50, audit_subject="drill._audit")
            t_task = time.monotonic()
            load = asyncio.create_task(driver.run(1.0))
            await driver.wait_into_load(load, 0.3)
            injected = time.monotonic()
            assert driver.t_start >= t_task + 0.4 and injected >= driver.t_start + 0.3, (t_task, driver.t_start)
            await sleep_until(injected + 0.4)  # (asyncio.sleep may return a millisecond early)
            healed = time.monotonic()
            p.heal()
            await load
        finally:
            await nc.close()
    d = driver.figures("timing", (injected, healed), extra={"fault_at_s": 0.3,
                                                             **driver.fault_phases(injected, healed)}).to_dict()
    # (± 1: the open loop compares float times with the end; an upper slack of 1 s for a stall of the shared box)
    assert abs(d["requests"] - 50) <= 1 and d["failed"] == d["requests"], d
    check_fault_phases(d, fault_at_s=0.3, rate_qps=50, lasts_s=0.4, slack_s=1.0)
    x = d["extra"]
    assert x["requests_before_fault"] >= 15 and 0.98 - 1e-9 <= x["last_request_sent_at_s"] <= 1.0, x
    # a fault not healed during the load: every request from it on is during it
    unhealed = {"requests": d["requests"], "extra": {"fault_at_s": 0.3, **driver.fault_phases(injected)}}
    check_fault_phases(unhealed, fault_at_s=0.3, rate_qps=50, slack_s=1.0)
    assert unhealed["extra"]["requests_during_fault"] == d["requests"] - x["requests_before_fault"], unhealed


async def test_a_load_that_ends_before_its_first_request_raises_from_wait_into_load(nats_server):
    """The load's own error (here its audit subscription on a closed connection) reaches the drill waiting to
    inject its fault, instead of a wait for a first request that never comes."""
    import nats

    nc = await nats.connect(nats_server.url, connect_timeout=2)
    await nc.close()
    driver = Driver(_AnswersNothing(nc), "digits", [{}], [{}], rate_qps=50, audit_subject="drill._audit")
    load = asyncio.create_task(driver.run(1.0))
    with pytest.raises(nats.errors.ConnectionClosedError):
        await asyncio.wait_for(driver.wait_into_load(load, 0.3), 5)
    assert driver.t_start is None and driver.records == []


async def test_partial_drop_retransmits_late_and_in_order():
    """50 % loss looks like TCP retransmissions: every byte arrives, in order; lost chunks come rto_ms late.

    A retransmitted chunk is always >= rto_ms late; a chunk that was not dropped is late only if the box
    stalls this process for that long (a 75 ms stall on the shared CI box once counted as one more "slow" one
    with rto_ms=80), so the delay is 250 ms and one stall is tolerated."""
    async with TcpEcho() as echo, TcpProxy(("127.0.0.1", echo.port)) as p:
        p.drop(drop_pct=50, rto_ms=250, direction="up")
        r, w = await asyncio.open_connection("127.0.0.1", p.port)
        try:
            got = b""
            slow = 0
            for i in range(20):
                msg = f"{i:04d}".encode()
                t = time.monotonic()
                w.write(msg)
                await w.drain()
                got += await asyncio.wait_for(r.readexactly(4), 2)
                slow += time.monotonic() - t >= 0.24
            assert got == b"".join(f"{i:04d}".encode() for i in range(20))
            n = p.stats.retransmitted
            assert n <= slow <= n + 1 and 2 <= n <= 18, (n, slow)  # 50 % of 20, loosely
            assert p.stats.dropped_bytes == 0
        finally:
            w.close()
    with pytest.raises(ValueError, match="drop_pct"):
        p.drop(drop_pct=0)


async def test_fault_cycle_rotates_skips_unavailable_and_records_windows():
    done = []

    async def inject(name, k):
        if name == "never":
            raise FaultUnavailable("never: not here")
        f = Fault(name, f"t{k}", None, time.monotonic())

        async def heal():
            done.append(name)
        f._heal = heal
        return f

    load = asyncio.create_task(asyncio.sleep(2.2))
    t0 = time.monotonic()
    faults, unavailable = await fault_cycle(load, ["a", "never", "b"], inject, lambda n: 0.05, fault_every_s=0.4,
                                            duration_s=2.2, t_start=t0, quiet_tail_s=0.3)
    assert [f["fault"] for f in faults] == ["a", "b", "a", "b", "a"][:len(faults)] and len(faults) >= 4
    assert unavailable == {"never": "never: not here"} and done == [f["fault"] for f in faults]
    recs = [RequestRecord(str(i), t0 + i * 0.1, t0 + i * 0.1 + 0.01, "ok" if i % 7 else "UNAVAILABLE")
            for i in range(22)]
    window_figures(recs, faults)
    assert all(f["requests"] > 0 and f["wrong"] == 0 and f["p99_ms"] is not None for f in faults)


def test_rss_plateau_rule():
    s = RssSampler()
    t = 0.0
    for i in range(200):  # warm-up that levels off: plateau
        s.samples.setdefault("flat", []).append((t + i, 1, 100_000 + min(i, 50) * 400))
        s.samples.setdefault("leak", []).append((t + i, 2, 100_000 + i * 100))  # 100 KiB/s, for ever
    # a restart: only the last incarnation is judged
    s.samples["restarted"] = [(i, 3, 300_000 + i * 1000) for i in range(50)] + \
        [(50 + i, 4, 90_000) for i in range(60)]
    summary = s.summary()
    assert summary["flat"]["plateau"] is True
    assert summary["leak"]["plateau"] is False and summary["leak"]["last_quarter_growth_kib"] > 4000
    assert summary["restarted"]["plateau"] is True and summary["restarted"]["incarnations"] == 2
    assert s.verdict() == {"judged": 3, "plateaued": 2, "growing": ["leak"]}
    s.sample({"me": os.getpid(), "gone": 2 ** 22 + 12345})
    assert "me" in s.samples and "gone" not in s.samples


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``inferbus chaos *args``, in this process (:func:`conftest.cli_in_process`): the listing and refusals here are
    parsing alone, where a process costs ~0.5 s of imports (28 of them). A refusal that does not come runs the
    drill here: its test fails by its assertion, or by its timeout."""
    return cli_in_process(["chaos", *args], cwd=ROOT)


def test_cli_lists_model_swap_as_a_drill_that_runs():
    r = _cli("list")
    assert r.returncode == 0 and "model-swap" in r.stdout
    assert "not available" not in r.stdout and "Traceback" not in r.stderr


@pytest.mark.timeout(120)  # ~25 CLI processes: 22 s on an idle 2-core box, over 30 s in a loaded CI run
def test_cli_refuses_options_a_drill_does_not_take_and_bad_values():
    r = _cli("run", "worker-crash", "--latency-ms", "50")
    assert r.returncode == 2 and "does not take --latency-ms" in r.stderr
    # fields of the node drills' shared options class that only some of them read (a fresh-user trial: accepted)
    for drill, flag, value in (("worker-crash", "--fault-every", "5"), ("worker-crash", "--hang-s", "5"),
                               ("cache-loss", "--topology", None), ("model-swap", "--fault-every", "5"),
                               ("worker-hang", "--fault-every", "5"),
                               # the region drills' shared options too (a later trial: accepted and read by nothing)
                               ("region-failover", "--down-s", "1"), ("region-failover", "--server", "A2"),
                               ("region-failover", "--fault-s", "2"), ("region-partition", "--fault-s", "2"),
                               ("nats-node-loss", "--fault-s", "2"), ("gateway-degrade", "--down-s", "1")):
        r = _cli("run", drill, flag, *([value] if value else []), "--duration", "1")
        assert r.returncode == 2 and f"chaos run: drill {drill} does not take {flag}" in r.stderr, (drill, flag, r.stderr)
    r = _cli("run", "gateway-degrade", "--links", "moon")
    assert r.returncode == 2 and "chaos run: --links must be 'regions' or 'all', got 'moon'" in r.stderr \
        and "Traceback" not in r.stderr
    r = _cli("list")
    assert r.returncode == 0 and "nats-node-loss" in r.stdout and "gateway-degrade" in r.stdout
    # a fault after the load's end: the drill idled, then injected it into no load and passed (a fresh-user trial)
    for drill in ("region-failover", "region-partition", "nats-node-loss"):
        r = _cli("run", drill, "--fault-at", "100", "--duration", "5")
        assert r.returncode == 2 and "--fault-at 100 is not within the load's --duration 5" in r.stderr, r.stderr


@pytest.mark.parametrize("drill,args,named", [
    # a fresh-user trial: a negative or NaN rate ran for good at a core's worth of CPU, 0 ended in a
    # ZeroDivisionError traceback, --workers -3 in a NodeConfig traceback, and a negative duration or timeout ran
    ("worker-crash", ("--rate", "-5"), "--rate"),
    ("worker-crash", ("--rate", "nan"), "--rate"),
    ("worker-crash", ("--rate", "0"), "--rate"),
    ("worker-crash", ("--workers", "-3"), "--workers"),
    ("worker-crash", ("--duration", "-1"), "--duration"),
    ("soak", ("--timeout", "-1"), "--timeout"),
    # a fresh-user trial: a budget over the ingress's 600 s ran the whole drill with every request refused
    ("region-failover", ("--timeout-s", "600.0001"), "--timeout-s"),
    ("worker-crash", ("--timeout-s", "601"), "--timeout-s"),
    ("soak", ("--fault-every", "inf"), "--fault-every"),
    ("region-failover", ("--fault-at", "nan"), "--fault-at"),
    ("gateway-degrade", ("--latency-ms", "-1"), "--latency-ms"),
    ("gateway-degrade", ("--drop-pct", "101"), "--drop-pct"),
])
def test_cli_refuses_out_of_range_values_in_one_line_before_starting_anything(drill, args, named):
    r = _cli("run", drill, *args)
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert r.stderr.startswith(f"error: chaos run: {named} must be "), r.stderr
    assert " in [" in r.stderr or " in (" in r.stderr, r.stderr  # both ends of the range
    assert f", got {args[1]}\n" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not r.stdout


def test_a_rate_refusal_writes_its_bounds_as_the_other_limits_are_written():
    """``--rate 0`` said ``(0, 1e+06] requests/s`` where every other limit reads ``1,000,000`` (a fresh-user trial)."""
    r = _cli("run", "worker-crash", "--rate", "0")
    assert r.returncode == 2 and "--rate must be in (0, 1,000,000] requests/s, got 0" in r.stderr, \
        r.stderr
