"""Cluster drills on one shared local two-region topology (real nats-servers, gateways through fault
proxies, Valkeys, actor processes; no mocks), short versions with their figures asserted:

* nats-node-loss: SIGKILL the nats-server every connection of the primary region uses, under load;
* gateway-degrade: 50 ms latency + 5 % packet loss on the A<->B gateways, under load;
* region-partition on a degraded WAN (the gateway options of the region drills);
* the topology soak, briefly, over the cluster faults.

Bounds are looser than the figures measured in docs/reliability.md: this 2-core box is shared.
nats-node-loss must not fail over: the region managers' lease traffic goes straight to the witness
(docs/regions.md), so the term must not change; it may still lose a request or two on a busy box
(a stall of the drill process, which also runs the gateway proxies), so availability >= 98 %.
"""

from __future__ import annotations

import json
import os

import pytest

from chaos.node_drills import DrillOptions
from chaos.region_drills import RegionDrillOptions, region_partition
from chaos.topology_drills import GatewayDrillOptions, gateway_degrade, nats_node_loss, soak_topology
from inferbus.cluster import ClusterSpec

from conftest import check_fault_phases, settled_topology

pytestmark = pytest.mark.anyio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")


@pytest.fixture(scope="module")
def anyio_backend():
    return ("asyncio", {"use_uvloop": True})


@pytest.fixture(scope="module")
async def topo(anyio_backend, tmp_path_factory):
    async for t in settled_topology(ClusterSpec(workers=1, audit=True, models_dir=MODELS, models=("digits",), health_timeout_s=1.0), tmp_path_factory.mktemp("chaos-topology")):
        yield t


def _common(f, near_events_s: float | None = None, in_flight_at_fault: bool = False) -> dict:
    """The checks every drill passes. Duplicates: none; with ``near_events_s`` at most 2, each sent within that
    many seconds of one of the drill's ``fault_events_at_s`` (a cut or heal of the gateways; see the partition
    test); with ``in_flight_at_fault`` at most 1, one in flight when the fault began (see the nats-node-loss test)."""
    d = f.to_dict()
    print(f"\n{f.drill}: {json.dumps(d, default=str)}")
    assert f.requests > 0 and f.wrong == 0, d
    assert f.extra["duplicates_on_one_worker"] == 0, d  # a worker's recent results answer a copy it ran already
    if in_flight_at_fault:
        assert f.duplicates == f.extra.get("duplicates_in_flight_at_fault", 0) <= 1, d
    elif near_events_s is None:
        assert f.duplicates == 0, d
    else:
        events, dups = f.extra["fault_events_at_s"], f.extra.get("duplicates_sent_at_s", [])
        assert f.duplicates <= 2 and all(any(abs(t - e) <= near_events_s for e in events) for t in dups), d
    # The audit travels over core NATS (at most once): when a drill kills the nats-server a worker is
    # connected to, the audit messages in that connection's buffer are lost with it, so a few executions
    # can go unaudited (seen: 799 audited for 800 answers). The duplicate count is then a lower bound.
    assert f.extra["executions_audited"] >= f.ok - max(2, f.ok // 100), d
    return d


@pytest.mark.timeout(120)
async def test_nats_node_loss(topo):
    f = await nats_node_loss(RegionDrillOptions(duration_s=5.0, rate_qps=50, fault_at_s=1.5, node_down_s=1.0,
                                                models_dir=MODELS), topology=topo)
    # a request in flight when its nats-server died ran twice in a CI run (2026-12-06: 1 of 250, sent 40 ms after
    # the kill; not traced: likely the worker ran it, its answer died with the server, and the SDK's retry reached an
    # ingress that did not find the first copy in time, e.g. the other region's, which can answer the retry probe
    # first). At most one such duplicate is allowed; any other fails the test. Not reproduced since in 16 runs on the
    # 2-core box (8 of them beside two busy loops); the audit names its workers now (duplicates_detail in the JSON
    # printed above), so a next occurrence shows where each copy ran, and one worker running it twice fails _common.
    d = _common(f, in_flight_at_fault=True)
    x = d["extra"]
    assert f.availability >= 0.98, d["errors"]
    # no needless failover: neither the term nor the primary moved after the kill (the CI run of 2026-11-30 saw
    # the lease move to B ~2.5 s after set-up, before the kill, on a loaded 2-core box: failover_before_fault)
    assert not x["term_changed"] and x["primary_after"] == x["primary_at_fault"] is not None, x["region_events"]
    assert f.detection_ms is not None and f.detection_ms <= 1000  # a connection of the region is back elsewhere
    assert x["client_reconnect_ms"] is not None and x["actors_reconnected_ms"] is not None
    assert set(x["connections_on_killed_server"]) >= {"inferbus-client", "ingress-a-i0", "worker-a-w0"}
    assert f.recovery_ms is not None and f.recovery_ms <= 1000 + 10_000  # restarted after 1 s, rejoined
    assert x["overlapping_reigns"] == 0
    # the kill 1.5 s after the load's first request (at the earliest), the server down 1 s at least
    check_fault_phases(d, fault_at_s=1.5, rate_qps=50, lasts_s=1.0)
    await topo.wait_settled(30)


@pytest.mark.timeout(90)
async def test_gateway_degrade(topo):
    f = await gateway_degrade(GatewayDrillOptions(duration_s=5.0, rate_qps=50, fault_at_s=1.0, fault_s=3.0,
                                                  models_dir=MODELS), topology=topo)
    d = _common(f)
    x = d["extra"]
    assert x["gateway_latency_ms"] == 50 and x["gateway_drop_pct"] == 5 and x["gateway_links"] == "regions"
    assert f.availability >= 0.99, d["errors"]
    assert x["gateway_chunks_retransmitted"] >= 1  # the loss really happened
    assert x["term_changes"] == 0 and x["max_primaries_sampled"] == 1 and x["overlapping_reigns"] == 0, x


def check_gateway_degrade_times(d: dict, *, duration_s: float, fault_at_s: float, fault_s: float,
                                rate_qps: float, slack_s: float = 5.0) -> None:
    """The times a gateway-degrade report (``--json``'s object, ``d``) gives against those it was asked for: the
    asked ones echoed; the load lengthened to a second past the fault's planned end when ``duration_s`` was shorter;
    every planned request sent (an open loop: ``duration * rate``, the last due within an interval or two of the
    end); the degrade injected no earlier than ``fault_at_s`` into the load and lasting at least ``fault_s``, and
    neither more than ``slack_s`` later or longer (a generous bound for a shared box: the drill process also runs
    the gateway proxies and the load)."""
    x = d["extra"]
    total = max(duration_s, fault_at_s + fault_s + 1.0)
    assert (x["duration_asked_s"], x["fault_at_s"], x["fault_s"], x["rate_qps"]) == (
        duration_s, fault_at_s, fault_s, rate_qps), x
    assert x["duration_s"] == pytest.approx(total), x
    # (± 1: the open loop compares float times with the end)
    assert abs(d["requests"] - total * rate_qps) <= 1, (d["requests"], total, rate_qps)
    assert total - 2.0 / rate_qps <= x["last_request_sent_at_s"] <= total, x
    check_fault_phases(d, fault_at_s=fault_at_s, rate_qps=rate_qps, lasts_s=fault_s, slack_s=slack_s)
    healed, lasted = x["fault_healed_at_s"], x["fault_lasted_s"]
    assert lasted <= fault_s + slack_s, x
    # the requests due while it lasted: the open loop's rate over the degrade (± the two ends' requests)
    assert abs(x["requests_during_fault"] - lasted * rate_qps) <= 2 or healed > x["last_request_sent_at_s"], x
    assert d["p99_ms_during_fault"] is not None, d


@pytest.mark.timeout(90)
async def test_gateway_degrade_reports_the_times_it_was_asked_for(topo):
    """A CI-sized gateway-degrade (a 1 s load, the degrade 0.5 s into it for 1.5 s: the load lengthened to 3 s):
    what its JSON says about times is what was asked, the phases it recorded included (no figure of it had a test:
    a degrade healed at once, injected late or a load not lengthened passed)."""
    f = await gateway_degrade(GatewayDrillOptions(duration_s=1.0, rate_qps=20, fault_at_s=0.5, fault_s=1.5,
                                                  gateway_latency_ms=20, gateway_drop_pct=1, models_dir=MODELS),
                              topology=topo)
    d = json.loads(json.dumps(f.to_dict(), default=str))  # what `inferbus chaos run gateway-degrade --json` prints
    print(f"\ngateway-degrade: {json.dumps(d)}")
    check_gateway_degrade_times(d, duration_s=1.0, fault_at_s=0.5, fault_s=1.5, rate_qps=20)
    assert d["extra"]["gateway_latency_ms"] == 20 and d["extra"]["gateway_drop_pct"] == 1
    assert f.wrong == 0 and f.availability >= 0.95, d["errors"]


@pytest.mark.timeout(120)
async def test_region_partition_on_a_degraded_wan(topo):
    f = await region_partition(RegionDrillOptions(duration_s=2.0, fault_at_s=1.0, partition_s=1.5, rate_qps=50,
                                                  gateway_latency_ms=20, gateway_drop_pct=2, models_dir=MODELS),
                               topology=topo)
    # one request of 250 ran on two workers in a clean-clone CI run (2026-12-04), sent at 4.3 s, right after the
    # isolation healed, and answered in under 30 ms (no attempt timed out). Not explained yet (docs/regions.md); the
    # retry trade of docs/failure-semantics.md allows a copy that lands on another worker to run again, so a
    # duplicate next to a gateway cut or heal is tolerated, anywhere else it fails
    d = _common(f, near_events_s=f.extra["timeout_ms"] / 1000)
    x = d["extra"]
    assert x["gateway_latency_ms"] == 20 and x["gateway_drop_pct"] == 2
    assert x["max_primaries_sampled"] == 1 and x["overlapping_reigns"] == 0 and x["terms_shared_by_regions"] == 0
    assert x["takeover_after_isolation"], x
    # the regions' cut 1 s after the load's first request (at the earliest), healed after the isolation: two phases
    # of 1.5 s at least
    check_fault_phases(d, fault_at_s=1.0, rate_qps=50, lasts_s=3.0)
    await topo.wait_settled(30)


@pytest.mark.timeout(120)
async def test_topology_soak_short(topo):
    f = await soak_topology(DrillOptions(duration_s=16.0, rate_qps=50, fault_every_s=4.0, hang_s=1.0,
                                         models_dir=MODELS, faults=("model-swap", "kill-nats-node", "gateway-degrade",
                                                                    "kill-worker")),
                            topology=topo)
    d = _common(f)
    x = d["extra"]
    assert [e["fault"] for e in x["faults"]][:3] == ["kill-nats-node", "gateway-degrade", "kill-worker"], x["faults"]
    assert "model-swap" in x["faults_unavailable"]
    assert not any("heal_error" in e for e in x["faults"]), x["faults"]
    assert f.availability >= 0.95, d["errors"]
    assert x["max_primaries_sampled"] <= 1 and x["overlapping_reigns"] == 0 and x["terms_shared_by_regions"] == 0
    names = set(x["rss_kib"])
    assert {"drill", "A/nats:A1", "W/nats:W1", "A/valkey:A", "A/node:A", "A/worker:a-w0", "B/ingress:0"} <= names
    assert all(v["max_kib"] > 0 for v in x["rss_kib"].values())


@pytest.mark.timeout(120)
async def test_hung_only_worker_of_a_region_no_duplicates(topo):
    """hang-worker with ONE worker per region (the shared topology): the SDK's attempt timeout retries the
    requests held by the frozen worker, the ingress sends those retries to the other region's worker and
    cancels the old copies, and the thawed worker's stall fence refuses what it read while frozen, so
    nothing it read runs twice (docs/reliability.md, gap 3). A request the freeze caught mid-computation could
    (docs/failure-semantics.md, "A worker that freezes"); at 50 requests/s that has not been seen here."""
    f = await soak_topology(DrillOptions(duration_s=14.0, rate_qps=50, fault_every_s=5.0, hang_s=2.0,
                                         models_dir=MODELS, faults=("hang-worker",)), topology=topo)
    d = _common(f)  # 0 wrong, 0 duplicates
    x = d["extra"]
    assert [e["fault"] for e in x["faults"]] == ["hang-worker", "hang-worker"], x["faults"]
    assert f.availability >= 0.98, (d["errors"], x.get("failed_sent_at_s"))
    await topo.wait_settled(30)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_topology_soak_every_fault_kind():
    """Every fault kind of the topology once (about two minutes; ``pytest -m slow -n 0``)."""
    from chaos.topology_drills import TOPOLOGY_SOAK_CYCLE

    # its own topology with 2 workers per region (the soak's default): with one, a hung worker's requests
    # are retried on the other region and run again when it resumes within their budget (duplicates)
    f = await soak_topology(DrillOptions(duration_s=120.0, rate_qps=50, fault_every_s=9.0, hang_s=1.5, workers=2,
                                         models_dir=MODELS))
    d = _common(f)
    x = d["extra"]
    injected = {e["fault"] for e in x["faults"]}
    assert injected == set(TOPOLOGY_SOAK_CYCLE) - {"model-swap"}, x["faults"]
    assert set(x["faults_unavailable"]) == {"model-swap"}
    assert not any("heal_error" in e for e in x["faults"]), x["faults"]
    assert f.availability >= 0.98, d["errors"]
    assert x["max_primaries_sampled"] <= 1 and x["overlapping_reigns"] == 0 and x["terms_shared_by_regions"] == 0
