"""The local topology's defaults (real nats-servers, Valkeys, region managers; no mocks).

* a topology started without a run dir keeps its logs after stop and says where;
* ``Client.connect`` keeps the server list's order (the local region's servers first).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from inferbus.bus import EmbeddedNats
from inferbus.client import Client
from inferbus.cluster import ClusterSpec, Topology

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return ("asyncio", {"use_uvloop": True})


@pytest.mark.timeout(150)
async def test_topology_without_run_dir_keeps_its_logs_and_says_where(capfd):
    topo = Topology(ClusterSpec(actors=False, cache=False, servers_per_region=1))
    run_dir = topo.run_dir
    try:
        await topo.start()
        await topo.wait_settled(60)
    finally:
        await topo.stop()
    try:
        err = capfd.readouterr().err
        assert re.search(rf"run dir {re.escape(str(run_dir))} \(a temp dir; logs are kept after stop\)", err), err
        assert f"logs kept in {run_dir}" in err, err
        assert (run_dir / "cluster.json").exists()
        assert (run_dir / "nodes" / "A" / "region.log").stat().st_size > 0
        assert any(p.stat().st_size > 0 for p in run_dir.glob("nats/W*/W*.log"))
        assert not list(run_dir.glob("nats/*/js"))  # the data goes, the logs stay
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.mark.timeout(60)
async def test_client_connect_keeps_the_server_list_order(tmp_path: Path):
    """Two unrelated servers; the second listed never gets a client while the first is up (randomized
    order would pick it half the time: 8 connects all on the first by chance is 1 in 256)."""
    with EmbeddedNats(run_dir=tmp_path / "n1") as first, EmbeddedNats(run_dir=tmp_path / "n2") as second:
        for _ in range(8):
            async with await Client.connect([first.url, second.url]) as c:
                assert c.nc.connected_url.port == first.port
        async with await Client.connect(f"{second.url},{first.url}") as c:
            assert c.nc.connected_url.port == second.port


@pytest.mark.parametrize("bad", [dict(witness_servers=1), dict(witness_servers=2), dict(servers_per_region=0)])
def test_cluster_spec_refuses_layouts_nats_server_cannot_start(bad):
    """A witness of 1 server cannot form the JetStream cluster the lease needs (nats-server exits at start):
    refused when the spec is built, with the reason, instead of a topology that never comes up."""
    with pytest.raises(ValueError, match="witness_servers in \\(3, 5\\)"):
        ClusterSpec(**bad)
    assert ClusterSpec(witness_servers=5).witness_servers == 5
