"""The CLI's main job, ``inferbus up``, as a user runs it (a subprocess, free ports, real servers)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from inferbus.bus import free_port
from inferbus.client import Client

from conftest import ROOT, STOPPED_SLACK_S, processes_naming, run_in_a_pty, spawn_logged, stop_timed, wait_serving
from conftest import uvloop_backend as anyio_backend  # noqa: F401 (process-heavy tests: one loop)
from test_reliability_lib import models_subset, reference

UP = [sys.executable, "-m", "inferbus.cli", "up"]
ENV = {**os.environ, "COLUMNS": "200"}


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


@pytest.mark.timeout(90)
def test_up_demo_on_a_narrow_terminal_wraps_the_hop_by_hop_means_between_items_never_after_a_comma(tmp_path):
    """A fresh-user trial: on a narrow terminal the demo's hop-by-hop line (``k=v`` items joined by ``, ``) wrapped with
    a comma dangling at the end of each line. Now one line per hop, wrapped between items under the first. Run as a
    user runs it: stdout a terminal (a pty) of 60 columns, ``COLUMNS=60``.

    The results table above them needs about 130 columns: rich fitted it to 60 (and to 80, 100) by cutting every cell
    short, so not one figure of the run could be read (``d…``, ``4…``, ``0.…``; a later fresh-user trial). On a console
    too narrow for it the same figures come as ``name=value`` items, one block per step, wrapped between items.

    ``up``'s first line (``inferbus up in 2.24s — NATS ..., L2 cache ..., 1 worker(s), 1 ingress, run dir ...``, ~150
    characters) was not wrapped at all (the terminal broke it anywhere); it wraps between its parts now, as the model
    lines do."""
    models = models_subset(tmp_path / "models", ["digits"])
    port = free_port()
    argv = UP + ["--demo", "--demo-duration", "0.3", "--nats-port", str(port), "--workers", "1", "--no-cache",
                 "--models", str(models), "--run-dir", str(tmp_path / "run")]
    text = run_in_a_pty(argv, 60, {**os.environ, "COLUMNS": "60"}, tmp_path / "stderr")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("hop-by-hop means at c=1 (µs):"))
    # (the first line's parts are separated by ", " and may end a line with one: it wraps as text does)
    assert not [line for line in lines[start:] if line.rstrip().endswith(",")], text[-3000:]
    end = next(i for i, line in enumerate(lines) if line.startswith("wrong answers: 0"))
    hops = lines[start + 1:end]
    assert [line.split()[0] for line in hops if not line.startswith("   ")][:5] == [
        "ingress", "forward", "worker", "reply", "client"], text[-3000:]
    assert all(len(line.rstrip()) <= 60 for line in hops), hops
    items = dict(item.split("=") for line in hops for item in line.split() if "=" in item)
    assert {"decode", "ingress_total", "forward_hop", "compute", "worker_total", "reply_hop", "e2e"} <= set(items), hops
    assert "…" not in text, text[-3000:]  # no figure, header or name cut short
    # the first line wraps between its parts: each whole on one line, the lines after the first indented by 4 (the
    # run dir, longer than a line here, folded by rich), none wider than the terminal
    at = next(i for i, line in enumerate(lines) if line.startswith("  model digits versions"))
    first = next(i for i, line in enumerate(lines) if line.startswith("inferbus up in "))
    head = lines[first:at]
    assert len(head) > 1 and all(len(line.rstrip()) <= 60 for line in head), head
    for part in (f"NATS nats://127.0.0.1:{port},", "L2 cache off,", "1 worker(s),", "1 ingress,"):
        assert sum(part in line for line in head) == 1, (part, head)
    dir_at = next(i for i, line in enumerate(head) if "run dir" in line)
    assert all(line.startswith("    ") and not line.startswith("     ") for line in head[1:dir_at + 1]), head
    assert re.sub(r"\s", "", "".join(head[dir_at:])).endswith(f"rundir{tmp_path / 'run'}"), head
    # the model's line (70 columns in one) wraps before its "→": the subject whole, on an indented line of its own
    assert lines[at].rstrip() == "  model digits versions 1, 2", lines[at:at + 2]
    assert lines[at + 1].rstrip() == "    → inferbus.infer.digits[.<version>]", lines[at:at + 2]
    title = next(i for i, line in enumerate(lines) if line.lstrip().startswith("inferbus demo — model digits"))
    steps = lines[title + 1:start]
    assert all(len(line.rstrip()) <= 60 for line in steps), steps
    heads = [line.split(":")[0] for line in steps if line.startswith("digits ")]
    assert heads[:2] == ["digits closed c=1", "digits closed c=8"] and heads[3] == "digits closed(hit) c=1", steps
    assert re.fullmatch(r"digits open \d+/s", heads[2]), steps
    figures = [dict(item.split("=") for item in line.split(":")[-1].split() if "=" in item)
               for line in "\n".join(steps).replace("\n    ", " ").splitlines()]
    assert len(figures) == 4, steps
    for f in figures:
        assert int(f["requests"]) > 0 and f["wrong"] == "0" and f["errors"] == "0", f
        assert float(f["p50"].removesuffix("ms")) <= float(f["p99.9"].removesuffix("ms")), f
    assert int(figures[3]["cache_hits"]) > 0, figures


def test_up_model_lines_wrap_before_the_arrow_on_a_narrow_console():
    """``up``'s line per model (``  model digits versions 1, 2 → inferbus.infer.digits[.<version>]``) was broken
    by rich where it ran out of room (on 60 columns after the ``→``, left dangling; mid-subject on fewer). Where it does not fit it wraps between its items: the subject whole
    after ``→`` on a line of its own, indented; where it fits it stays one line, the name in colour."""
    import io

    from rich.console import Console

    from inferbus.cli import _model_line

    def shown(name, versions, prefix, width, **kw):
        con = Console(file=io.StringIO(), width=width, **kw)
        for line in _model_line(name, versions, prefix, width):
            con.print(line)
        return con.file.getvalue()

    # the versions as every list of the CLI is written, "1, 2" (it was Python's repr of the list, ['1', '2'])
    one = "  model digits versions 1, 2 → inferbus.infer.digits[.<version>]"
    assert shown("digits", ["1", "2"], "inferbus", 80, color_system=None) == one + "\n"
    assert shown("digits", ["1", "2"], "inferbus", 60, color_system=None).splitlines() == [
        "  model digits versions 1, 2", "    → inferbus.infer.digits[.<version>]"]
    # the versions go on their own line too where the name and they do not fit together
    assert shown("digits_cnn", list("1234567"), "p", 40, color_system=None).splitlines() == [
        "  model digits_cnn", "    versions 1, 2, 3, 4, 5, 6, 7", "    → p.infer.digits_cnn[.<version>]"]
    # the name in colour, decided on the plain text (the markup does not count against the width); markup-like
    # text in a prefix is shown as it is
    coloured = shown("digits", ["1"], "inferbus", 80, color_system="standard", force_terminal=True)
    assert "\x1b[36mdigits\x1b[0m" in coloured, repr(coloured)
    assert shown("m", ["1"], "[bold]x", 80, color_system=None) == "  model m versions 1 → [bold]x.infer.m[.<version>]\n"


def _wrapped_block(lines: list[str], start: str, width: int) -> list[str]:
    """The lines of the line that starts with ``start`` as wrapped to ``width`` between words: its first line and
    the lines after it indented by exactly 4. Asserts each fits ``width`` and ends in no blank."""
    at = next(i for i, line in enumerate(lines) if line.startswith(start))
    block = [lines[at]]
    for line in lines[at + 1:]:
        if not (line.startswith("    ") and not line.startswith("     ")):
            break
        block.append(line)
    assert all(len(line) <= width and line == line.rstrip() for line in block), block
    return block


@pytest.mark.timeout(90)
@pytest.mark.parametrize("columns", [60, 80])
def test_up_wraps_its_stopping_line_and_a_crash_record_with_a_hanging_indent_and_no_trailing_blanks(tmp_path,
                                                                                                  columns):
    """A fresh-user trial: ``stopping: the ingresses stop taking requests ...`` (~120 characters) was left to rich,
    which wrapped it with no indent (the next lines read as lines of their own) and left a blank at the end of a
    line (``(Ctrl-C again: ``); a supervisor's record of a crashed worker on stderr (``supervisor 'node-n1': child
    'worker:n1-w0' (pid 7) exited: killed by signal 9 (SIGKILL)``) was not wrapped at all. Both wrap as ``up``'s
    first line and model lines do: between words, the lines after the first indented by 4, none wider than the
    terminal, none ending in a blank; piped with ``COLUMNS``, as a terminal of that width gets them."""
    out, err = tmp_path / "up.out", tmp_path / "up.err"
    argv = UP + ["--nats-port", str(free_port()), "--workers", "1", "--no-cache", "--run-dir", str(tmp_path / "run"),
                 "--models", str(models_subset(tmp_path / "models", ["digits"]))]
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(argv, stdout=fo, stderr=fe, cwd=ROOT, start_new_session=True,
                                env={**os.environ, "COLUMNS": str(columns)})
    try:
        wait_serving(proc, out)
        node_log = tmp_path / "run" / "node.log"
        pid = int(re.search(r"started child 'worker:n1-w0' \(pid (\d+)\)", node_log.read_text()).group(1))
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while node_log.read_text().count("started child 'worker:n1-w0'") < 2:  # restarted: its exit was reported
            assert proc.poll() is None and time.monotonic() < deadline, node_log.read_text()[-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (out.read_text()[-3000:], err.read_text()[-3000:])
        lines = out.read_text().splitlines()
        block = _wrapped_block(lines, "stopping: ", columns)
        assert len(block) > 1, block
        assert " ".join(" ".join(block).split()) == (
            "stopping: the ingresses stop taking requests and the workers finish theirs, then the embedded "
            "nats-server (Ctrl-C again: stop at once, no drain)"), block
        assert lines[lines.index(block[-1]) + 1].startswith("inferbus stopped in "), lines
        record = _wrapped_block(err.read_text().splitlines(), "supervisor 'node-n1': child 'worker:n1-w0'", columns)
        assert len(record) > 1, record
        assert " ".join(" ".join(record).split()) == (
            f"supervisor 'node-n1': child 'worker:n1-w0' (pid {pid}) exited: killed by signal 9 (SIGKILL)"), record
    finally:
        _kill_group(proc)


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_up_on_an_existing_nats_answers_and_leaves_it_running(nats_server, tmp_path):
    models = models_subset(tmp_path / "models", ["digits"])
    log = tmp_path / "up.log"
    argv = UP + ["--nats-url", nats_server.url, "--workers", "1", "--no-cache", "--models", str(models),
                 "--run-dir", str(tmp_path / "run"), "--prefix", "ext", "--max-backlog-msgs", "777"]
    proc = spawn_logged(argv, log, ENV)
    try:
        wait_serving(proc, log)
        assert f"NATS {nats_server.url}" in log.read_text()  # no embedded server: the one given
        x = np.load(models / "digits" / "data" / "test.npz")["X"][:3].astype(np.float32)
        async with await Client.connect(nats_server.url, "ext") as client:
            out = await client.infer("digits", {"pixels": x}, timeout_s=5)
            assert (await client.health(timeout_s=5)).parameters["max_backlog_msgs"] == 777  # the flag reached it
        np.testing.assert_allclose(out["logits"], reference("digits", {"pixels": x})["logits"], rtol=1e-5, atol=1e-5)
        rc, wall_s, said_s, text = stop_timed(proc, log, signal.SIGTERM)
        assert rc == 0, text[-3000:]
        assert nats_server.proc.poll() is None  # up stops what it started, not the NATS it was given
        # a clean stop says so, after the drain (nothing printed would look like a hang), from the signal to the end
        assert "stopping:" in text and re.search(r"inferbus stopped in \d+\.\d+s after serving \d+s", text), text[-2000:]
        assert said_s <= wall_s and wall_s - said_s < STOPPED_SLACK_S, (said_s, wall_s, text[-3000:])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.anyio
@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", [pytest.param([], id="separate"), pytest.param(["--colocate"], id="colocated")])
async def test_sigterm_answers_the_requests_already_received_before_exiting(tmp_path, layout):
    """Graceful stop: SIGTERM to ``inferbus up`` while 12 requests wait at a slow worker (300 ms per batch):
    the ingress drains, the worker finishes what it received and answers it, then everything exits 0.
    One attempt per request (no SDK retries), so every answer comes from the draining worker. Colocated:
    the requests were handed to the worker in-process, and are answered all the same."""
    from conftest import start_deployment
    from inferbus.schemas import InferbusError
    from test_reliability_lib import set_fault

    models = models_subset(tmp_path / "models", ["digits"], {"digits": {"cache_ttl_ms": 0}})
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="drain",
                           extra=["--models", str(models), "--no-cache", "--fault-injection", *layout])
    try:
        client = await Client.connect(dep.nats_url, "drain", retry_unavailable=False, adaptive_attempt_timeout=False)
        x = np.load(models / "digits" / "data" / "test.npz")["X"][:12].astype(np.float32)
        await client.infer("digits", {"pixels": x[:1]}, timeout_s=5)  # warm
        await set_fault(client.nc, "drain", "n1-w0", compute_delay_ms=300)

        async def one(k):
            try:
                return await client.infer("digits", {"pixels": x[k:k + 1]}, timeout_s=8)
            except InferbusError as err:
                return err

        calls = [asyncio.ensure_future(one(k)) for k in range(12)]
        await asyncio.sleep(0.15)  # all sent; the first batch is computing, the rest queued
        dep.proc.send_signal(signal.SIGTERM)
        results = await asyncio.gather(*calls)
        bad = [r for r in results if isinstance(r, Exception)]
        assert not bad, bad
        for k, out in enumerate(results):
            np.testing.assert_allclose(out["probabilities"], reference("digits", {"pixels": x[k:k + 1]})["probabilities"],
                                       rtol=1e-5, atol=1e-6)
        assert dep.proc.wait(20) == 0
        await client.close()
    finally:
        dep.stop()


def _descendants(pid: int) -> set[int]:
    """The live processes below ``pid`` (children, grandchildren, ...), read from /proc."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parent_of[int(entry)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent_of.items() if pp in frontier} - found
        found |= frontier
    return found


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_second_ctrl_c_during_the_drain_kills_everything_at_once(tmp_path):
    """A drain can take long (a slow worker holds requests: here 2 s per batch, up to 5 s before its SIGKILL).
    The first SIGINT starts it; a second one used to be ignored. Now it kills every actor process and the
    embedded servers at once: ``up`` exits 130 within a second or two, says so, and leaves no process behind."""
    from conftest import start_deployment
    from test_reliability_lib import set_fault

    models = models_subset(tmp_path / "models", ["digits"], {"digits": {"cache_ttl_ms": 0}})
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="kill2",
                           extra=["--models", str(models), "--no-cache", "--fault-injection"])
    try:
        client = await Client.connect(dep.nats_url, "kill2", retry_unavailable=False, adaptive_attempt_timeout=False)
        x = np.load(models / "digits" / "data" / "test.npz")["X"][:6].astype(np.float32)
        await client.infer("digits", {"pixels": x[:1]}, timeout_s=5)  # warm
        await set_fault(client.nc, "kill2", "n1-w0", compute_delay_ms=2000)
        calls = [asyncio.ensure_future(client.infer("digits", {"pixels": x[k:k + 1]}, timeout_s=20)) for k in range(6)]
        await asyncio.sleep(0.3)  # all sent; the worker holds them
        below = _descendants(dep.proc.pid)
        assert len(below) >= 3, below  # the actors and the embedded nats-server at least
        dep.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10
        while b"stopping:" not in dep.log.read_bytes() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert b"Ctrl-C again" in dep.log.read_bytes(), dep.log.read_text()[-2000:]
        await asyncio.sleep(0.2)
        assert dep.proc.poll() is None  # still draining: the worker holds requests for seconds
        t_second = time.monotonic()
        dep.proc.send_signal(signal.SIGINT)
        rc = await asyncio.to_thread(dep.proc.wait, 10)
        took_s = time.monotonic() - t_second
        text = dep.log.read_text()
        assert rc == 130, text[-3000:]
        assert took_s < 3.0, (took_s, text[-3000:])
        assert "second signal" in text and "killing the actor processes" in text and "Traceback" not in text, text[-3000:]
        for pid in below:  # nothing left behind (the actors and servers, and anything they started)
            assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await client.close()
    finally:
        dep.stop()


# imported by every Python process that has its folder on PYTHONPATH: the actor process named by INFERBUS_TEST_HANG
# never gets READY (a start-up that hangs); the one named by INFERBUS_TEST_DEAF blocks SIGTERM (a slow graceful stop)
_SITECUSTOMIZE = """
import os, signal, time
_argv = open("/proc/self/cmdline", "rb").read().split(b"\\0")
if b"inferbus.actors" in _argv:
    _kind = _argv[_argv.index(b"inferbus.actors") + 1].decode()
    if _kind == os.environ.get("INFERBUS_TEST_DEAF"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    if _kind == os.environ.get("INFERBUS_TEST_HANG"):
        time.sleep(600)
_slow = os.environ.get("INFERBUS_TEST_SLOW_IMPORT")  # the CLI process's first import of that module takes 30 s
if _slow and b"inferbus.cli" in _argv:
    import sys

    class _SlowImport:
        def find_spec(self, name, path=None, target=None):
            if name == _slow:
                sys.meta_path.remove(self)
                time.sleep(30)
            return None

    sys.meta_path.insert(0, _SlowImport())
"""


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _start_hanging(tmp_path, **env) -> tuple[subprocess.Popen, object, set[int]]:
    """``inferbus up`` whose worker never gets READY; returns once the worker process is there (the aggregator and
    the embedded nats-server started before it), with the processes below ``up`` then."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    log = tmp_path / "up.log"
    argv = UP + ["--nats-port", str(free_port()), "--workers", "1", "--no-cache", "--run-dir", str(tmp_path / "run"),
                 "--models", str(models_subset(tmp_path / "models", ["digits"]))]
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = spawn_logged(argv, log, {**ENV, "PYTHONPATH": path, "INFERBUS_TEST_HANG": "worker", **env})
    deadline = time.monotonic() + 30
    while not any("inferbus.actors worker" in _cmdline(p) for p in _descendants(proc.pid)):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    time.sleep(0.5)  # the worker hangs: up waits for its READY
    assert proc.poll() is None and b"inferbus up" not in log.read_bytes(), log.read_text()[-3000:]
    return proc, log, _descendants(proc.pid)


def _signal_and_exit(proc, log, below: list[int], sig, *, rc: int, within_s: float) -> str:
    """Send ``sig`` to ``up``; assert it exits ``rc`` within ``within_s`` with no traceback and none of the
    processes ``below`` it left. Returns its log."""
    t_sig = time.monotonic()
    proc.send_signal(sig)
    got = proc.wait(15)
    took_s = time.monotonic() - t_sig
    text = log.read_text()
    assert got == rc, text[-3000:]
    assert took_s < within_s, (took_s, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    assert all(_gone(p) for p in below), [(p, _cmdline(p)) for p in below if not _gone(p)]
    return text


def _kill_group(proc) -> None:
    """Clean-up after a test: SIGKILL ``up``'s process group if it is still running."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.timeout(60)
def test_the_same_signal_twice_at_once_is_one_stop_not_a_kill(tmp_path):
    """GNU ``timeout`` sends its SIGTERM to the child and then to its process group: ``up`` got two at once and took
    the second for "stop at once", SIGKILL without a drain (a fresh-user trial, 1 of 6 ``timeout 30 inferbus up``).
    Two SIGTERMs within microseconds are now one: the node drains and ``up`` exits 0."""
    log = tmp_path / "up.log"
    argv = UP + ["--nats-port", str(free_port()), "--workers", "1", "--no-cache", "--run-dir", str(tmp_path / "run"),
                 "--models", str(models_subset(tmp_path / "models", ["digits"]))]
    proc = spawn_logged(argv, log, ENV)
    try:
        wait_serving(proc, log)
        os.kill(proc.pid, signal.SIGTERM)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert "second signal" not in text and "inferbus stopped" in text, text[-3000:]
    finally:
        _kill_group(proc)


@pytest.mark.timeout(60)
def test_up_into_a_closed_pipe_stops_its_node_as_on_sigterm_and_exits_141(tmp_path):
    """``inferbus up | head -1``: its stdout a pipe whose reader is gone (here before it starts, so that its first
    line finds it so: deterministic). It exited 1 from inside the serving loop (rich's handling of a broken pipe).
    Now its first failed write is a first signal: the node drains and stops (every actor and the embedded
    nats-server exit 0), and it exits 141 as a Unix tool killed by SIGPIPE is reported, nothing on stderr, nothing
    left running."""
    run = tmp_path / "run"
    argv = UP + ["--nats-port", str(free_port()), "--workers", "1", "--no-cache", "--run-dir", str(run),
                 "--models", str(models_subset(tmp_path / "models", ["digits"]))]
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.Popen(argv, stdout=w, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV,
                                start_new_session=True)
    finally:
        os.close(w)
    try:
        _, err = proc.communicate(timeout=45)
        time.sleep(0.3)
        ps = subprocess.run(["ps", "-s", str(proc.pid), "-o", "stat=,args="], capture_output=True, text=True).stdout
    finally:
        _kill_group(proc)
    assert (proc.returncode, err) == (141, ""), (proc.returncode, err[-3000:])
    assert not [line for line in ps.splitlines() if line.strip() and not line.startswith("Z")], ps
    log = (run / "node.log").read_text()
    stopped = re.findall(r"child '([^']+)' \(pid \d+\) stopped: exit code 0", log)
    assert sorted(stopped) == ["aggregator", "ingress:0", "nats", "worker:n1-w0"], log[-3000:]
    assert "quiesce" in log and "kill" not in log.lower(), log[-3000:]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_start_up_stops_it_at_once_and_exits_128_plus_the_signal(tmp_path, sig):
    """A fresh-user trial: Ctrl-C during start-up was kept until the start had finished (up to the 60 s readiness
    wait; even a second Ctrl-C), then ``up`` exited 0. Now the start is cancelled at once (the process not yet
    ready is killed, what had started is stopped gracefully): exit 128 + the signal, nothing left running."""
    proc, log, below = _start_hanging(tmp_path)
    try:
        assert len(below) >= 3, below  # nats-server, the aggregator, the worker
        text = _signal_and_exit(proc, log, below, sig, rc=128 + sig, within_s=5.0)
        assert f"{sig.name} during start-up" in text and "stopped during start-up" in text, text[-3000:]
    finally:
        _kill_group(proc)


def _sigint_state(pid: int) -> tuple[bool, bool]:
    """(ignored, caught) of SIGINT in process ``pid`` (``SigIgn``/``SigCgt`` of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
    bit = 1 << (signal.SIGINT - 1)
    return bool(int(fields["SigIgn"], 16) & bit), bool(int(fields["SigCgt"], 16) & bit)


@pytest.mark.timeout(60)
def test_kill_int_while_up_imports_stops_it_even_when_sigint_came_in_ignored(tmp_path):
    """A fresh-user trial: ``up`` started with SIGINT ignored (a background job ``&`` of a non-interactive shell) lost
    a ``kill -INT`` sent in its first ~1.5 s (the imports and option checks, before its loop's handlers), and the
    node started and served. Now ``up`` takes SIGINT from its first line of code: a SIGINT during the imports (made
    30 s long here, so that a starved CI box's late poll still lands in them) exits 130 at once, no traceback,
    nothing started."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    log = tmp_path / "up.log"
    argv = UP + ["--nats-port", str(free_port()), "--workers", "1", "--no-cache", "--run-dir", str(tmp_path / "run")]
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                env={**ENV, "PYTHONPATH": path, "INFERBUS_TEST_SLOW_IMPORT": "numpy"},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 20  # (the slow import holds the process 30 s; its loop's handlers come after)
        while _sigint_state(proc.pid) != (False, True):
            assert proc.poll() is None and time.monotonic() < deadline, (_sigint_state(proc.pid), log.read_text())
            time.sleep(0.01)
        assert not log.read_bytes(), log.read_text()  # still importing: nothing printed yet
        text = _signal_and_exit(proc, log, [], signal.SIGINT, rc=130, within_s=5.0)
        assert "inferbus up" not in text and "serving" not in text, text[-3000:]
    finally:
        _kill_group(proc)


@pytest.mark.timeout(60)
def test_a_second_ctrl_c_during_start_up_kills_everything_at_once(tmp_path):
    """The first Ctrl-C during start-up stops what started gracefully; here the aggregator ignores SIGTERM, so that
    stop would wait for its 5 s shutdown timeout. A second Ctrl-C kills everything at once, as during the drain:
    exit 130 within a second or two, no process left."""
    proc, log, below = _start_hanging(tmp_path, INFERBUS_TEST_DEAF="aggregator")
    try:
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 5
        while b"Ctrl-C again" not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
        time.sleep(0.5)
        assert proc.poll() is None, log.read_text()[-3000:]  # still stopping: the aggregator ignores its SIGTERM
        text = _signal_and_exit(proc, log, below, signal.SIGINT, rc=130, within_s=3.0)
        assert "second signal" in text and "killed" in text, text[-3000:]
    finally:
        _kill_group(proc)


@pytest.mark.timeout(90)
def test_sigterm_during_the_demo_exits_143(tmp_path):
    """SIGTERM during ``up --demo``'s load run used to exit 130 (SIGINT's status): a stop by signal is 128 + that
    signal everywhere in ``up``, as in ``bench``."""
    log = tmp_path / "up.log"
    argv = UP + ["--demo", "--demo-duration", "20", "--nats-port", str(free_port()), "--workers", "1", "--no-cache",
                 "--models", str(models_subset(tmp_path / "models", ["digits"])), "--run-dir", str(tmp_path / "run")]
    proc = spawn_logged(argv, log, ENV)
    try:
        deadline = time.monotonic() + 60
        while b"model digits versions" not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        time.sleep(0.5)  # in the load run
        below = _descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)
        text = log.read_text()
        assert rc == 143 and "demo interrupted (SIGTERM)" in text and "Traceback" not in text, (rc, text[-3000:])
        assert "inferbus stopped in " in text, text[-3000:]  # the stop is said as after serving
        assert all(_gone(p) for p in below), [(p, _cmdline(p)) for p in below if not _gone(p)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.timeout(90)
def test_an_interrupted_demo_says_its_stop_from_the_signal_to_the_end(nats_server, tmp_path):
    """``inferbus stopped in N s after the interrupted demo``: N is the time from the signal to the end of what ``up``
    waits for, the load run's own end included (its client drains its connection, up to 2 s), within
    :data:`STOPPED_SLACK_S` of the exit. Its clock started after the load run had ended and the line came from inside
    the event loop: a fresh-user trial read ``stopped in 0.18s`` from a demo that exited 3.3 s after its SIGINT.
    Here the NATS server is frozen (SIGSTOP) for 1.5 s at the signal, so the demo client's drain waits for it: the
    line said ~0.3 s of a ~1.8 s stop."""
    log = tmp_path / "up.log"
    argv = UP + ["--demo", "--demo-duration", "20", "--nats-url", nats_server.url, "--workers", "1", "--no-cache",
                 "--models", str(models_subset(tmp_path / "models", ["digits"])), "--run-dir", str(tmp_path / "run"),
                 "--prefix", "stopclock"]
    proc = spawn_logged(argv, log, ENV)
    frozen = False

    def thaw_later() -> None:
        nonlocal frozen
        time.sleep(1.5)
        os.kill(nats_server.proc.pid, signal.SIGCONT)
        frozen = False

    try:
        deadline = time.monotonic() + 60
        while b"model digits versions" not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        time.sleep(0.5)  # in the load run
        os.kill(nats_server.proc.pid, signal.SIGSTOP)
        frozen = True
        rc, wall_s, said_s, text = stop_timed(proc, log, during=thaw_later)
        assert rc == 130 and "demo interrupted (SIGINT)" in text and "Traceback" not in text, (rc, text[-3000:])
        assert wall_s > 1.5, (wall_s, text[-3000:])  # (the freeze was in the stop)
        assert said_s <= wall_s and wall_s - said_s < STOPPED_SLACK_S, (said_s, wall_s, text[-3000:])
    finally:
        if frozen:
            os.kill(nats_server.proc.pid, signal.SIGCONT)
        _kill_group(proc)


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_second_node_with_the_same_node_id_on_one_nats_is_refused(nats_server, tmp_path):
    """Two nodes on one NATS and prefix must not share process ids (they would share worker subjects and
    overwrite each other's routing state): the second ``up`` with the same --node-id exits 2 with one line
    naming the id; with its own --node-id it joins, and the ingresses see both nodes' workers."""
    models = models_subset(tmp_path / "models", ["digits"])
    procs = []

    def start(name: str, *extra: str) -> tuple[subprocess.Popen, object]:
        log = tmp_path / f"{name}.log"
        argv = UP + ["--nats-url", nats_server.url, "--workers", "1", "--no-cache", "--models", str(models),
                     "--run-dir", str(tmp_path / name), "--prefix", "two", *extra]
        p = spawn_logged(argv, log, ENV)
        procs.append(p)
        return p, log

    try:
        wait_serving(*start("first"))
        p, log = start("same")
        assert p.wait(60) == 2, log.read_text()[-3000:]
        text = log.read_text()
        assert "node id 'n1' is in use" in text and "n1-w0" in text and "Traceback" not in text, text[-3000:]
        wait_serving(*start("second", "--node-id", "n2"))
        async with await Client.connect(nats_server.url, "two") as client:
            deadline = time.monotonic() + 10
            while True:
                workers = (await client.health(timeout_s=5)).parameters["workers"]
                if {"n1-w0", "n2-w0"} <= set(workers):
                    break
                assert time.monotonic() < deadline, workers
                await asyncio.sleep(0.1)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        assert all(p.wait(30) in (0, 2) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_region_keeps_each_ingress_on_its_own_regions_workers(nats_server, tmp_path):
    """``up`` had no ``--region``: two nodes of two regions on one NATS sent 11 of 60 requests across (a fresh-user
    trial, 2026-12-05). With ``--region`` each ingress forwards to its own region's worker while it can take them,
    and answers say the region."""
    models = models_subset(tmp_path / "models", ["digits"])
    procs = []
    try:
        for node, region in (("a", "A"), ("b", "B")):
            argv = UP + ["--nats-url", nats_server.url, "--workers", "1", "--no-cache", "--models", str(models),
                         "--run-dir", str(tmp_path / node), "--prefix", "reg", "--node-id", node, "--region", region]
            procs.append(spawn_logged(argv, tmp_path / f"{node}.log", ENV))
            wait_serving(procs[-1], tmp_path / f"{node}.log")
        async with await Client.connect(nats_server.url, "reg") as client:
            deadline = time.monotonic() + 10
            while not {"a-w0", "b-w0"} <= set((await client.health(timeout_s=5)).parameters["workers"]):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            rng = np.random.default_rng(4)
            for _ in range(60):
                res = await client.infer_result("digits", {"pixels": rng.random((1, 64), dtype=np.float32)},
                                                timeout_s=5)
                assert res.parameters["region"] == res.parameters["worker_id"][0].upper(), res.parameters

            async def stats(kind: str) -> dict:
                inbox = client.nc.new_inbox()
                sub = await client.nc.subscribe(inbox)
                await client.nc.publish(f"$SRV.STATS.{kind}", b"", reply=inbox)
                out = {}
                try:
                    while len(out) < 2:
                        d = json.loads((await sub.next_msg(timeout=5)).data)
                        e = next(e for e in d["endpoints"] if e["name"] == "infer")
                        out[d["metadata"]["ingress_id" if kind.endswith("ingress") else "worker_id"]] = e["data"]
                finally:
                    await sub.unsubscribe()
                return out

            ing, wk = await stats("inferbus-ingress"), await stats("inferbus-worker")
            forwarded = {i[0]: d["counts"]["ok_forwarded"] for i, d in ing.items()}
            received = {w[0]: d["received"] for w, d in wk.items()}
            assert sum(forwarded.values()) >= 60 and forwarded == received, (forwarded, received)

            # region A's only worker frozen: after REGION_FRESH_S (0.5 s) of its silence, A's ingress sends to B's
            # worker, and requests with a 1 s budget are answered (a fresh-user trial, cluster up: every one failed
            # for 1.5 s; A's ingress kept to the frozen worker until the suspicion age, 2.5 s)
            pid_a = (await client.health(timeout_s=5)).parameters["workers"]["a-w0"]["pid"]
            os.kill(pid_a, signal.SIGSTOP)
            try:
                await asyncio.sleep(0.8)
                answers = await asyncio.gather(*[
                    client.infer_result("digits", {"pixels": rng.random((1, 64), dtype=np.float32)}, timeout_s=1.0)
                    for _ in range(20)], return_exceptions=True)
            finally:
                os.kill(pid_a, signal.SIGCONT)
            failed = [a for a in answers if isinstance(a, BaseException)]
            assert not failed, failed[:3]
            assert {a.parameters["worker_id"] for a in answers} == {"b-w0"}
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.mark.timeout(90)
def test_an_unreachable_l2_cache_is_reported_at_start(tmp_path):
    """``--redis-url`` pointing at nothing: the node serves (L2 is optional) and says so in one warning line."""
    log = tmp_path / "up.log"
    argv = UP + ["--nats-port", "0", "--workers", "1", "--redis-url", f"redis://127.0.0.1:{free_port()}/0",
                 "--models", str(models_subset(tmp_path / "models", ["digits"])), "--run-dir", str(tmp_path / "run")]
    proc = spawn_logged(argv, log, ENV)
    try:
        wait_serving(proc, log)
        assert "does not answer" in log.read_text() and "serving without L2" in log.read_text(), log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.timeout(120)
def test_bad_or_unreachable_nats_urls_get_one_line(tmp_path):
    """``--nats-url`` checked before anything starts (exit 2, the bad URL named); none reachable: exit 3 naming
    them; ``--spread-servers`` with one server says it has nothing to spread."""
    models = str(models_subset(tmp_path / "models", ["typed"]))
    dead = f"nats://127.0.0.1:{free_port()}"
    for url, code, text in ((",", 2, "names no server"), ("nats://127.0.0.1:99999", 2, "'nats://127.0.0.1:99999'"),
                            ("http://127.0.0.1:4222", 2, "expected nats://HOST:PORT"),
                            (f"{dead},,", 3, f"cannot reach NATS at {dead}")):
        out = subprocess.run(UP + ["--nats-url", url, "--no-cache", "--workers", "1", "--models", models,
                                   "--spread-servers"], capture_output=True, text=True, env=ENV, timeout=60, cwd=ROOT)
        assert out.returncode == code, (url, out.returncode, out.stderr[-2000:])
        assert text in out.stderr and "Traceback" not in out.stderr, (url, out.stderr[-2000:])
        if code == 3:
            assert "--spread-servers has nothing to spread with one NATS server" in out.stderr


@pytest.mark.timeout(60)
def test_a_nats_port_asked_for_and_taken_is_refused_even_with_demo(tmp_path):
    """``--demo`` moves the embedded nats-server off its default port 4222 when that is taken; a port given with
    ``--nats-port`` is never moved (clients configured for it would reach whatever holds it): exit 2, named. The line
    says what holds it, probed (it said "the NATS already listening there" of any socket), and a ``--run-dir`` that
    the command made is taken away again (it was left behind, empty)."""
    import socket

    models = str(models_subset(tmp_path / "models", ["typed"]))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = subprocess.run(UP + ["--nats-port", str(port), "--demo", "--no-cache", "--workers", "1", "--models",
                                   models, "--run-dir", str(tmp_path / "made" / "run")],
                             capture_output=True, text=True, env=ENV, timeout=50, cwd=ROOT)
    assert out.returncode == 2, (out.returncode, out.stdout[-1000:], out.stderr[-2000:])
    assert f"port {port} is in use" in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.startswith(f"error: up: port {port} is in use"), out.stderr[-2000:]  # the documented form
    assert out.stderr == (f"error: up: port {port} is in use by another program (not a NATS server): pass --nats-port "
                          f"0 (any free port) or another --nats-port\n"), out.stderr
    assert not (tmp_path / "made").exists()  # the run dir and the parent it made: gone


@pytest.mark.timeout(60)
def test_a_nats_port_taken_by_a_nats_server_says_so_and_keeps_a_run_dir_that_was_there(tmp_path, nats_server):
    """A port held by a NATS server: the line says so and how to use that server; a ``--run-dir`` that existed, empty
    or not, is kept as it was."""
    models = str(models_subset(tmp_path / "models", ["typed"]))
    port = int(nats_server.url.rsplit(":", 1)[1])
    (tmp_path / "empty").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    for run_dir in ("empty", "full"):
        out = subprocess.run(UP + ["--nats-port", str(port), "--no-cache", "--workers", "1", "--models", models,
                                   "--run-dir", str(tmp_path / run_dir)],
                             capture_output=True, text=True, env=ENV, timeout=50, cwd=ROOT)
        assert (out.returncode, out.stdout) == (2, ""), out
        assert out.stderr == (f"error: up: port {port} is in use by a NATS server: pass --nats-port 0 (any free port), "
                              f"another --nats-port, or --nats-url nats://127.0.0.1:{port} to use that server\n"), \
            out.stderr
    assert (tmp_path / "empty").is_dir() and not list((tmp_path / "empty").iterdir())
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


def self_signed_cert(folder) -> tuple:
    """``(cert.pem, key.pem)`` in ``folder``: a self-signed certificate for 127.0.0.1, made with ``cryptography`` if it
    is installed, else with the ``openssl`` command; the test is skipped when neither is there."""
    import shutil

    cert, key = folder / "cert.pem", folder / "key.pem"
    try:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl command is here to make a certificate")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
                       check=True, capture_output=True, timeout=30)
        return cert, key
    import ipaddress

    pk = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    c = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(pk.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
         .sign(pk, hashes.SHA256()))
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(pk.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    return cert, key


@pytest.mark.timeout(60)
def test_a_nats_port_taken_by_a_nats_server_with_tls_first_is_said_to_be_a_tls_server(tmp_path):
    """A fresh-user trial: a NATS server configured TLS first (``handshake_first``) sends nothing until the client's
    TLS hello, so the probe (which reads the INFO a NATS server sends at once) said "another program". A probe that
    got nothing now tries a TLS handshake, and the line says what answered it (a real nats-server, TLS first)."""
    from inferbus.bus import nats_server_binary

    cert, key = self_signed_cert(tmp_path)
    port = free_port()
    conf, log = tmp_path / "nats.conf", tmp_path / "nats.log"
    conf.write_text(f'listen: 127.0.0.1:{port}\ntls {{\n  cert_file: "{cert}"\n  key_file: "{key}"\n'
                    f'  handshake_first: true\n}}\n')
    server = subprocess.Popen([str(nats_server_binary()), "-c", str(conf), "-l", str(log)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (log.exists() and b"Server is ready" in log.read_bytes()):  # (its readiness: no INFO to wait for)
            assert server.poll() is None and time.monotonic() < deadline, log.read_text() if log.exists() else ""
            time.sleep(0.02)
        models = str(models_subset(tmp_path / "models", ["typed"]))
        out = subprocess.run(UP + ["--nats-port", str(port), "--no-cache", "--workers", "1", "--models", models,
                                   "--run-dir", str(tmp_path / "run")],
                             capture_output=True, text=True, env=ENV, timeout=50, cwd=ROOT)
    finally:
        server.terminate()
        server.wait(10)
    assert (out.returncode, out.stdout) == (2, ""), out
    assert out.stderr == (f"error: up: port {port} is in use by a TLS server (perhaps NATS with TLS first): pass "
                          f"--nats-port 0 (any free port) or another --nats-port\n"), out.stderr


@pytest.mark.timeout(60)
def test_busy_poll_values_the_node_refuses_get_one_line(tmp_path):
    """``--busy-poll-us`` must be in [0, 1,000,000] µs: a negative value, nan, inf and more than 1 s each get one
    line naming the range and exit 2, before anything starts (no traceback); ``bench`` checks the same."""
    models = str(models_subset(tmp_path / "models", ["typed"]))
    for value in ("-1", "nan", "inf", "2e6"):
        text = "up: --busy-poll-us must be in [0, 1,000,000] µs (0 = off), got "
        out = subprocess.run(UP + ["--busy-poll-us", value, "--no-cache", "--workers", "1", "--models", models],
                             capture_output=True, text=True, env=ENV, timeout=30, cwd=ROOT)
        assert out.returncode == 2, (value, out.returncode, out.stderr[-2000:])
        assert text in out.stderr and "Traceback" not in out.stderr, (value, out.stderr[-2000:])
    for value in ("-1", "nan", "2e6"):
        out = subprocess.run(UP[:-1] + ["bench", "--busy-poll-us", value, "--models", models], capture_output=True,
                             text=True, env=ENV, timeout=30, cwd=ROOT)
        assert out.returncode == 2, (value, out.returncode, out.stderr[-2000:])
        assert "--busy-poll-us must be in [0, 1,000,000] µs (0 = off), got " in out.stderr, (value, out.stderr[-2000:])
        assert "Traceback" not in out.stderr


@pytest.mark.timeout(120)
def test_a_model_no_backend_given_can_load_fails_the_start_at_once_naming_it(tmp_path):
    """A user trial: ``up --backends jax`` on a repository with the ``strings`` model (StringConcat, which the JAX
    interpreter lacks) waited 60 s, then ended in a TimeoutError traceback. Once every worker has reported, a model
    loaded by none is named with each worker's reason, exit 2, and nothing is left running."""
    pytest.importorskip("jax", reason="jax is not installed (pip install 'inferbus[jax]')")
    models = models_subset(tmp_path / "models", ["digits", "strings"])
    argv = UP + ["--backends", "jax", "--nats-port", str(free_port()), "--no-cache", "--models", str(models),
                 "--run-dir", str(tmp_path / "run")]
    t0 = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=110, cwd=ROOT, env=ENV)
    took_s = time.monotonic() - t0
    assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-3000:])
    err = out.stderr
    assert "model 'strings' version 1: no worker could load it" in err and "StringConcat" in err, err[-3000:]
    assert "'digits'" not in err and "Traceback" not in err, err[-3000:]
    assert "--model NAME" in err, err[-3000:]
    assert took_s < 55, took_s  # not the 60 s readiness wait: it stopped when the reports said so
    ps = subprocess.run(["pgrep", "-f", str(tmp_path / "run")], capture_output=True, text=True)
    assert ps.stdout.strip() == "", ps.stdout  # no actor process or server of that run left


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_model_option_serves_only_the_models_named(tmp_path):
    models = models_subset(tmp_path / "models", ["digits", "strings"])
    port = free_port()
    log = tmp_path / "up.log"
    argv = UP + ["--model", "digits", "--nats-port", str(port), "--workers", "1", "--no-cache", "--models",
                 str(models), "--run-dir", str(tmp_path / "run")]
    proc = spawn_logged(argv, log, ENV)
    try:
        wait_serving(proc, log)
        text = log.read_text()
        assert "model digits versions" in text and "model strings" not in text, text
        x = np.load(models / "digits" / "data" / "test.npz")["X"][:2].astype(np.float32)
        async with await Client.connect(f"nats://127.0.0.1:{port}") as client:
            out = await client.infer("digits", {"pixels": x}, timeout_s=5)
            np.testing.assert_allclose(out["logits"], reference("digits", {"pixels": x})["logits"], rtol=1e-5,
                                       atol=1e-5)
            from inferbus.schemas import NotFound

            with pytest.raises(NotFound):
                await client.infer("strings", {"text": np.array([b"a"], dtype=object)}, timeout_s=5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    bad = subprocess.run(UP + ["--model", "nope", "--nats-port", "0", "--models", str(models)], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, env=ENV)
    assert bad.returncode == 2 and "--model nope: not in the model repository" in bad.stderr, bad.stderr[-2000:]
    assert "digits, strings" in bad.stderr, bad.stderr[-2000:]


@pytest.mark.timeout(60)
def test_a_nats_port_taken_between_the_check_and_the_bind_is_one_error_line(tmp_path):
    """Two ``up`` started at the same moment on one port: both pass the port check, one nats-server loses the bind.
    That one printed ~100 lines of traceback ending ``EmbeddedServerError: ... address already in use``, exit 1 (a
    fresh-user trial). Here the check is made to pass (``_port_busy`` answers False) while a socket holds the port:
    the documented one line, exit 2, and nothing of the node left running."""
    import socket

    models = str(models_subset(tmp_path / "models", ["typed"]))
    code = "import sys, inferbus.cli as c; c._port_busy = lambda port: False; sys.argv[0] = 'inferbus'; c.main()"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = subprocess.run([sys.executable, "-c", code, "up", "--nats-port", str(port), "--no-cache", "--workers",
                              "1", "--models", models, "--run-dir", str(tmp_path / "run")],
                             capture_output=True, text=True, env=ENV, timeout=50, cwd=ROOT)
    assert (out.returncode, out.stderr.count("\n")) == (2, 1), (out.returncode, out.stdout[-1000:], out.stderr[-3000:])
    assert out.stderr.startswith(f"error: up: port {port} is in use (taken while this node started) by another "
                                 f"program (not a NATS server)"), out.stderr
    left = processes_naming(str(tmp_path / "run"))
    assert not left, f"left running: {left}"


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_up_audit_publishes_each_executed_request_id_once(tmp_path):
    """``up --audit`` (a fresh-user trial: no way to turn on the execution audit the drills count duplicates with):
    the workers publish the request ids they ran on ``<p>._audit``, a MessagePack list of strings per batch; each
    request run once is there once, a cache hit not at all; each batch names its worker (``Inferbus-Worker-Id``)."""
    import msgspec
    import nats

    from conftest import start_deployment

    dep = await asyncio.to_thread(start_deployment, tmp_path / "dep", workers=1, prefix="aud",
                                  extra=["--audit", "--no-cache", "--model", "digits"])
    try:
        nc = await nats.connect(dep.nats_url)
        seen: list[str] = []
        expected_runs: list[str] = []  # the repeats that came too late for the L1 (run, so audited)
        workers: set = set()

        async def on_audit(msg):
            seen.extend(msgspec.msgpack.decode(msg.data))
            workers.add((msg.headers or {}).get("Inferbus-Worker-Id"))

        await nc.subscribe("aud._audit", cb=on_audit)
        await nc.flush()
        async with await Client.connect(dep.nats_url, "aud") as c:
            x = np.random.default_rng(3).random((1, 64), dtype=np.float32)
            hits = 0
            for i in range(5):
                await c.infer("digits", {"pixels": x + np.float32(i)}, request_id=f"aud-{i}")
                # the same input again at once: an L1 hit, not run. digits' cache_ttl_ms is 100: on a loaded box
                # the answer can expire before the repeat (a CI run saw 'aud-again' run, sent after four more), so
                # the answer says whether it was a hit, and a repeat that was none must be in the audit
                again = await c.infer_result("digits", {"pixels": x + np.float32(i)}, request_id=f"aud-again-{i}")
                hits += bool(again.parameters.get("cache_hit"))
                if not again.parameters.get("cache_hit"):
                    expected_runs.append(f"aud-again-{i}")
        assert hits >= 1  # (100 ms between a request and its repeat on the same connection: not five times)
        want = sorted([f"aud-{i}" for i in range(5)] + expected_runs)
        deadline = time.monotonic() + 10
        while len(seen) < len(want):
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert sorted(seen) == want, seen
        assert workers == {"n1-w0"}, workers
        await nc.close()
    finally:
        await asyncio.to_thread(dep.stop)
