"""The CLI's main job, ``inferbus up``, as a user runs it (a subprocess, free ports, real servers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from inferbus.bus import free_port
from inferbus.client import Client

from conftest import ROOT
from test_reliability_lib import models_subset, reference

UP = [sys.executable, "-m", "inferbus.cli", "up"]
ENV = {**os.environ, "COLUMNS": "200"}


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
def anyio_backend(request):  # process-heavy tests: one loop is enough
    return request.param


@pytest.mark.timeout(90)
def test_up_demo_runs_the_checked_load_run_and_exits_0(tmp_path):
    models = models_subset(tmp_path / "models", ["digits"])
    out_json = tmp_path / "demo.json"
    argv = UP + ["--demo", "--demo-duration", "0.5", "--nats-port", str(free_port()), "--workers", "1",
                 "--no-cache", "--models", str(models), "--run-dir", str(tmp_path / "run"), "--json", str(out_json)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=80, cwd=ROOT, env=ENV)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert "wrong answers: 0" in out.stdout, out.stdout[-3000:]
    steps = json.loads(out_json.read_text())
    assert [s["mode"] for s in steps][-1] == "closed(hit)" and len(steps) == 4
    for s in steps:
        assert s["model"] == "digits" and s["wrong"] == 0 and not s["errors"], s
        assert s["ok"] == s["requests"] > 0, s


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_up_on_an_existing_nats_answers_and_leaves_it_running(nats_server, tmp_path):
    models = models_subset(tmp_path / "models", ["digits"])
    log = tmp_path / "up.log"
    argv = UP + ["--nats-url", nats_server.url, "--workers", "1", "--no-cache", "--models", str(models),
                 "--run-dir", str(tmp_path / "run"), "--prefix", "ext", "--max-backlog-msgs", "777"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while b"serving; Ctrl-C to stop" not in log.read_bytes():  # printed once its signal handlers are set
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        assert f"NATS {nats_server.url}" in log.read_text()  # no embedded server: the one given
        x = np.load(models / "digits" / "data" / "test.npz")["X"][:3].astype(np.float32)
        async with await Client.connect(nats_server.url, "ext") as client:
            out = await client.infer("digits", {"pixels": x}, timeout_s=5)
            assert (await client.health(timeout_s=5)).parameters["max_backlog_msgs"] == 777  # the flag reached it
        np.testing.assert_allclose(out["logits"], reference("digits", {"pixels": x})["logits"], rtol=1e-5, atol=1e-5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
        assert nats_server.proc.poll() is None  # up stops what it started, not the NATS it was given
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
