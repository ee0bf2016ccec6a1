"""Shared fixtures: real nats-server / Valkey / inferbus processes on free ports, stopped after use.

Every async test runs on each event loop the project supports (asyncio, uvloop)
through anyio's pytest plugin. No mocks of NATS or Redis anywhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from inferbus.bus import EmbeddedNats, EmbeddedValkey, free_port

from _watchdog import GRACE_S, Watchdog

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"


_watchdog: Watchdog | None = None


def _compile_sources() -> None:
    """Write the bytecode of inferbus, chaos and bench once, before any test starts a process. With
    ``PYTHONDONTWRITEBYTECODE`` set (this workplace sets it) no process writes it, and an editable install leaves
    none, so every process the tests start (several hundred: CLI runs, nodes, workers) compiled each inferbus module
    it imports again: ~0.15 s of a 0.45 s import of the actors, CLI and client on the 2-core box. Python still reads
    bytecode that exists, and checks it against its source's modification time. Only the controller (xdist's workers
    have ``workerinput``) compiles; a tree that cannot be written is left as it is."""
    import compileall

    for name in ("inferbus", "chaos", "bench"):
        with contextlib.suppress(OSError):
            compileall.compile_dir(str(ROOT / name), quiet=2)


def pytest_configure(config):
    global _watchdog
    if not hasattr(config, "workerinput"):
        _compile_sources()
    capman = config.pluginmanager.getplugin("capturemanager")
    _watchdog = Watchdog(capman.suspend_global_capture if capman is not None else None,
                         capman.resume_global_capture if capman is not None else None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Arm the hard limit (:mod:`_watchdog`) over the test's setup, call and teardown: its pytest-timeout (the
    ``timeout`` marker, else the ini value) plus ``GRACE_S``."""
    marker = item.get_closest_marker("timeout")
    timeout_s = float(marker.args[0]) if marker is not None and marker.args else float(
        item.config.getini("timeout") or 120)
    _watchdog.arm(item.nodeid, timeout_s + GRACE_S)
    try:
        yield
    finally:
        _watchdog.disarm()


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
                        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
def anyio_backend(request):
    return request.param


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
def uvloop_backend(request):
    """The uvloop loop only, for process-heavy modules where one loop is enough (the actors run uvloop):
    ``from conftest import uvloop_backend as anyio_backend`` in the module."""
    return request.param


def spawn_logged(argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start ``argv`` (from the repository root, its own session) with stdout and stderr into ``log``."""
    with open(log, "wb") as fh:
        return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                env=env if env is not None else {**os.environ, "COLUMNS": "200"})


def cli_startup_s(*argv: str, env: dict | None = None, cwd: Path | None = None) -> float:
    """Seconds ``inferbus *argv`` takes with ``{url}`` in ``argv`` replaced by a NATS URL where nothing listens: the
    interpreter's start, the imports, a refused connect (no wait) and the exit (code 3, asserted).

    A timing bound on a command (its budget honoured, not 2 s per server) subtracts this, measured just before on
    the same host, instead of a constant start-up: on the 2-core CI box it was 0.8 s on some days and 2.5 s on
    others (ml_dtypes 0.7.0 alone added 1.5-2.3 s until it was imported lazily)."""
    url = f"nats://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", *(a.replace("{url}", url) for a in argv)],
                       capture_output=True, text=True, timeout=60, cwd=cwd or ROOT,
                       env=env if env is not None else {**os.environ, "COLUMNS": "200"})
    took_s = time.monotonic() - t0
    assert p.returncode == 3 and "cannot reach NATS" in p.stderr, p
    return took_s


def run_in_a_pty(argv: list[str], columns: int, env: dict, stderr_log: Path, timeout_s: float = 30.0) -> str:
    """Run ``argv`` (in ``ROOT``, a session of its own) with stdout a terminal (a pty) of ``columns`` columns, stderr
    into ``stderr_log``, until it exits; assert it exited 0 (its process group killed if it did not end) and return
    what it printed, escape sequences taken out and ``\\r\\n`` made ``\\n``."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    with open(stderr_log, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=err, cwd=ROOT, env=env,
                                start_new_session=True)
    os.close(slave)
    out = bytearray()
    try:
        while True:  # until the process (the only holder of the pty's other end) is gone
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other end closed
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout_s) == 0, (out.decode(errors="replace")[-3000:], stderr_log.read_text()[-3000:])
    finally:
        os.close(master)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace")).replace("\r\n", "\n")


def wait_serving(proc: subprocess.Popen, log: Path, timeout_s: float = 60.0, poll_s: float = 0.05) -> None:
    """Wait until ``inferbus up`` / ``cluster up`` printed "serving; Ctrl-C to stop" (its signal handlers are
    set by then); fails with the log's tail if the process exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while b"serving; Ctrl-C to stop" not in log.read_bytes():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(poll_s)


STOPPED_SLACK_S = 0.5
"""How much longer than its ``stopped in`` figure a stop may take, from the signal to the exit (the interpreter's own
exit, ~0.15 s here, ~0.4 s with both cores busy, and the wait's polling)."""


def stop_timed(proc, log, sig=signal.SIGINT, *, during=None, timeout_s: float = 30) -> tuple[int, float, float, str]:
    """Send ``sig`` to ``up``/``cluster up``, call ``during()`` (what the test does while it stops), wait for its
    exit: ``(exit status, seconds from the signal to the exit, the figure of its "stopped in N s" line, its log)``."""
    t_sig = time.monotonic()
    proc.send_signal(sig)
    if during is not None:
        during()
    rc = proc.wait(timeout_s)
    wall_s = time.monotonic() - t_sig
    text = log.read_text()
    said = re.findall(r"stopped in (\d+\.\d+)s", text)
    assert len(said) == 1, text[-3000:]
    return rc, wall_s, float(said[0]), text


def command_lines():
    """``(pid, command line)`` of each running process (its argv joined by spaces), from /proc."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                yield int(d.name), (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue


def processes_naming(text: str) -> list[str]:
    """``"<pid>: <command line>"`` of each running process whose command line contains ``text`` (a run dir: every
    server and actor a node or a topology starts names it), for the "nothing left running" checks."""
    return [f"{pid}: {cmd[:160]}" for pid, cmd in command_lines() if text in cmd]


async def wait_micro_service(nc, service: str, task, timeout_s: float = 30.0) -> None:
    """Wait until the NATS micro service ``service`` (e.g. ``inferbus-aggregator``) answers ``$SRV.PING`` through
    ``nc``: an actor this test started in its own process as asyncio ``task``, which must not end meanwhile."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while True:  # serving once its micro service answers
        assert time.monotonic() < deadline and not task.done(), task
        try:
            await nc.request(f"$SRV.PING.{service}", b"", timeout=0.5)
            return
        except Exception:
            await asyncio.sleep(0.05)


@pytest.fixture
def nats_server(tmp_path):
    with EmbeddedNats(run_dir=tmp_path / "nats") as srv:
        yield srv


@pytest.fixture
def valkey_server(tmp_path):
    with EmbeddedValkey(run_dir=tmp_path / "valkey") as srv:
        yield srv


@dataclass
class Deployment:
    """A running ``inferbus up`` process."""

    proc: subprocess.Popen
    nats_url: str
    prefix: str
    run_dir: Path
    log: Path

    def printed_metrics_url(self, timeout_s: float = 10.0) -> str:
        """The ``/metrics`` address ``up --metrics-port 0 --metrics-host 127.0.0.1`` printed, waited for."""
        deadline = time.monotonic() + timeout_s
        while not (m := re.search(rb"metrics (http://127\.0\.0\.1:\d+/metrics)", self.log.read_bytes())):
            assert time.monotonic() < deadline, self.log.read_text()[-2000:]
            time.sleep(0.05)
        return m.group(1).decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_deployment(run_dir: Path, *, workers: int = 2, extra: list[str] | None = None,
                     prefix: str = "inferbus", timeout_s: float = 90.0) -> Deployment:
    """Start ``inferbus up`` on a free port and return once it printed that it is up (all models ready)."""
    port = free_port()
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "up.log"
    # (with --nats-url in ``extra`` there is no embedded server, and up refuses --nats-port)
    own = [] if "--nats-url" in (extra or []) else ["--nats-port", str(port)]
    argv = [sys.executable, "-m", "inferbus.cli", "up", *own, "--workers", str(workers),
            "--models", str(MODELS), "--run-dir", str(run_dir), "--prefix", prefix] + (extra or [])
    fh = open(log, "wb")
    proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                            env={**os.environ, "COLUMNS": "200"})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"inferbus up exited {proc.returncode}: {log.read_text()[-3000:]}")
        if b"inferbus up" in log.read_bytes():
            return Deployment(proc, f"nats://127.0.0.1:{port}", prefix, run_dir, log)
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"inferbus up not ready after {timeout_s}s: {log.read_text()[-3000:]}")


def assert_in_no_argv(secret: str) -> None:
    """No process's command line on this host holds ``secret`` (``ps`` shows every user every argv)."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read()
        except OSError:
            continue
        assert secret.encode() not in argv, argv


def embedded_valkey_url(run_dir: Path) -> str:
    """The URL of the embedded Valkey of the ``inferbus up`` whose ``--run-dir`` is ``run_dir``: its port from its
    log's name (``valkey/valkey-<port>.log``), its password from ``valkey/valkey.conf`` (0600; the node makes one
    at each start and prints the URL with it masked)."""
    [log] = (run_dir / "valkey").glob("valkey-*.log")
    port = int(log.stem.split("-")[1])
    conf = (run_dir / "valkey" / "valkey.conf").read_text()
    password = re.search(r"^requirepass (\S+)$", conf, re.M).group(1)
    return f"redis://:{password}@127.0.0.1:{port}/0"


@contextlib.contextmanager
def two_nodes(tmp_path: Path, prefix: str, extra1: list[str], extra2: list[str] | None = None, workers: int = 1):
    """Two ``inferbus up`` nodes on one NATS: the first with its embedded nats-server, the second joining it as
    ``--node-id n2`` (``extra2``, default ``extra1``), ``workers`` workers each. Yields ``(first, second)``; both are
    stopped at the end (the second first)."""
    n1 = start_deployment(tmp_path / "n1", workers=workers, prefix=prefix, extra=extra1)
    n2 = None
    try:
        n2 = start_deployment(tmp_path / "n2", workers=workers, prefix=prefix,
                              extra=(extra1 if extra2 is None else extra2) + ["--nats-url", n1.nats_url, "--node-id",
                                                                              "n2"])
        yield n1, n2
    finally:
        if n2 is not None:
            n2.stop()
        n1.stop()


@pytest.fixture(scope="session")
def deployment(tmp_path_factory):
    """One shared deployment (2 CPU workers, embedded NATS + Valkey) for the end-to-end tests."""
    dep = start_deployment(tmp_path_factory.mktemp("deploy"))
    yield dep
    dep.stop()


class TcpEcho:
    """A TCP echo server on a free port (``async with TcpEcho() as e: e.port``), for the proxy tests."""

    async def __aenter__(self) -> "TcpEcho":
        import asyncio

        async def handle(r, w):
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except ConnectionError:
                pass
            finally:
                w.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()


async def settled_topology(spec, run_dir):
    """Async generator for a module fixture: the two-region topology of ``spec`` started, settled, stopped."""
    from inferbus.cluster import Topology

    t = Topology(spec, run_dir=run_dir)
    await t.start()
    try:
        await t.wait_settled(60)
        yield t
    finally:
        await t.stop()


def cli_in_process(argv: list[str], cwd: Path = ROOT, columns: int = 200,
                   env: dict | None = None) -> subprocess.CompletedProcess:
    """``inferbus <argv>`` run in this process, as the ``inferbus`` command runs it (``inferbus.cli._run_app``), with
    ``sys.argv``, the working folder, ``COLUMNS`` and both streams swapped for the call; its exit status from the
    ``SystemExit``. For refusals, which are parsing alone: a process costs ~0.5 s of imports each. A command that
    gets past its checks really runs here, so a test of a refusal that does not come fails by its assertion or by
    its timeout (point NATS at a port nothing listens at). ``env``: the whole environment for the call (as a
    subprocess's ``env=``: nothing else of this process's), ``COLUMNS`` still ``columns`` unless it names one."""
    import contextlib
    import io
    from unittest import mock

    from inferbus.cli import _run_app

    args = ["inferbus", *argv]
    out, err, code = io.StringIO(), io.StringIO(), 0
    here = os.getcwd()
    try:
        os.chdir(cwd)
        environ = {"COLUMNS": str(columns), **(env or {})}
        with mock.patch.object(sys, "argv", list(args)), mock.patch.dict(os.environ, environ, clear=env is not None), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                _run_app()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def check_fault_phases(d: dict, *, fault_at_s: float, rate_qps: float, lasts_s: float | None = None,
                       slack_s: float = 5.0) -> None:
    """A region or topology drill's fault on the load's clock (``d``: its ``--json`` object; the fields of
    :meth:`chaos.load.Driver.fault_phases`): ``fault_at_s`` echoed; injected no earlier than ``fault_at_s`` after the
    load's first request and at most ``slack_s`` later (generous: a shared box, and the region drills read the
    primary again first); every request the open loop planned before it counted as sent before it
    (``fault_at_s * rate_qps``, ± 1 for the float schedule, plus half a ms of requests above for the stamp's rounding
    to the ms), and some sent while it lasted. ``lasts_s``: the fault is
    healed during the drill, after that long at least (its heal stamped consistently); None: it is not healed
    during the load (region-failover), every request from it on counts as during it."""
    x = d["extra"]
    assert x["fault_at_s"] == fault_at_s, x
    injected, before, during = x["fault_injected_at_s"], x["requests_before_fault"], x["requests_during_fault"]
    assert fault_at_s <= injected <= fault_at_s + slack_s, x
    # ``injected`` is rounded to the ms: the count by planned time may be that half-ms's worth of requests above it
    assert fault_at_s * rate_qps - 1 <= before <= (injected + 0.0005) * rate_qps + 1 and before >= 1, x
    assert during >= 1 and injected <= x["last_request_sent_at_s"], x
    if lasts_s is None:
        assert "fault_healed_at_s" not in x and "fault_lasted_s" not in x, x
        assert before + during == d["requests"], (d["requests"], x)
    else:
        lasted, healed = x["fault_lasted_s"], x["fault_healed_at_s"]
        assert lasted >= lasts_s and healed == pytest.approx(injected + lasted, abs=0.002), x
        assert before + during <= d["requests"], (d["requests"], x)
