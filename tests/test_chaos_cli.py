"""``inferbus chaos run`` as a CI job uses it: its exit status and its signals (a fresh-user trial of 2026-12-05).

Real drills on real processes, kept short: each starts its own ``inferbus up`` node."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, processes_naming

pytestmark = pytest.mark.timeout(120)


def _chaos(*args: str, timeout_s: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferbus.cli", "chaos", "run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s)


def test_a_soak_whose_every_fault_is_unavailable_here_says_so_and_exits_3():
    """``soak --faults kill-nats-node`` on one node (a topology fault) injected nothing and reported a clean pass,
    availability 1.0, exit 0; the reason was only in its JSON. docs/reliability.md: 3, "cannot run here (its fault is
    unavailable on that target ...), with the reason on stderr"."""
    t0 = time.monotonic()
    p = _chaos("soak", "--faults", "kill-nats-node", "--duration", "60", "--fault-every", "1", "--rate", "50", "--json")
    took_s = time.monotonic() - t0
    assert p.returncode == 3, (p.returncode, p.stdout[-500:], p.stderr[-1500:])
    # said once the fault proved unavailable, not after the whole 60 s (a fresh-user trial, 2026-12-05)
    assert took_s < 40, took_s
    assert "drill soak: unavailable: no fault it was given can run here: kill-nats-node: needs a multi-server " \
           "topology" in p.stderr, p.stderr
    assert not p.stdout, p.stdout  # no figures of a soak that soaked nothing


def test_min_availability_fails_a_drill_that_failed_requests():
    """A drill that failed requests (one worker hung: 53 of 300 in the trial) exited 0, so availability could not gate
    CI while ``bench`` fails on UNAVAILABLE. ``--min-availability A`` makes it exit 1 under A; without it, failed
    requests are reported and only wrong answers or duplicates fail the drill, as documented."""
    p = _chaos("worker-hang", "--workers", "1", "--duration", "4", "--rate", "50", "--hang-s", "2", "--json",
               "--min-availability", "0.99")
    d = json.loads(p.stdout)
    assert d["wrong"] == 0 and d["failed"] > 0 and d["availability"] < 0.99, d
    assert p.returncode == 1 and f"availability {d['availability']} is under --min-availability 0.99" in p.stderr, \
        (p.returncode, p.stderr[-1000:])


def test_a_drill_that_answered_no_request_right_fails():
    """A fresh-user trial: ``--timeout-s 1e-9`` failed 2,000 of 2,000 requests (DEADLINE_EXCEEDED) and the drill
    exited 0, its fault measured on no answer at all. A drill that answered none right exits 1 with one line, as
    bench fails a step that answered nothing; the figures are still printed."""
    p = _chaos("worker-crash", "--workers", "1", "--duration", "2", "--rate", "20", "--timeout-s", "1e-9", "--json")
    d = json.loads(p.stdout)
    assert d["requests"] > 0 and d["ok"] == 0 and d["availability"] == 0, d
    assert p.returncode == 1 and "drill worker-crash: no request was answered right" in p.stderr, \
        (p.returncode, p.stderr[-1000:])


def test_sigterm_stops_a_drill_and_its_deployment(tmp_path):
    """SIGTERM's default action killed ``chaos run`` alone in 0.02-0.11 s (exit 143): its actor processes lived on for
    1-5 s and its temporary folders stayed. It now stops the drill's deployment first, says so, and exits 143."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "inferbus.cli", "chaos", "run", "worker-crash", "--duration", "20",
                             "--run-dir", str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        while len(processes_naming(str(run_dir))) < 3:  # the node's servers and actors are up
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (proc.returncode, err[-1500:])
    assert "drill worker-crash: stopped by SIGTERM" in err and "Traceback" not in err, err[-1500:]
    assert not out, out
    assert processes_naming(str(run_dir)) == []  # nothing of the deployment left running


@pytest.mark.slow  # its own two-region topology (20-40 s to start here)
@pytest.mark.timeout(240)
def test_gateway_degrade_json_reports_the_times_given_on_the_command_line(tmp_path):
    """``chaos run gateway-degrade --duration 1 --fault-at 0.5 --fault-s 1.5``: the options reach the drill and its
    ``--json`` says so, the load lengthened to 3 s, the degrade's recorded phases consistent with them
    (:func:`test_chaos_drills_topology.check_gateway_degrade_times`; the library's run is tested on a shared
    topology there)."""
    from test_chaos_drills_topology import check_gateway_degrade_times

    p = _chaos("gateway-degrade", "--duration", "1", "--fault-at", "0.5", "--fault-s", "1.5", "--rate", "20",
               "--latency-ms", "20", "--drop-pct", "1", "--run-dir", str(tmp_path / "drill"), "--json", timeout_s=200)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    d = json.loads(p.stdout.strip().splitlines()[-1])
    check_gateway_degrade_times(d, duration_s=1.0, fault_at_s=0.5, fault_s=1.5, rate_qps=20)
    assert d["extra"]["gateway_latency_ms"] == 20 and d["extra"]["gateway_drop_pct"] == 1, d["extra"]
