"""Placing a node's processes on cores (``NodeConfig.nats_cpus`` with ``pin_cpus``): the embedded nats-server on
its cores (also after the node restarts it), every actor process on the others, all real processes, and the node
answers right."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import MODELS, uvloop_backend as anyio_backend  # noqa: F401 (process-heavy: one loop)
from test_reliability_lib import reference
from inferbus._cpus import cores_phrase, cores_text, parse_cpu_list
from inferbus.actors import Node, NodeConfig
from inferbus.client import Client

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]
NCPU = os.cpu_count() or 1
USABLE = sorted(os.sched_getaffinity(0))  # the cores this process, and so the node, may run on


def _affinity_of_every_thread(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(t.name))) for t in Path(f"/proc/{pid}/task").iterdir()}


@pytest.mark.skipif(len(USABLE) < 2, reason="needs 2 cores: one for nats-server, one for the actors")
async def test_nats_server_on_its_cores_and_the_pinned_actors_on_the_others(tmp_path):
    nats_core = USABLE[-1]
    serving = [c for c in USABLE if c != nats_core]
    cfg = NodeConfig(models_dir=str(MODELS), models=("digits",), workers=1, ingress=1, no_cache=True, pin_cpus=True,
                     nats_cpus=(nats_core,), run_dir=str(tmp_path / "run"))
    async with Node(cfg) as node:
        assert node.serving_cores == tuple(serving)
        assert _affinity_of_every_thread(node.nats.pid) == {frozenset({nats_core})}
        worker, ingress = node.pid_of(f"worker:{node.worker_ids[0]}"), node.pid_of("ingress:0")
        # every thread of each process, not only the one that pinned it (2 of a worker's 4 threads stayed on every
        # core: a fresh-user trial), and the aggregator on the serving cores, off nats-server's
        assert _affinity_of_every_thread(worker) == {frozenset({serving[0]})}
        assert _affinity_of_every_thread(ingress) == {frozenset({serving[1 % len(serving)]})}
        assert _affinity_of_every_thread(node.pid_of("aggregator")) == {frozenset(serving)}
        x = np.random.default_rng(3).random((2, 64), dtype=np.float32)
        client = await Client.connect(node.nats_url)
        try:
            res = await client.infer("digits", {"pixels": x}, timeout_s=10)
        finally:
            await client.close()
        np.testing.assert_allclose(res["logits"], reference("digits", {"pixels": x})["logits"],
                                   rtol=1e-4, atol=1e-5)
        old = node.nats.pid  # the node's restart of a killed nats-server keeps it on its cores
        os.kill(old, signal.SIGKILL)
        await node.nats.wait_restarted(old)
        assert _affinity_of_every_thread(node.nats.pid) == {frozenset({nats_core})}


async def test_workers_0_is_one_per_core_left_by_nats_cpus(tmp_path):
    """With ``workers`` = 0 (one per core) a node that gives nats-server cores starts a worker per core left."""
    cfg = NodeConfig(models_dir=str(MODELS), workers=0, nats_cpus=(USABLE[0],), no_cache=True)
    assert Node(cfg).n_workers == max(len(USABLE) - 1, 1)
    assert Node(NodeConfig(models_dir=str(MODELS), workers=0, no_cache=True)).n_workers == len(USABLE)


@pytest.mark.parametrize("kw,said", [
    (dict(nats_cpus=(NCPU,)),
     f"NodeConfig.nats_cpus must be cores this process may run on ({cores_text(USABLE)}), got {NCPU}"),  # (was [{NCPU}], a list repr)
    (dict(nats_cpus=(USABLE[0],), nats_url="nats://127.0.0.1:4222"), "nats_cpus places the embedded nats-server, and "
                                                              "nats_url replaces it"),
    (dict(nats_cpus=tuple(USABLE), pin_cpus=True), "nats_cpus leaves no core for the pinned actors"),
])
def test_node_config_refuses_nats_cpus_that_cannot_apply(kw, said):
    with pytest.raises(ValueError) as ei:
        NodeConfig(models_dir=str(MODELS), **kw)
    assert said in str(ei.value)


@pytest.mark.parametrize("text,cores", [("0", (0,)), ("0-0", (0,)), ("0,0-0", (0,))])
def test_a_cpu_list_names_its_cores(text, cores):
    assert parse_cpu_list(text) == cores and cores_text(cores) == "0" and cores_phrase(cores) == "core 0"
    assert cores_text((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8" and cores_phrase((0, 1)) == "cores 0-1"


@pytest.mark.parametrize("text,said", [
    ("", "must be a CPU list (e.g."), ("1,", "must be a CPU list (e.g."), (" 0", "must be a CPU list (e.g."),
    ("+0", "must be a CPU list (e.g."), ("0 - 0", "must be a CPU list (e.g."), ("\u0661", "must be a CPU list (e.g."),
    ("-1", "must be a CPU list (e.g."), ("1-0", "must be a CPU list whose ranges run from a core to a later one, got '1-0'"),
    (str(NCPU), "must be cores this process may run on"),
    ("0-99999999999", "must be cores this process may run on"),  # refused before the range is made (it ate the memory)
])
def test_a_bad_cpu_list_is_refused_with_the_reason(text, said):
    t0 = time.monotonic()
    with pytest.raises(ValueError) as ei:
        parse_cpu_list(text)
    assert said in str(ei.value) and time.monotonic() - t0 < 1
