"""A hard limit per test, beyond pytest-timeout's, so that the suite always ends.

pytest-timeout (``timeout_method = signal``, the default) raises in the main thread once a test's setup, call
and teardown together pass their ``timeout``; what runs after that (the rest of the teardown, which for an async
test is the event loop that the raise interrupted) has no limit. One CI run hung there for the rest of its 90
minutes after three failures, printing nothing more.

:class:`Watchdog` is armed around each test's whole protocol (``pytest_runtest_protocol``) with the test's
timeout plus :data:`GRACE_S`. If the test is still running then, it suspends output capture, prints which test
and every thread's stack, SIGKILLs this process's descendants (the servers and ``inferbus`` processes the test
started: what the hung code is usually waiting on), and gives the test :data:`SETTLE_S` to fail on its own. If
it still has not, the process exits with status 3; pytest-xdist reports the worker as crashed while running that
test and starts a new worker for the rest. The same design as pytest-timeout's ``thread`` method, kept as a
last resort behind its ``signal`` one (which fails only the test, and lets the rest of the session run).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time

__all__ = ["GRACE_S", "SETTLE_S", "Watchdog", "descendants"]

GRACE_S = 60.0
"""Seconds past a test's pytest-timeout before the watchdog acts."""
SETTLE_S = 30.0
"""Seconds the watchdog leaves a test to end after it killed the test's processes, before it ends this one."""


def descendants(pid: int) -> list[int]:
    """The pids of ``pid``'s children, their children and so on (from ``/proc``; empty where there is none), in
    breadth-first order. A process re-parented to init (its parent died) is not found."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), ()):
            out.append(child)
            todo.append(child)
    return out


class Watchdog:
    """One thread that ends a test (see the module docstring) which outlives ``arm``'s ``limit_s``.

    ``suspend_capture``: called before printing (pytest's capture manager's ``suspend_global_capture``), so that
    the report reaches the terminal or the xdist controller instead of a captured buffer that dies with us;
    ``resume_capture`` after a test that then ended on its own."""

    def __init__(self, suspend_capture=None, resume_capture=None) -> None:
        self._suspend_capture = suspend_capture
        self._resume_capture = resume_capture
        self._cond = threading.Condition()
        self._armed: tuple[str, float, float] | None = None  # (test id, deadline monotonic s, limit s)
        self._thread = threading.Thread(target=self._run, name="test-watchdog", daemon=True)
        self._thread.start()

    def arm(self, test_id: str, limit_s: float) -> None:
        with self._cond:
            self._armed = (test_id, time.monotonic() + limit_s, limit_s)
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._armed = None
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._armed is None or time.monotonic() < self._armed[1]:
                    self._cond.wait(None if self._armed is None else max(0.0, self._armed[1] - time.monotonic()))
                test_id, _, limit_s = self._armed
            self._fire(test_id, limit_s)

    def _fire(self, test_id: str, limit_s: float) -> None:
        if self._suspend_capture is not None:
            try:
                self._suspend_capture()
            except Exception:  # the report matters more than where it goes
                pass
        err = sys.stderr
        err.write(f"\n+++ watchdog: {test_id} is still running {limit_s:.0f} s after it started (its pytest-timeout"
                  f" did not end it); every thread's stack, then its processes are killed +++\n")
        err.flush()
        faulthandler.dump_traceback(file=err, all_threads=True)
        killed = []
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
        err.write(f"+++ watchdog: SIGKILLed {len(killed)} descendant processes {killed}; "
                  f"{SETTLE_S:.0f} s for the test to end +++\n")
        err.flush()
        deadline = time.monotonic() + SETTLE_S
        with self._cond:
            while self._armed is not None and self._armed[0] == test_id and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            ended = self._armed is None or self._armed[0] != test_id
        if ended:
            if self._resume_capture is not None:
                try:
                    self._resume_capture()
                except Exception:
                    pass
            return
        err.write(f"+++ watchdog: {test_id} did not end; exiting this pytest process (status 3) +++\n")
        err.flush()
        os._exit(3)
