"""OS-process children: :class:`ProcessChild`.

A ``ProcessChild`` is one OS process started with the running loop's
``subprocess_exec`` (asyncio or uvloop) in a new session, hence its own process group
whose id is its pid. Signals for stopping go to the whole group, so a child's
descendants go down with it; when the group leader exits, whatever is left of its group
is killed (SIGKILL) so that a restart never races orphans of the previous incarnation.

Output: stdout and stderr are pipes that the loop keeps reading for the whole life of
the process (a ``SubprocessProtocol`` gets every chunk as it arrives), so the child never
blocks on a full pipe. Before READY, stdout lines are compared with ``ready_line``. Every
line is copied to ``log_path`` (raw bytes, appended; with ``log_timestamps`` each line after the UTC time it
arrived; with ``log_json_actor`` as JSON Lines, a line that is not a JSON object wrapped in one) or, when
``log_path`` is None, to our
``sys.stderr`` prefixed with ``[name] ``. The last lines are kept for error messages.

Everything here runs on the loop that called :meth:`ProcessChild.start`.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from ._aio import finish_despite_cancel, log
from ._errors import ChildStartError, SpecError
from ._pdeathsig import die_with_parent_on
from ._spec import ChildExit, check_shutdown_timeout

__all__ = ["ProcessChild", "exit_from_returncode"]

TAIL_LINES = 20
"""How many of the last output lines are kept for ChildStartError messages."""
MAX_LINE_BYTES = 64 * 1024
"""A longer run of bytes without a newline is treated as one line (never buffered more)."""
DRAIN_TIMEOUT_S = 1.0
"""After the leader exits (and its group is killed), how long to wait for the pipes to
reach EOF before reporting the exit, so the last output is logged first."""


def exit_from_returncode(returncode: int) -> ChildExit:
    """Translate an asyncio/subprocess return code into a :class:`ChildExit`."""
    if returncode == 0:
        return ChildExit(True, "exit code 0", 0)
    if returncode > 0:
        return ChildExit(False, f"exit code {returncode}", returncode)
    signame = ChildExit(False, "", returncode).signal or "unknown"
    return ChildExit(False, f"killed by signal {-returncode} ({signame})", returncode)


class _LineSplitter:
    """Split a byte stream into lines (newline kept); overlong runs become lines."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        lines: list[bytes] = []
        start = 0
        while True:
            i = self._buf.find(b"\n", start)
            if i < 0:
                if len(self._buf) - start >= MAX_LINE_BYTES:
                    lines.append(bytes(self._buf[start:start + MAX_LINE_BYTES]))
                    start += MAX_LINE_BYTES
                    continue
                break
            lines.append(bytes(self._buf[start:i + 1]))
            start = i + 1
        del self._buf[:start]
        return lines

    def flush(self) -> list[bytes]:
        rest, self._buf = bytes(self._buf), bytearray()
        return [rest] if rest else []


class _Protocol(asyncio.SubprocessProtocol):
    """Forwards the loop's subprocess callbacks to the owning ProcessChild."""

    def __init__(self, owner: ProcessChild) -> None:
        self._owner = owner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._owner._on_connection_made(transport)  # type: ignore[arg-type]

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self._owner._on_output(fd, data if isinstance(data, bytes) else data.encode())

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._owner._on_pipe_closed(fd)

    def process_exited(self) -> None:
        self._owner._on_process_exited()


class ProcessChild:
    """An OS process supervised as a child; create it with :meth:`start`.

    Satisfies the ``Child`` protocol: ``pid``, ``wait()``, ``stop(timeout_s)``.
    All methods must be called on the loop that started the process.
    """

    def __init__(self, *, name: str, argv: list[str], ready_line: str | None,
                 log_file: IO[bytes] | None, log_timestamps: bool = False,
                 log_json_actor: str | None = None, log_ready: bool = True) -> None:
        """Private: use :meth:`ProcessChild.start`."""
        loop = asyncio.get_running_loop()
        self.name = name
        """Name used in log lines and error messages."""
        self.argv = tuple(argv)
        """The command line the process was started with."""
        self._ready_line = ready_line
        self._log_file = log_file
        self._log_timestamps = log_timestamps
        self._log_json_actor = log_json_actor
        self._log_ready = log_ready
        self._stamp_s = -1
        self._stamp = b""
        self._ready: asyncio.Future[None] = loop.create_future()
        self._leader_exit: asyncio.Future[int] = loop.create_future()
        self._exited: asyncio.Future[ChildExit] = loop.create_future()
        self._pipes_closed = asyncio.Event()
        self._open_fds = {1, 2}
        self._splitters = {1: _LineSplitter(), 2: _LineSplitter()}
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._transport: asyncio.SubprocessTransport | None = None
        self._pid: int | None = None
        self._returncode: int | None = None
        self._finisher: asyncio.Task[None] | None = None
        self._log_failed = False

    # ------------------------------------------------------------------ start
    @classmethod
    async def start(cls, argv: Sequence[str | os.PathLike[str]], *,
                    env: Mapping[str, str] | None = None,
                    cwd: str | os.PathLike[str] | None = None,
                    ready_line: str | None = "READY",
                    start_timeout_s: float = 30.0,
                    log_path: str | os.PathLike[str] | None = None,
                    log_timestamps: bool = False,
                    log_json_actor: str | None = None,
                    log_ready: bool = True,
                    name: str | None = None,
                    cpu_affinity: Sequence[int] | None = None) -> ProcessChild:
        """Start an OS process and return once it is ready.

        The process gets ``stdin`` from ``/dev/null``, pipes for stdout and stderr, and a
        new session (``start_new_session=True``), so its process group id is its pid. On
        Linux it gets SIGKILL when this process dies without stopping it, even stopped itself
        (``PR_SET_PDEATHSIG``, see ``_pdeathsig``): call this from a thread that lives as
        long as the process (the loop's), since the kernel signals when the spawning
        thread exits.

        Args:
            argv: program and arguments (a sequence, not a shell string).
            env: the complete environment of the child (not merged with ours);
                ``None`` inherits ours.
            cwd: working directory; ``None`` inherits ours.
            ready_line: the child is ready when it prints a stdout line equal to this
                (line ending stripped). ``None``: ready as soon as it is spawned.
            start_timeout_s: seconds to wait for ``ready_line``; ``> 0``, ``math.inf``
                waits forever. Default 30.
            log_path: file that all output is appended to (parents are created);
                ``None`` forwards every line to our ``sys.stderr`` as ``[name] line``.
            log_timestamps: with ``log_path``, each line is written after the UTC time this
                process read it, ``2026-12-02T11:40:05.123Z `` (the actors' own lines carry none;
                the read time is within the pipe's latency of the write, milliseconds at most).
            log_json_actor: with ``log_path``, write JSON Lines instead (``log_timestamps`` is then
                ignored): a line that is a JSON object (the child's own JSON log records) as it is;
                any other line (a ready line, a library's or the interpreter's own output) wrapped
                as ``{"ts", "level", "logger", "actor", "msg"}``: ``ts`` the UTC time it was read
                (RFC 3339), ``level`` ``info`` (stdout) or ``warning`` (stderr), ``logger``
                ``stdout`` or ``stderr``, ``actor`` this string, ``msg`` the line.
            log_ready: with ``log_path``, whether the ready line itself is copied into the log (as any stdout
                line: at level ``info`` in JSON). False: it is the handshake alone, read and not written (a
                parent whose log level leaves ``info`` out passes False, so that the log holds no line below it).
            name: label for logs and errors; default ``Path(argv[0]).name``.
            cpu_affinity: the cores the process runs on, set in the child before exec (every thread it makes
                inherits it); None or empty: this process's own.

        Returns:
            The running, ready child.

        Raises:
            SpecError: an argument is malformed.
            ChildStartError: the program could not be spawned, exited before printing
                ``ready_line``, or did not print it within ``start_timeout_s``; ``output``
                holds its last lines. In every case the process group has been killed.

        Cancellation: the process group is killed (SIGKILL) and reaped before
        ``CancelledError`` propagates, so nothing is left running.
        """
        if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence) or not argv:
            raise SpecError(f"argv must be a non-empty sequence of str (program, *args), "
                            f"not a shell string, got {argv!r}")
        args = [os.fspath(a) for a in argv]
        if ready_line is not None and (not isinstance(ready_line, str) or "\n" in ready_line):
            raise SpecError(f"ready_line must be None or a str without newlines, "
                            f"got {ready_line!r}")
        if isinstance(start_timeout_s, bool) or not isinstance(start_timeout_s, (int, float)) \
                or math.isnan(start_timeout_s) or start_timeout_s <= 0:
            raise SpecError(f"start_timeout_s must be a number of seconds > 0 (math.inf: "
                            f"no limit), got {start_timeout_s!r}")
        name = name or Path(args[0]).name
        log_file: IO[bytes] | None = None
        if log_path is not None:
            path = Path(log_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            log_file = open(path, "ab")  # noqa: SIM115 - closed when the process ends
        loop = asyncio.get_running_loop()
        self = cls(name=name, argv=args, ready_line=ready_line, log_file=log_file,
                   log_timestamps=log_timestamps, log_json_actor=log_json_actor, log_ready=log_ready)
        try:
            await loop.subprocess_exec(
                lambda: _Protocol(self), *args, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
                preexec_fn=die_with_parent_on(tuple(cpu_affinity) if cpu_affinity else None))
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self._close_log()
            raise ChildStartError(f"{name}: cannot start {args!r}: {exc}") from exc
        log.debug("%s: spawned pid %s", name, self._pid)
        if ready_line is None:
            return self
        try:
            await asyncio.wait((self._ready, self._exited),
                               timeout=None if math.isinf(start_timeout_s) else start_timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._kill_group(signal.SIGKILL)
            await finish_despite_cancel(self._exited)
            raise
        if self._ready.done():
            return self
        if self._exited.done():
            why = f"exited ({self._exited.result().reason}) before printing {ready_line!r}"
        else:
            why = f"did not print {ready_line!r} within {start_timeout_s:g} s; killed"
            self._kill_group(signal.SIGKILL)
            await finish_despite_cancel(self._exited)
        tail = tuple(self._tail)
        shown = "\n".join(f"  | {line}" for line in tail) if tail else "  (no output)"
        raise ChildStartError(f"{name} (pid {self._pid}) {why}; last output:\n{shown}",
                              output=tail)

    # ------------------------------------------------------------------ Child protocol
    @property
    def pid(self) -> int | None:
        """OS pid (also the process group id) of the child."""
        return self._pid

    @property
    def returncode(self) -> int | None:
        """Exit status once the process has exited (negative: killed by that signal)."""
        return self._returncode

    @property
    def output_tail(self) -> tuple[str, ...]:
        """The last lines printed (stdout and stderr interleaved), oldest first."""
        return tuple(self._tail)

    async def wait(self) -> ChildExit:
        """Return the exit once the process has exited and its output is drained.

        Cancellation: cancelling the caller does not affect the process.
        """
        return await asyncio.shield(self._exited)

    async def stop(self, timeout_s: float | None) -> ChildExit:
        """Stop the process group: SIGTERM, wait ``timeout_s``, then SIGKILL.

        Args:
            timeout_s: seconds to wait after SIGTERM before SIGKILL; ``None`` sends
                SIGKILL at once (OTP ``brutal_kill``); ``math.inf`` never escalates.

        Returns:
            The exit (returned at once if the process had already exited).

        Cancellation: SIGKILL is sent to the group and ``CancelledError`` propagates
        without waiting for the exit.
        """
        timeout_s = check_shutdown_timeout(timeout_s, "timeout_s")
        if not self._leader_exit.done():
            try:
                if timeout_s is None:
                    self._kill_group(signal.SIGKILL)
                else:
                    self._kill_group(signal.SIGTERM)
                    done, _ = await asyncio.wait(
                        (self._leader_exit,),
                        timeout=None if math.isinf(timeout_s) else timeout_s)
                    if not done:
                        log.warning("%s (pid %s) still running %g s after SIGTERM; SIGKILL",
                                    self.name, self._pid, timeout_s)
                        self._kill_group(signal.SIGKILL)
            except asyncio.CancelledError:
                self._kill_group(signal.SIGKILL)
                raise
        return await asyncio.shield(self._exited)

    def __repr__(self) -> str:
        state = "running" if self._returncode is None else f"exited {self._returncode}"
        return f"<ProcessChild {self.name!r} pid={self._pid} {state}>"

    # ------------------------------------------------------------------ internals
    def _kill_group(self, sig: int) -> None:
        if self._pid is None or self._returncode is not None:
            return  # not spawned, or leader reaped: remnants already killed on exit
        try:
            os.killpg(self._pid, sig)
        except ProcessLookupError:
            # The leader left our process group (it called setsid/setpgid itself):
            # signal it alone.
            try:
                os.kill(self._pid, sig)
            except ProcessLookupError:
                pass
        except PermissionError as exc:
            log.warning("%s: cannot signal process group %s: %s", self.name, self._pid, exc)

    def _on_connection_made(self, transport: asyncio.SubprocessTransport) -> None:
        self._transport = transport
        self._pid = transport.get_pid()

    def _on_output(self, fd: int, data: bytes) -> None:
        splitter = self._splitters.get(fd)
        if splitter is None:
            return
        for raw in splitter.feed(data):
            self._on_line(fd, raw)
        self._flush_log()

    def _on_line(self, fd: int, raw: bytes) -> None:
        text = raw.decode(errors="replace").rstrip("\r\n")
        self._tail.append(text)
        if fd == 1 and self._ready_line is not None and not self._ready.done() \
                and text == self._ready_line:
            self._ready.set_result(None)
            if not self._log_ready and self._log_file is not None:
                return  # the handshake alone: not a line of the log (log_ready)
        try:
            if self._log_file is not None:
                if self._log_json_actor is not None:
                    self._log_file.write(self._json_line(fd, text))
                    return
                if self._log_timestamps:
                    self._log_file.write(self._timestamp())
                self._log_file.write(raw if raw.endswith(b"\n") else raw + b"\n")
            else:
                sys.stderr.write(f"[{self.name}] {text}\n")
        except (OSError, ValueError) as exc:
            if not self._log_failed:
                self._log_failed = True
                log.warning("%s: cannot copy output (%s); further output is dropped",
                            self.name, exc)

    def _json_line(self, fd: int, text: str) -> bytes:
        """``text`` as one JSON Lines line: as it is when it is a JSON object, else wrapped in one
        (``log_json_actor`` of :meth:`start`)."""
        if text.startswith("{") and text.endswith("}"):
            try:
                if isinstance(json.loads(text), dict):
                    return text.encode() + b"\n"
            except ValueError:
                pass
        stamp = self._timestamp().decode().rstrip()
        return json.dumps({"ts": stamp, "level": "info" if fd == 1 else "warning",
                           "logger": "stdout" if fd == 1 else "stderr", "actor": self._log_json_actor,
                           "msg": text}, ensure_ascii=False).encode() + b"\n"

    def _timestamp(self) -> bytes:
        """``2026-12-02T11:40:05.123Z `` for now (UTC); the seconds part is formatted once per second."""
        now = time.time()
        sec = int(now)
        if sec != self._stamp_s:
            self._stamp_s = sec
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)).encode()
        return b"%s.%03dZ " % (self._stamp, int((now - sec) * 1000))

    def _flush_log(self) -> None:
        try:
            if self._log_file is not None:
                self._log_file.flush()
            else:
                sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def _on_pipe_closed(self, fd: int) -> None:
        self._open_fds.discard(fd)
        if not self._open_fds:
            self._pipes_closed.set()

    def _on_process_exited(self) -> None:
        assert self._transport is not None
        returncode = self._transport.get_returncode()
        assert returncode is not None
        # Kill what is left of the group before marking the leader as reaped.
        self._kill_group(signal.SIGKILL)
        self._returncode = returncode
        self._leader_exit.set_result(returncode)
        self._finisher = asyncio.get_running_loop().create_task(
            self._finish(returncode), name=f"ProcessChild {self.name} finish")

    async def _finish(self, returncode: int) -> None:
        try:
            await asyncio.wait_for(self._pipes_closed.wait(), DRAIN_TIMEOUT_S)
        except TimeoutError:
            log.warning("%s: output pipes still open %g s after exit; not waiting",
                        self.name, DRAIN_TIMEOUT_S)
        for fd, splitter in self._splitters.items():
            for raw in splitter.flush():
                self._on_line(fd, raw)
        self._flush_log()
        if self._transport is not None:
            self._transport.close()
        self._close_log()
        exit_ = exit_from_returncode(returncode)
        log.debug("%s (pid %s): %s", self.name, self._pid, exit_.reason)
        self._exited.set_result(exit_)

    def _close_log(self) -> None:
        if self._log_file is not None:
            try:
                self._log_file.close()
            except OSError:
                pass
            self._log_file = None
