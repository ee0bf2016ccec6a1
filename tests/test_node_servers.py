"""The node supervises its embedded nats-server and Valkey (real processes, SIGKILLed; no mocks).

* ``inferbus up``: a SIGKILLed embedded nats-server is restarted on the same port, the exit is logged,
  the actors reconnect and requests through the SDK succeed again with correct answers; a SIGKILLed
  embedded Valkey is restarted on the same port and L2 fills resume.
* Past the servers' restart intensity the node escalates: it stops its children and ``inferbus up``'s
  serving loop returns 1 with the reason.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from inferbus.bus import free_port
from inferbus.client import Client

from conftest import ROOT, embedded_valkey_url, uvloop_backend as anyio_backend  # noqa: F401 (anyio_backend: uvloop only)
from test_reliability_lib import models_subset, reference

pytestmark = [pytest.mark.anyio]
ENV = {**os.environ, "COLUMNS": "200"}


def _pids_of(binary: str, marker: str) -> list[int]:
    """Pids of live processes whose argv[0] ends with ``binary`` and whose command line contains ``marker``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and argv[0].decode(errors="replace").endswith(binary) \
                and marker.encode() in b" ".join(argv):
            out.append(int(d.name))
    return out


def _children_named(parent: int, comm: str) -> list[int]:
    """Live child processes of ``parent`` whose name (``/proc/<pid>/comm``) starts with ``comm``
    (valkey-server rewrites its command line, so it is found by parent and name)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            name = (d / "comm").read_text().strip()
        except (OSError, IndexError):
            continue
        if stat[0] != "Z" and int(stat[1]) == parent and name.startswith(comm):
            out.append(int(d.name))
    return out


async def _until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def _answers_again(client: Client, x: np.ndarray, timeout_s: float) -> dict:
    """Send requests until one succeeds (each one 1 s at most); return its outputs."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            return await client.infer("digits", {"pixels": x}, timeout_s=1.0)
        except Exception as exc:  # DEADLINE_EXCEEDED / UNAVAILABLE while the bus is back
            last = exc
            await asyncio.sleep(0.05)
    raise AssertionError(f"no successful request within {timeout_s} s after the restart; last error {last!r}")


def _listening(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _stops_clean(proc: subprocess.Popen, run_dir: Path, log: Path) -> None:
    """SIGTERM ``inferbus up``: exit 0, and no nats-server or Valkey of it left."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, log.read_text()[-3000:]
    assert not _pids_of("nats-server", str(run_dir)) and not _children_named(proc.pid, "valkey-server")


def _reap(proc: subprocess.Popen) -> None:
    """Kill what is left of ``proc``'s session (a failed test's ``inferbus up``)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _start_up(tmp_path: Path, port: int) -> tuple[subprocess.Popen, Path, Path, Path]:
    # a long TTL: the L2 entries stay until the test looks (digits' own is 100 ms)
    models = models_subset(tmp_path / "models", ["digits"], {"digits": {"cache_ttl_ms": 600_000}})
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    argv = [sys.executable, "-m", "inferbus.cli", "up", "--nats-port", str(port), "--workers", "1",
            "--models", str(models), "--run-dir", str(run_dir), "--prefix", "emb"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV, start_new_session=True)
    return proc, run_dir, log, models


@pytest.mark.timeout(150)
async def test_up_restarts_its_killed_nats_server_and_valkey_on_the_same_ports(tmp_path):
    import redis.asyncio as aioredis

    port = free_port()
    proc, run_dir, log, models = _start_up(tmp_path, port)
    try:
        await _until(lambda: proc.poll() is not None or b"serving; Ctrl-C to stop" in log.read_bytes(), 90,
                     "inferbus up serving")
        assert proc.poll() is None, log.read_text()[-3000:]
        data = np.load(models / "digits" / "data" / "test.npz")["X"]
        xs = [data[i:i + 1].astype(np.float32) for i in range(40)]
        async with await Client.connect(f"nats://127.0.0.1:{port}", "emb") as client:
            out = await client.infer("digits", {"pixels": xs[0]}, timeout_s=5)
            np.testing.assert_allclose(out["logits"], reference("digits", {"pixels": xs[0]})["logits"],
                                       rtol=1e-5, atol=1e-5)

            # --- NATS: SIGKILL; restarted on the same port, actors reconnect, answers correct
            [nats_pid] = _pids_of("nats-server", str(run_dir / "nats") + "/")
            os.kill(nats_pid, signal.SIGKILL)
            new = await _until(lambda: [p for p in _pids_of("nats-server", str(run_dir / "nats") + "/")
                                        if p != nats_pid], 20, "a new nats-server")
            assert f"nats-{port}.conf" in Path(f"/proc/{new[0]}/cmdline").read_text()  # same config, same port
            await _until(lambda: _listening(port), 20, "nats-server listening on the same port")
            for x in xs[1:4]:
                out = await _answers_again(client, x, 20)
                np.testing.assert_allclose(out["logits"], reference("digits", {"pixels": x})["logits"],
                                           rtol=1e-5, atol=1e-5)
            text = log.read_text()
            assert f"embedded nats on port {port} exited: killed by signal 9 (SIGKILL)" in text, text[-3000:]
            assert f"embedded nats restarted on port {port}" in text, text[-3000:]

            # --- Valkey: SIGKILL; restarted on the same port, empty (a cache), L2 fills resume
            [vk_pid] = _children_named(proc.pid, "valkey-server")
            [vk_log] = (run_dir / "valkey").glob("valkey-*.log")
            vk_port = int(vk_log.stem.split("-")[1])
            vk = aioredis.from_url(embedded_valkey_url(run_dir))
            deadline = time.monotonic() + 20
            while await vk.dbsize() == 0:  # the answers above are filled into L2 (by the aggregator, async)
                assert time.monotonic() < deadline, "no L2 fill before the Valkey kill"
                await asyncio.sleep(0.05)
            os.kill(vk_pid, signal.SIGKILL)
            await _until(lambda: [p for p in _children_named(proc.pid, "valkey-server") if p != vk_pid], 20,
                         "a new valkey-server")
            await _until(lambda: _listening(vk_port), 20, "valkey-server listening on the same port")
            await vk.connection_pool.disconnect()
            assert await vk.dbsize() == 0  # a new, empty server on that port
            deadline = time.monotonic() + 20
            i = 4
            while await vk.dbsize() == 0:  # new inputs (misses) are computed and filled into L2 again
                assert time.monotonic() < deadline, "no L2 fill after the Valkey restart"
                x = xs[i % len(xs)]
                out = await _answers_again(client, x, 10)
                np.testing.assert_allclose(out["logits"], reference("digits", {"pixels": x})["logits"],
                                           rtol=1e-5, atol=1e-5)
                i += 1
                await asyncio.sleep(0.1)
            await vk.aclose()
            text = log.read_text()
            assert f"embedded valkey on port {vk_port} exited: killed by signal 9 (SIGKILL)" in text, text[-3000:]
        _stops_clean(proc, run_dir, log)
    finally:
        _reap(proc)


_ESCALATE = """
import sys
from inferbus.actors import NodeConfig
from inferbus.cli import _run, _up
cfg = NodeConfig(models_dir=sys.argv[1], workers=1, nats_port=int(sys.argv[2]), run_dir=sys.argv[3], prefix="esc",
                 server_intensity=1, server_period_s=60.0)
sys.exit(_run(_up(cfg, False, 0.0, None)))
"""


@pytest.mark.timeout(120)
async def test_a_server_dying_past_the_intensity_stops_the_node_with_exit_1(tmp_path):
    """intensity 1 in 60 s: the first SIGKILL is restarted, the second escalates."""
    models = models_subset(tmp_path / "models", ["digits"])
    port, run_dir, log = free_port(), tmp_path / "run", tmp_path / "up.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", _ESCALATE, str(models), str(port), str(run_dir)], stdout=fh,
                                stderr=subprocess.STDOUT, cwd=ROOT, env=ENV, start_new_session=True)
    try:
        await _until(lambda: proc.poll() is not None or b"serving; Ctrl-C to stop" in log.read_bytes(), 90,
                     "serving")
        assert proc.poll() is None, log.read_text()[-3000:]
        marker = str(run_dir / "nats") + "/"
        [first] = _pids_of("nats-server", marker)
        actors = [p for p in _pids_of(Path(sys.executable).name, str(run_dir)) if p != proc.pid]
        assert len(actors) == 3, actors  # aggregator, worker, ingress
        os.kill(first, signal.SIGKILL)
        [second] = await _until(lambda: [p for p in _pids_of("nats-server", marker) if p != first], 20,
                                "the restarted nats-server")
        await _until(lambda: _listening(port), 20, "the restarted nats-server listening")
        assert proc.poll() is None  # one restart is within the intensity
        os.kill(second, signal.SIGKILL)
        rc = await asyncio.to_thread(proc.wait, 60)
        text = log.read_text()
        assert rc == 1, text[-3000:]
        assert "the embedded servers restarted too often, the node stops" in text, text[-3000:]
        assert "the actors are killed: their bus is gone" in text, text[-3000:]  # not drained one by one, 3 s each
        assert "inferbus up stopped" in text and "reached max restart intensity" in text, text[-3000:]
        # its children were stopped before it exited: no server, no actor process left
        assert not _pids_of("nats-server", str(run_dir)) and not _children_named(proc.pid, "valkey-server")
        assert not [p for p in _pids_of(Path(sys.executable).name, str(run_dir)) if p != proc.pid]
    finally:
        _reap(proc)


_CACHE_ESCALATE = """
import sys
from inferbus.actors import NodeConfig
from inferbus.cli import _run, _up
cfg = NodeConfig(models_dir=sys.argv[1], workers=1, nats_port=int(sys.argv[2]), run_dir=sys.argv[3], prefix="cesc",
                 server_intensity=1, server_period_s=60.0, cache_restart_backoff_s=3.0)
sys.exit(_run(_up(cfg, False, 0.0, None)))
"""


@pytest.mark.timeout(150)
async def test_a_valkey_crash_loop_costs_the_cache_for_a_while_not_the_bus_nor_any_answer(tmp_path):
    """A fresh-user trial: Valkey SIGKILLed 6 times in 2 s under load made the servers' one supervisor (nats-server
    and Valkey, one restart budget) escalate, which stopped the node's nats-server: 1,014 of 1,801 requests failed,
    and ``up`` exited 9-12 s later. Valkey now has a supervisor of its own: past its intensity (1 in 60 s here) the
    node serves on without the shared cache, the same nats-server, every answer right, and starts Valkey again on
    the same port after ``cache_restart_backoff_s`` (3 s), where L2 fills resume."""
    import redis.asyncio as aioredis

    models = models_subset(tmp_path / "models", ["digits"], {"digits": {"cache_ttl_ms": 600_000}})
    port, run_dir, log = free_port(), tmp_path / "run", tmp_path / "up.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", _CACHE_ESCALATE, str(models), str(port), str(run_dir)],
                                stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV, start_new_session=True)
    try:
        await _until(lambda: proc.poll() is not None or b"serving; Ctrl-C to stop" in log.read_bytes(), 90,
                     "serving")
        assert proc.poll() is None, log.read_text()[-3000:]
        [nats_pid] = _pids_of("nats-server", str(run_dir / "nats") + "/")
        [vk_log] = (run_dir / "valkey").glob("valkey-*.log")
        vk_port = int(vk_log.stem.split("-")[1])
        data = np.load(models / "digits" / "data" / "test.npz")["X"]
        def xs(k: int) -> np.ndarray:  # a new input for each k (a repeat would be an L1 hit: no miss, no L2 fill)
            return data[k % len(data)][None].astype(np.float32) + np.float32(k // len(data)) * np.float32(1e-3)
        answered = 0

        async def right(client, x) -> None:
            nonlocal answered
            out = await client.infer("digits", {"pixels": x}, timeout_s=2.0)
            np.testing.assert_allclose(out["logits"], reference("digits", {"pixels": x})["logits"],
                                       rtol=1e-5, atol=1e-5)
            answered += 1

        async with await Client.connect(f"nats://127.0.0.1:{port}", "cesc") as client:
            await right(client, xs(0))
            first = _children_named(proc.pid, "valkey-server")
            os.kill(first[0], signal.SIGKILL)
            second = await _until(lambda: [p for p in _children_named(proc.pid, "valkey-server") if p != first[0]],
                                  20, "the restarted valkey-server")
            os.kill(second[0], signal.SIGKILL)  # past the intensity
            await _until(lambda: b"the embedded valkey restarted too often" in log.read_bytes(), 20,
                         "the cache's escalation")
            # the backoff: no valkey-server, the same nats-server, and every request answered right
            t_down = time.monotonic()
            k = 1
            while time.monotonic() - t_down < 2.0:
                assert not _children_named(proc.pid, "valkey-server")
                await right(client, xs(k))  # (an idle box answers more than 200 in the 2 s)
                k += 1
            assert proc.poll() is None and _pids_of("nats-server", str(run_dir / "nats") + "/") == [nats_pid]
            # started again on the same port; new misses are filled into it again
            await _until(lambda: b"embedded valkey started again" in log.read_bytes(), 20, "valkey started again")
            await _until(lambda: _listening(vk_port), 20, "valkey-server listening on the same port")
            vk = aioredis.from_url(embedded_valkey_url(run_dir))
            deadline = time.monotonic() + 20
            while await vk.dbsize() == 0:
                assert time.monotonic() < deadline, "no L2 fill after valkey started again"
                await right(client, xs(k))
                k += 1
                await asyncio.sleep(0.1)
            await vk.aclose()
        assert answered == k, (answered, k)
        # the aggregator's failed fills: the first of the outage and a line when they resume (not one line per failed
        # batch, as before: 99 here)
        text = (run_dir / "aggregator.log").read_text()
        assert 1 <= text.count("aggregator: cache fill failed") <= 2 and "cache fills resumed" in text, text[-3000:]
        _stops_clean(proc, run_dir, log)
    finally:
        _reap(proc)


async def test_a_node_joined_to_a_nats_that_stops_says_so_once_and_when_it_is_back(nats_server, tmp_path):
    """A node joined to a NATS it does not run (``--nats-url``: another node's embedded server, or one of the
    operator's) said nothing in node.log nor on ``up``'s stderr while that server was stopped or restarted; only its
    actors' own logs did (a fresh-user trial: 2-4 s outages while the node carrying the embedded NATS restarted,
    118-301 requests failed, the joined node's log silent). Now one WARNING when the node's connection is lost and
    one when it is back, with how long; none when the node itself stops; and it serves again with no action."""
    from conftest import start_deployment

    dep = start_deployment(tmp_path / "dep", workers=1, prefix="lost", extra=[
        "--nats-url", nats_server.url, "--no-cache", "--model", "digits"])
    try:
        node_log = dep.run_dir / "node.log"

        async def wait_for(text: str, where: Path, timeout_s: float = 20.0) -> None:
            deadline = time.monotonic() + timeout_s
            while text not in where.read_text():
                assert time.monotonic() < deadline, (text, where.read_text()[-3000:])
                await asyncio.sleep(0.05)

        nats_server.stop()
        await wait_for("node n1: lost its NATS connection", node_log)
        await wait_for("node n1: lost its NATS connection", dep.log)  # up's stderr
        await asyncio.sleep(1.0)
        nats_server.start()
        await wait_for("node n1: reconnected to NATS (", node_log)
        client = await Client.connect(nats_server.url, "lost")
        try:
            deadline = time.monotonic() + 30
            while True:  # the actors reconnect by themselves; the worker's next report makes the model ready
                try:
                    res = await client.infer_result("digits", {"pixels": np.zeros((1, 64), np.float32)}, timeout_s=2)
                    break
                except Exception:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            assert res.outputs
        finally:
            await client.close()
    finally:
        dep.stop()
    text = node_log.read_text()
    assert text.count("lost its NATS connection") == 1 and text.count("node n1: reconnected to NATS (") == 1, text[-3000:]
