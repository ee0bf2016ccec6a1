"""What an operator runs into around a node: a run dir two nodes were given, the metrics endpoint's address.

Real ``inferbus up`` processes, nothing mocked."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from conftest import MODELS, ROOT, start_deployment

pytestmark = pytest.mark.timeout(120)



@contextlib.contextmanager
def _group_killed_after(proc: subprocess.Popen):
    """Around a test's use of ``proc`` (started with ``start_new_session``): its process group killed (SIGKILL) when
    the block leaves it running, a failed assertion included, so that no node outlives its test."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

def _up(*args: str, timeout_s: float = 40) -> subprocess.CompletedProcess:
    """``inferbus up ARGS`` run to its end (killed with its process group past ``timeout_s``: a node that serves)."""
    proc = subprocess.Popen([sys.executable, "-m", "inferbus.cli", "up", "--models", str(MODELS), "--nats-port", "0",
                             "--workers", "1", "--no-cache", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, start_new_session=True, env={**os.environ, "COLUMNS": "200"})
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"inferbus up {' '.join(args)} still ran after {timeout_s} s: {out[-1500:]} {err[-1500:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_second_up_on_a_run_dir_in_use_is_refused_and_writes_nothing_there(tmp_path):
    """A fresh-operator trial: a second ``inferbus up --run-dir D`` while a node served from D started and served,
    overwriting the first node's actor configs (``worker-n1-w0.config.json``: its NATS URL), flight records and
    logs; the first node's next restart of that worker read the other node's config and connected to its (by then
    stopped) NATS, in a crash loop (``NoServersError`` at each start). Now the second one is refused before it starts
    or writes anything: one line naming the folder and the node that has it, exit 2; the lock goes with the node."""
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="rundir")
    try:
        before = {p.name: p.read_bytes() for p in dep.run_dir.iterdir()
                  if p.is_file() and (p.name.endswith(".config.json") or p.name == "node.log")}
        assert "worker-n1-w0.config.json" in before, sorted(before)
        r = _up("--run-dir", str(dep.run_dir), "--prefix", "rundir2")
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert (f"error: up: run dir '{dep.run_dir}' is in use by another node (pid {dep.proc.pid})"
                in r.stderr), r.stderr
        assert "inferbus up in" not in r.stdout, r.stdout
        after = {name: (dep.run_dir / name).read_bytes() for name in before}
        assert after == before  # configs untouched; node.log has no record of a second start
    finally:
        dep.stop()
    # released when the node stopped: another node starts there (and stops: a SIGINT once it is up)
    proc = subprocess.Popen([sys.executable, "-m", "inferbus.cli", "up", "--models", str(MODELS), "--nats-port", "0",
                             "--workers", "1", "--no-cache", "--run-dir", str(dep.run_dir), "--prefix", "rundir3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    with _group_killed_after(proc):
        line = proc.stdout.readline()
        assert line.startswith("inferbus up in"), (line, proc.stderr.read() if proc.poll() is not None else "")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_the_metrics_line_of_an_ipv6_host_is_a_url(tmp_path):
    """``up --metrics-host ::1`` served on ::1 but printed ``metrics http://::1:45959/metrics``, which no scraper or
    browser reads as a host and a port; an IPv6 address goes in brackets (RFC 3986): ``http://[::1]:45959/metrics``."""
    import re
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "inferbus.cli", "up", "--models", str(MODELS), "--nats-port", "0",
                             "--workers", "1", "--no-cache", "--run-dir", str(tmp_path / "run"), "--metrics-port", "0",
                             "--metrics-host", "::1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, start_new_session=True, env={**os.environ, "COLUMNS": "200"})
    with _group_killed_after(proc):
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert lines[0].startswith("inferbus up in"), lines
        m = re.fullmatch(r"  metrics (http://\S+/metrics)\n", lines[1])
        assert m and m.group(1).startswith("http://[::1]:"), lines
        with urllib.request.urlopen(m.group(1), timeout=10) as resp:
            assert resp.status == 200 and b"inferbus_actor_up" in resp.read()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0


def test_a_metrics_host_that_is_not_here_is_refused_before_anything_starts_with_port_0_too(tmp_path):
    """``--metrics-port 0 --metrics-host 192.0.2.1`` (an address of no interface here) skipped the check a taken port
    gets: the node started its nats-server and every actor, then failed to bind, stopped them all and said
    ``--metrics-port: cannot serve metrics on ...`` ~4 s later. Now it is the same one line as a taken port's, before
    anything starts (no node.log in the run dir, which is taken away again as the refusal made it)."""
    run = tmp_path / "run"
    r = _up("--run-dir", str(run), "--metrics-port", "0", "--metrics-host", "192.0.2.1")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "error: up: --metrics-port 0: cannot listen on 192.0.2.1:0: " in r.stderr, r.stderr
    assert not (run / "node.log").exists() and not (run / "nats").exists()
