"""``inferbus up --log-level / --log-format`` and what a normal stop logs: real ``inferbus up`` processes (a real
nats-server, real actor processes), stopped with SIGTERM; their stderr and the run dir's logs read back.

The actor processes' stderr is what the node writes to ``<run dir>/<actor>.log``; the node's own records go to
``node.log`` and (warning and above) to up's stderr."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from test_reliability_lib import models_subset

pytestmark = pytest.mark.timeout(120)

RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
FIELDS = {"ts", "level", "logger", "actor", "msg"}


def _start(tmp_path, *args: str) -> subprocess.Popen:
    """``inferbus up`` on one model, no L2 cache, a free NATS port, run dir ``tmp_path/run``; returns once it said it
    is up (its first stdout line)."""
    models = models_subset(tmp_path / "models", ["digits"])
    proc = subprocess.Popen([sys.executable, "-m", "inferbus.cli", "up", "--models", str(models), "--nats-port", "0",
                             "--no-cache", "--run-dir", str(tmp_path / "run"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True, env={**os.environ, "COLUMNS": "200"})
    line = proc.stdout.readline()
    if "json" in args and line.startswith("{"):  # (--log-format json: up's own lines are records too)
        line = json.loads(line)["msg"]
    if not line.startswith("inferbus up in"):
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"up did not start: {line!r} {proc.communicate()}")
    return proc


def _stop(proc: subprocess.Popen) -> tuple[int, str]:
    """SIGTERM, as an operator's ``kill``; the exit status and up's whole stderr (the group killed past 60 s)."""
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"up still ran 60 s after SIGTERM: {err[-3000:]}")
    return proc.returncode, err


def _logs(run) -> dict[str, str]:
    """``{file name: text}`` of node.log and each actor process's log in the run dir."""
    return {p.name: p.read_text() for p in sorted(run.glob("*.log"))}


def test_a_normal_stop_says_each_actor_drains_and_logs_no_cancelled_loops(tmp_path):
    """An operator trial: SIGTERM to ``up`` left four ``loop ... exited: cancelled`` lines per worker (its loops,
    stopped by its own stop), a ``disconnected from NATS`` line per actor (its own close) and no line saying it was
    draining. Now each actor says when its drain begins (with what it holds) and when it has stopped, and nothing
    else."""
    proc = _start(tmp_path, "--workers", "2")
    rc, err = _stop(proc)
    assert rc == 0, err
    logs = _logs(tmp_path / "run")
    assert {"worker-n1-w0.log", "worker-n1-w1.log", "ingress-0.log", "aggregator.log"} <= set(logs), sorted(logs)
    for name, text in logs.items():
        assert "exited: cancelled" not in text and "disconnected from NATS" not in text, (name, text)
    assert "exited" not in err, err
    for wid in ("n1-w0", "n1-w1"):
        text = logs[f"worker-{wid}.log"]
        drains = re.findall(rf"Z INFO worker {wid}: draining: (\d+) requests in flight", text)
        assert drains == ["0"], text
        assert len(re.findall(rf"Z INFO worker {wid}: stopped [\d.]+ s after its drain began", text)) == 1, text
    assert len(re.findall(r"Z INFO ingress n1-i0: draining: 0 requests in flight", logs["ingress-0.log"])) == 1
    assert len(re.findall(r"Z INFO ingress n1-i0: stopped ", logs["ingress-0.log"])) == 1
    assert len(re.findall(r"Z INFO aggregator n1-agg: draining: \d+ cache fills", logs["aggregator.log"])) == 1
    assert len(re.findall(r"Z INFO aggregator n1-agg: stopped ", logs["aggregator.log"])) == 1


def test_json_format_writes_every_line_of_the_node_and_its_actors_as_a_json_record(tmp_path):
    """``--log-format json``: up's stderr, node.log and every actor's log are JSON Lines with ts (RFC 3339 UTC), level,
    logger, actor and msg. A worker killed meanwhile puts the node's record of it on stderr (so the stderr checked is
    not empty); the READY lines the actors print are wrapped as records too."""
    proc = _start(tmp_path, "--workers", "1", "--log-format", "json")
    run = tmp_path / "run"
    try:
        started = [json.loads(line)["msg"] for line in (run / "node.log").read_text().splitlines()]
        [pid] = [int(m.group(1)) for s in started if (m := re.search(r"started child 'worker:n1-w0' \(pid (\d+)\)", s))]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (run / "node.log").read_text().count("started child 'worker:n1-w0'") < 2:  # restarted
            assert proc.poll() is None and time.monotonic() < deadline, (run / "node.log").read_text()[-3000:]
            time.sleep(0.1)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    rc, err = _stop(proc)
    assert rc == 0, err
    files = {"stderr": err, **_logs(run)}
    assert {"node.log", "worker-n1-w0.log", "ingress-0.log", "aggregator.log"} <= set(files), sorted(files)
    records: dict[str, list[dict]] = {}
    for name, text in files.items():
        assert text.strip(), name
        records[name] = []
        for line in text.splitlines():
            rec = json.loads(line)  # every line, or this fails naming it
            assert isinstance(rec, dict) and FIELDS <= set(rec), (name, line)
            assert RFC3339_UTC.fullmatch(rec["ts"]), (name, line)
            assert rec["level"] in ("debug", "info", "warning", "error", "critical"), (name, line)
            records[name].append(rec)
    killed = [r for r in records["stderr"] if "child 'worker:n1-w0'" in r["msg"] and "SIGKILL" in r["msg"]]
    assert killed and killed[0]["actor"] == "node-n1" and killed[0]["level"] == "error", records["stderr"]
    assert {r["actor"] for r in records["node.log"]} == {"node-n1"}
    worker = records["worker-n1-w0.log"]
    assert {r["actor"] for r in worker} == {"worker-n1-w0"}, worker
    assert [r["msg"] for r in worker].count("READY") == 2, worker  # both incarnations, wrapped
    draining = [r for r in worker if "draining:" in r["msg"]]
    assert len(draining) == 1 and draining[0]["level"] == "info" and draining[0]["logger"] == "inferbus.actors._worker"
    assert {r["actor"] for r in records["ingress-0.log"]} == {"ingress-n1-i0"}
    assert {r["actor"] for r in records["aggregator.log"]} == {"aggregator-n1-agg"}


def test_log_level_warning_leaves_the_info_records_out(tmp_path):
    """``--log-level warning``: no INFO record in node.log or any actor's log (the drains, the supervisors' starts
    and stops); what is not a record (the actors' READY lines) is still there."""
    proc = _start(tmp_path, "--workers", "1", "--log-level", "warning")
    rc, err = _stop(proc)
    assert rc == 0, err
    logs = _logs(tmp_path / "run")
    assert "worker-n1-w0.log" in logs and "node.log" in logs, sorted(logs)
    for name, text in logs.items():
        assert " INFO " not in text and "draining" not in text, (name, text)
        # the actors' READY (the start handshake, one per incarnation: an info line) is read by the node, not
        # written below info (it was, as a line without a level)
        assert "READY" not in text, (name, text)
    assert err == "", err


def test_json_at_warning_every_line_of_up_and_its_logs_is_a_record_at_warning_or_above(tmp_path):
    """``--log-format json --log-level warning``: no record below warning in node.log or any actor's log (the
    actors' READY lines were wrapped as ``info`` records), and every line of up's own stdout (its start and stop
    report, ``level`` info) and stderr (its ``note:``, ``level`` warning) is a JSON record too (they were text)."""
    proc = _start(tmp_path, "--workers", "1", "--log-level", "warning", "--log-format", "json", "--nats-cpus", "0")
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, err
    logs = _logs(tmp_path / "run")
    assert "worker-n1-w0.log" in logs and "node.log" in logs, sorted(logs)
    for name, text in logs.items():
        for line in text.splitlines():
            assert json.loads(line)["level"] in ("warning", "error", "critical"), (name, line)
    records = {}
    for stream, text in (("stdout", out), ("stderr", err)):
        records[stream] = [json.loads(line) for line in text.splitlines()]  # every line, or this fails naming it
        for rec in records[stream]:
            assert FIELDS <= set(rec) and rec["logger"] == "inferbus.up" and rec["actor"] == "node-n1", rec
            assert RFC3339_UTC.fullmatch(rec["ts"]), rec
    [note] = records["stderr"]
    assert note["level"] == "warning" and note["msg"].startswith("note: --nats-cpus keeps nats-server on core 0")
    msgs = [r["msg"] for r in records["stdout"]]
    # (after the first line, which _start read: "inferbus up in ...")
    assert any(m.startswith("model digits versions") for m in msgs), msgs  # (no indent kept from the text form)
    assert "serving; Ctrl-C to stop" in msgs and msgs[-2].startswith("stopping: ") and \
        msgs[-1].startswith("inferbus stopped in "), msgs
    assert {r["level"] for r in records["stdout"]} == {"info"}


@pytest.mark.parametrize("option,value,choices", [("--log-level", "verbose", "debug, info, warning, error"),
                                                  ("--log-level", "INFO", "debug, info, warning, error"),
                                                  ("--log-format", "xml", "text, json")])
def test_a_bad_log_option_is_refused_in_one_line_before_anything_starts(tmp_path, option, value, choices):
    r = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--nats-port", "0", "--run-dir",
                        str(tmp_path / "run"), option, value], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr == f"error: up: {option} must be one of {choices}, got {value!r}\n", r.stderr
    assert not (tmp_path / "run").exists()


def test_json_records_carry_the_traceback_in_exc(capfd):
    """The JSON format's ``exc``: a record logged with a traceback (a loop that raised, a thread that died) has it
    as one string; the line stays one JSON object."""
    from inferbus._logs import configure_actor_process

    root, inferbus_log = logging.getLogger(), logging.getLogger("inferbus")
    saved = (root.handlers[:], root.level, inferbus_log.level, logging.getLogger("inferbus.supervisor").level)
    try:
        configure_actor_process("info", "json", "worker-t0")
        try:
            raise ValueError("bad input")
        except ValueError:
            logging.getLogger("inferbus.actors._worker").error("worker t0: batch\nfailed", exc_info=True)
        logging.getLogger("inferbus.actors._worker").debug("not at info")
        lines = capfd.readouterr().err.splitlines()
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        inferbus_log.setLevel(saved[2])
        logging.getLogger("inferbus.supervisor").setLevel(saved[3])
    [line] = lines
    rec = json.loads(line)
    assert rec["msg"] == "worker t0: batch\nfailed" and rec["actor"] == "worker-t0" and rec["level"] == "error"
    assert rec["exc"].startswith("Traceback") and "ValueError: bad input" in rec["exc"]


@pytest.mark.anyio
async def test_an_actor_loop_that_dies_is_still_logged_and_one_stopped_is_not(caplog):
    """The loops of an actor (:func:`supervise_loops`): stopped in an orderly stop, nothing is logged about them; one
    that raises or is cancelled from elsewhere is logged as before (``loop <id> exited: <why>``)."""
    from inferbus.actors._common import supervise_loops

    boom, forever = asyncio.Event(), asyncio.Event()
    incarnations = []

    async def dies() -> None:  # its first incarnation raises; the restarted one waits
        incarnations.append(1)
        if len(incarnations) > 1:
            await forever.wait()
        await boom.wait()
        raise RuntimeError("loop bug")

    async def waits() -> None:
        await forever.wait()

    caplog.set_level(logging.WARNING, logger="inferbus.actors._common")
    sup = await supervise_loops("worker-t0", {"dies": dies, "waits": waits})
    running = asyncio.ensure_future(sup.run())
    boom.set()
    deadline = asyncio.get_running_loop().time() + 10
    while not any("loop dies exited: raised RuntimeError('loop bug')" in r.getMessage() for r in caplog.records):
        assert asyncio.get_running_loop().time() < deadline, caplog.text
        await asyncio.sleep(0.01)
    await sup.stop()
    await running
    assert len(incarnations) == 2  # restarted once, then stopped with the other loop
    said = [r.getMessage() for r in caplog.records if r.name == "inferbus.actors._common"]
    assert said == ["worker-t0: loop dies exited: raised RuntimeError('loop bug')"], said


def test_waitress_records_are_the_nodes_records_in_its_format_on_stderr_and_in_node_log(tmp_path):
    """A fresh-user trial: waitress's own records (``--http-max-connections 1`` and 2 connections: ``total open
    connections reached the connection limit, ...``) were plain text on up's stderr even with ``--log-format json``
    and never in node.log (the ``waitress`` logger had no handler: Python's last resort wrote them). Now they are the
    node's records: JSON on stderr, in node.log, logger ``waitress``, actor the node."""
    import socket

    proc = _start(tmp_path, "--workers", "1", "--log-format", "json", "--http-port", "0", "--http-host", "127.0.0.1",
                  "--http-max-connections", "1")
    run, conns = tmp_path / "run", []
    try:
        port = None
        while port is None:
            line = proc.stdout.readline()
            assert line, "up's stdout ended before its OIP v2 REST line"
            port = (m := re.search(r"OIP v2 REST http://127\.0\.0\.1:(\d+)/v2", line)) and int(m.group(1))
        conns = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
        deadline = time.monotonic() + 10
        while "reached the connection limit" not in (run / "node.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (run / "node.log").read_text()[-3000:]
            time.sleep(0.05)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        for c in conns:
            c.close()
    rc, err = _stop(proc)
    assert rc == 0, err
    for name, text in (("stderr", err), ("node.log", (run / "node.log").read_text())):
        records = [json.loads(line) for line in text.splitlines()]  # every line, or this fails naming it
        limit = [r for r in records if "reached the connection limit" in r["msg"]]
        assert len(limit) == 1, (name, text[-3000:])
        assert limit[0]["logger"] == "waitress" and limit[0]["level"] == "warning", limit
        assert limit[0]["actor"] == "node-n1" and FIELDS <= set(limit[0]), limit


def test_a_routed_loggers_repetitive_records_come_once_per_period_errors_always():
    """:func:`inferbus._logs.route_logger` (the node's ``waitress`` records): under load waitress logs ``Task queue
    depth is N`` for each task that waits; one record per message per period goes on (the next names how many were
    left out), errors every time, records below the level none; undone, the logger is as it was."""
    from inferbus._logs import route_logger

    target, records = logging.getLogger("inferbus.test_route"), []
    handler = logging.Handler()
    handler.emit = records.append
    target.addHandler(handler)
    target.propagate = False
    undo = route_logger("waitress_test", target, logging.WARNING, 30.0)
    try:
        queue = logging.getLogger("waitress_test.queue")
        for depth in range(1, 6):
            queue.warning("Task queue depth is %d", depth)
        logging.getLogger("waitress_test").info("below the level")
        for _ in range(2):
            logging.getLogger("waitress_test").error("an error of the gateway")
    finally:
        undo()
        target.removeHandler(handler)
    assert [(r.name, r.getMessage()) for r in records] == [
        ("waitress_test.queue", "Task queue depth is 1"), ("waitress_test", "an error of the gateway"),
        ("waitress_test", "an error of the gateway")]
    assert logging.getLogger("waitress_test").propagate and not logging.getLogger("waitress_test").handlers
