"""The supervisor: :class:`Supervisor` and :class:`SupervisorChild`.

Semantics follow Erlang/OTP ``supervisor.erl`` (stdlib) and "Supervisor Behaviour" in
OTP Design Principles; the function names in parentheses below are from
``supervisor.erl``.

* Children start one by one in list order, each start returning only when the child is
  ready; a failed start stops the children already started in reverse order
  (``init_children/2``, ``start_children/2``).
* A child exit is handled by the restart type (``do_restart/3``): permanent → restart;
  transient → restart only if abnormal; temporary → never, and its spec is removed.
* Each restart is counted (``add_restart/1``) in a sliding window of ``period_s``
  seconds on ``time.monotonic()``; the restart that makes the count exceed
  ``intensity`` is not performed: all children are stopped in reverse start order
  and the supervisor exits with :class:`IntensityExceeded` (escalation).
* Strategies (``restart/3``): one_for_one restarts the child; one_for_all stops all
  other children in reverse start order then starts all children in start order;
  rest_for_one does that for the child and the children after it. Children stopped
  by the strategy that are temporary are removed, not restarted
  (``terminate_children/2``). As in OTP, the group restart also starts children of
  the group that were not running (terminated with ``terminate_child``, or transient
  children that had exited normally).
* A restart whose start fails is retried promptly through the event queue, each try
  counted as a restart (``try_again_restart/1``), so a child that cannot start
  ends in escalation rather than a busy loop.
* Stopping (``terminate/2``, ``shutdown/1``): children stop in reverse start order,
  each by a graceful request and a kill after its ``shutdown_timeout_s`` (or at once
  for ``None`` = brutal_kill).

Concurrency model: one supervisor lives on one event loop (the loop that called
:meth:`Supervisor.start`); everything, hooks included, runs on that loop. Child exits
are queued by one watcher task per child and handled one at a time by :meth:`run`
(OTP's mailbox); every state change (exit handling, ``restart_child``,
``terminate_child``, ``stop``) holds one lock, so they never interleave.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Any

from ._aio import call_hook, finish_despite_cancel, log, wait_despite_cancel
from ._errors import (
    ChildNotFound,
    ChildRunning,
    ChildStartError,
    IntensityExceeded,
    SpecError,
    SupervisorError,
    SupervisorNotRunning,
)
from ._spec import (
    Child,
    ChildExit,
    ChildInfo,
    ChildSpec,
    ChildStatus,
    Restart,
    Strategy,
    SupervisorSpec,
    check_shutdown_timeout,
)

__all__ = ["Supervisor", "SupervisorChild"]


class _State(str, Enum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(eq=False)
class _Slot:
    """Mutable runtime record of one child spec (OTP ``#child{}``)."""

    spec: ChildSpec
    child: Child | None = None
    watcher: asyncio.Task[None] | None = None
    status: ChildStatus = "not_started"
    """``stopped`` once it ran and was stopped (OTP's which_children shows ``undefined`` for both; an operator's
    ``inferbus nodes`` during a node's start showed the children not started yet as ``stopped``)."""
    last_reason: str = ""


@dataclass(frozen=True, eq=False)
class _Exited:
    slot: _Slot
    child: Child
    exit: ChildExit
    reported: bool = False
    """The exit was logged and the ``on_child_exit`` hook called when it happened (:meth:`Supervisor._watch`)."""


@dataclass(frozen=True, eq=False)
class _TryAgain:
    slot: _Slot


_WAKE = object()


def _stays_down(spec: ChildSpec, exit_: ChildExit) -> bool:
    """Whether a child that exited on its own stays down (OTP restart types): a temporary one always, a transient
    one after a normal exit; a permanent one is restarted."""
    return spec.restart is Restart.TEMPORARY or (spec.restart is Restart.TRANSIENT and exit_.normal)


class RestartWindow:
    """Restart timestamps of the last ``period_s`` seconds (OTP ``add_restart/2``).

    A restart at ``now`` drops the timestamps older than ``now - period_s`` (one exactly
    ``period_s`` old is kept, as OTP keeps ``R >= Now - Period``) and adds ``now``; the
    intensity is exceeded when more than ``intensity`` timestamps remain.
    """

    def __init__(self, intensity: int, period_s: float) -> None:
        self.intensity = intensity
        self.period_s = period_s
        self._times: deque[float] = deque()

    def add(self, now: float) -> bool:
        """Record a restart at ``now`` (monotonic seconds, non-decreasing).

        Returns:
            True if the restart may proceed, False if the intensity is exceeded.
        """
        threshold = now - self.period_s
        while self._times and self._times[0] < threshold:
            self._times.popleft()
        self._times.append(now)
        return len(self._times) <= self.intensity

    def clear(self) -> None:
        """Forget all restarts (a supervisor started afresh)."""
        self._times.clear()

    def __len__(self) -> int:
        return len(self._times)


class Supervisor:
    """An OTP-style supervisor of asyncio tasks, OS processes and other supervisors.

    Usage::

        sup = Supervisor(SupervisorSpec(Strategy.ONE_FOR_ONE, intensity=3, period_s=5),
                         [ChildSpec("w0", functools.partial(ProcessChild.start, argv))])
        async with sup:            # start() + run() in the background; exit: stop()
            ...
        # or: await sup.start(); await sup.run()   (run returns after stop())

    Args:
        spec: strategy and restart intensity.
        children: child specs in start order; ids must be unique.
        name: label for logs and errors; default ``"supervisor"``.
        on_child_exit: ``hook(child_id, exit)`` called synchronously on the supervisor's
            loop every time a child incarnation ends, exactly once per incarnation, before
            any restart decision: for crashes when :meth:`run` handles the exit, for
            children the supervisor stops when their stop returns. Exceptions from it are
            logged and ignored; it must not block.
        on_child_start: ``hook(child_id, child)`` called the same way after each
            successful (re)start, before the next child is started.

    Raises:
        SpecError: bad spec, duplicate child id, or a hook that is not callable.

    Source: Erlang/OTP ``supervisor.erl``; see the module docstring for the mapping.
    """

    def __init__(self, spec: SupervisorSpec, children: Sequence[ChildSpec], *,
                 name: str = "supervisor",
                 on_child_exit: Callable[[str, ChildExit], None] | None = None,
                 on_child_start: Callable[[str, Child], None] | None = None) -> None:
        if not isinstance(spec, SupervisorSpec):
            raise SpecError(f"spec must be a SupervisorSpec, got {spec!r}")
        if isinstance(children, (str, bytes)) or not isinstance(children, Sequence):
            raise SpecError(f"children must be a list of ChildSpec, got {children!r}")
        ids: set[str] = set()
        for child in children:
            if not isinstance(child, ChildSpec):
                raise SpecError(f"children must be a list of ChildSpec, got an item {child!r}")
            if child.id in ids:
                raise SpecError(f"duplicate child id {child.id!r}: ids must be unique "
                                f"within one supervisor")
            ids.add(child.id)
        if not isinstance(name, str) or not name:
            raise SpecError(f"name must be a non-empty str, got {name!r}")
        for what, hook in (("on_child_exit", on_child_exit), ("on_child_start", on_child_start)):
            if hook is not None and not callable(hook):
                raise SpecError(f"{what} must be None or a callable, got {hook!r}")
        self.name = name
        """Label used in logs and errors."""
        self.spec = spec
        """The supervisor spec (strategy, intensity, period_s)."""
        self._child_specs = tuple(children)
        self._on_child_exit = on_child_exit
        self._on_child_start = on_child_start
        self._state = _State.NEW
        self._slots = [_Slot(s) for s in self._child_specs]
        self._starts = {s.id: 0 for s in self._child_specs}
        self._restart_window = RestartWindow(spec.intensity, spec.period_s)
        self._restart_total = 0
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._events: asyncio.Queue[object] | None = None
        self._op: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._failure: IntensityExceeded | None = None
        self._run_active = False
        self._brutal = False
        self._stopping_child: Child | None = None
        self._bg_run: asyncio.Task[None] | None = None

    # ================================================================== lifecycle
    @property
    def state(self) -> str:
        """``"new"``, ``"starting"``, ``"running"``, ``"stopping"``, ``"stopped"`` or
        ``"failed"`` (escalated with IntensityExceeded)."""
        return self._state.value

    async def start(self) -> None:
        """Start all children in list order, each one ready before the next starts.

        Also resets the restart window, so a supervisor that stopped or escalated can be
        started again (that is how a parent restarts a nested supervisor; the
        cumulative counters of ``count_restarts`` and ``ChildInfo.restarts`` are kept).
        Children are not watched for exits until :meth:`run` runs; exits meanwhile are
        queued and handled then.

        Raises:
            SupervisorError: already starting, running or stopping.
            ChildStartError: a child failed to start (``child_id`` says which; the cause
                is chained). The children already started were stopped in reverse start
                order, each honouring its shutdown timeout, before this is raised.

        Cancellation: the children already started are stopped (to completion) before
            ``CancelledError`` propagates; the supervisor is then ``"stopped"``.
        """
        if self._state in (_State.STARTING, _State.RUNNING, _State.STOPPING):
            raise SupervisorError(f"supervisor {self.name!r} is already {self._state.value}")
        self._loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()
        self._events = asyncio.Queue()
        self._op = None
        self._stop_task = None
        self._failure = None
        self._brutal = False
        self._restart_window.clear()
        self._slots = [_Slot(s) for s in self._child_specs]
        self._state = _State.STARTING
        self._notify()
        log.info("supervisor %r: starting %d children (%s, intensity %d in %g s)", self.name,
                 len(self._slots), self.spec.strategy.value, self.spec.intensity,
                 self.spec.period_s)
        try:
            async with self._lock:
                for slot in list(self._slots):
                    await self._start_slot(slot)
                self._state = _State.RUNNING
        except BaseException:
            cleanup = self._loop.create_task(self._terminate_all())
            try:
                await finish_despite_cancel(cleanup)
            finally:
                self._state = _State.STOPPED
                self._notify()
            raise
        self._notify()

    async def run(self) -> None:
        """Supervise the children until :meth:`stop` or escalation.

        Handles child exits one at a time in arrival order, restarting promptly (no
        delay) according to restart types and the strategy.

        Returns:
            ``None`` once :meth:`stop` has stopped every child (at once if already
            stopped).

        Raises:
            IntensityExceeded: restart intensity exceeded; all children were stopped in
                reverse start order first (OTP escalation).
            SupervisorNotRunning: :meth:`start` was not called (or has not finished).
            SupervisorError: ``run()`` is already running in another task.

        Cancellation: cancelling ``run()`` stops all children (to completion, like
            :meth:`stop`) and then propagates ``CancelledError``. A task cancelled before
            ``run()`` began executing never enters it, so nothing is stopped then; prefer
            ``async with supervisor:`` or call :meth:`stop` in a ``finally``.
        """
        if self._state in (_State.NEW, _State.STARTING):
            raise SupervisorNotRunning(f"supervisor {self.name!r}: call start() before run()")
        if self._run_active:
            raise SupervisorError(f"supervisor {self.name!r}: run() is already running")
        assert self._loop is not None and self._events is not None
        self._run_active = True
        try:
            while True:
                if self._state is _State.STOPPED:
                    return
                if self._state is _State.FAILED:
                    assert self._failure is not None
                    raise self._failure
                event = await self._events.get()
                if event is _WAKE or self._state is not _State.RUNNING \
                        or self._stop_task is not None:
                    continue
                op = self._loop.create_task(self._handle(event),
                                            name=f"supervisor {self.name} restart")
                self._op = op
                try:
                    await asyncio.wait((op,))
                except asyncio.CancelledError:
                    op.cancel()
                    raise
                finally:
                    if self._op is op:
                        self._op = None
                if op.cancelled():
                    continue  # interrupted by stop(); the loop sees STOPPED soon
                exc = op.exception()
                if isinstance(exc, IntensityExceeded):
                    raise exc
                if exc is not None:
                    log.error("supervisor %r: internal error; stopping", self.name,
                              exc_info=exc)
                    await self.stop()
                    raise exc
        except asyncio.CancelledError:
            if self._state in (_State.RUNNING, _State.STOPPING):
                await finish_despite_cancel(self._ensure_stop_task())
            raise
        finally:
            self._run_active = False

    async def stop(self) -> None:
        """Stop all children in reverse start order, honouring each shutdown timeout.

        A restart in progress is interrupted first (the child being started has its start
        cancelled). Idempotent: concurrent and repeated calls share one stop; a supervisor
        that never started, already stopped, or escalated returns at once. :meth:`run`
        returns once this completes.

        Cancellation: atomic with respect to cancellation; the stop continues in the
        background and the caller's ``CancelledError`` propagates.
        """
        if self._stop_task is None and self._state in (_State.NEW, _State.STOPPED,
                                                       _State.FAILED):
            return
        await asyncio.shield(self._ensure_stop_task())

    async def __aenter__(self) -> Supervisor:
        """Start the children, then run :meth:`run` in a background task."""
        await self.start()
        assert self._loop is not None
        self._bg_run = self._loop.create_task(self.run(), name=f"supervisor {self.name} run")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        """Stop the children (to completion, even if the block is being cancelled).

        If the background :meth:`run` escalated meanwhile, raise its
        :class:`IntensityExceeded` here (or only log it if the block is already raising).
        """
        try:
            if self._stop_task is not None or self._state not in (
                    _State.NEW, _State.STOPPED, _State.FAILED):
                # Like stop(), but wait for the children even if we are being cancelled.
                await wait_despite_cancel(self._ensure_stop_task())
        finally:
            task, self._bg_run = self._bg_run, None
            if task is not None:
                await wait_despite_cancel(task)
                failure = None if task.cancelled() else task.exception()
                if failure is not None:
                    if exc_type is None:
                        raise failure
                    log.error("supervisor %r: %s (while the block raised %r)", self.name,
                              failure, exc)

    def as_child_spec(self, id: str | None = None, *, restart: Restart = Restart.PERMANENT,
                      shutdown_timeout_s: float | None = math.inf) -> ChildSpec:
        """A ChildSpec that runs this supervisor as a child of another one.

        Its start function is ``SupervisorChild.start(self)``: :meth:`start`, then
        :meth:`run` in a task. The child exits normally when this supervisor is stopped,
        abnormally when it escalates (``IntensityExceeded``), so the parent restarts it
        (this same object, started afresh) by its restart type and strategy.

        Args:
            id: child id in the parent; default ``self.name``.
            restart: restart type in the parent; default permanent.
            shutdown_timeout_s: default ``math.inf`` (OTP: supervisors get ``infinity``
                to shut their subtree down); past a finite timeout its remaining children
                are killed at once.
        """
        return ChildSpec(id if id is not None else self.name,
                         functools.partial(SupervisorChild.start, self),
                         restart=restart, shutdown_timeout_s=shutdown_timeout_s)

    # ================================================================== queries
    def which_children(self) -> list[ChildInfo]:
        """Snapshot of the children in start order (removed temporary children excluded)."""
        return [ChildInfo(id=s.spec.id,
                          pid=getattr(s.child, "pid", None) if s.child is not None and s.status == "running"
                          else None,  # an exit reported but not yet handled: no running incarnation
                          restarts=max(0, self._starts[s.spec.id] - 1),
                          status=s.status, restart=s.spec.restart, last_exit=s.last_reason)
                for s in self._slots]

    def count_restarts(self) -> int:
        """Restarts counted against the intensity over the life of this object.

        One per restart decision (a one_for_all restart of five children counts once)
        and one per retry of a failed restart, as OTP's ``add_restart/1`` counts.
        """
        return self._restart_total

    async def wait_started(self, child_id: str, *, after_restarts: int = 0) -> None:
        """Wait until ``child_id`` has been started ``after_restarts + 1`` times in all.

        Condition-based (woken on every state change), no polling: ``after_restarts=0``
        waits for the first start, ``1`` for the first restart, and so on; it returns at
        once if that already happened. Meant for tests; wrap it in a timeout.

        Raises:
            ChildNotFound: no child spec with that id.
            SupervisorNotRunning: the supervisor stopped or escalated before that.
        """
        if child_id not in self._starts:
            raise ChildNotFound(f"supervisor {self.name!r} has no child {child_id!r}")
        if isinstance(after_restarts, bool) or not isinstance(after_restarts, int) \
                or after_restarts < 0:
            raise SpecError(f"after_restarts must be an int >= 0, got {after_restarts!r}")
        while self._starts[child_id] < after_restarts + 1:
            if self._state in (_State.STOPPED, _State.FAILED):
                raise SupervisorNotRunning(
                    f"supervisor {self.name!r} is {self._state.value}; child {child_id!r} "
                    f"was started {self._starts[child_id]} time(s), waited for "
                    f"{after_restarts + 1}")
            await self._changed.wait()

    # ================================================================== OTP-like calls
    async def restart_child(self, id: str) -> Child:
        """Start a child that is not running, like OTP ``supervisor:restart_child/2``.

        Does not count against the intensity. Waits for any restart in progress.

        Returns:
            The started child.

        Raises:
            ChildNotFound: unknown id, or a temporary child that was already removed.
            ChildRunning: the child is running or being restarted.
            ChildStartError: its start failed (the child stays stopped).
            SupervisorNotRunning: the supervisor is not running.
        """
        async with self._locked():
            slot = self._find(id)
            if slot.child is not None or slot.status == "restarting":
                raise ChildRunning(f"supervisor {self.name!r}: child {id!r} is "
                                   f"{'running' if slot.child is not None else 'restarting'}")
            return await self._start_slot(slot)

    async def terminate_child(self, id: str) -> None:
        """Stop a child and keep it stopped, like OTP ``supervisor:terminate_child/2``.

        The child is stopped with its shutdown timeout and not restarted (neither now nor
        by its restart type); a pending retry of a failed restart is dropped. A temporary
        child's spec is removed. Use :meth:`restart_child` to start it again. No-op if
        the child is not running.

        Raises:
            ChildNotFound: unknown id.
            SupervisorNotRunning: the supervisor is not running.

        Cancellation: the child's stop completes before ``CancelledError`` propagates.
        """
        async with self._locked():
            slot = self._find(id)
            if slot.child is not None:
                await self._terminate(slot)
            else:
                slot.status = "stopped"
                if slot.spec.restart is Restart.TEMPORARY:
                    self._slots.remove(slot)
                self._notify()

    # ================================================================== internals
    def _locked(self) -> _RunningLock:
        return _RunningLock(self)

    def _find(self, child_id: str) -> _Slot:
        for slot in self._slots:
            if slot.spec.id == child_id:
                return slot
        raise ChildNotFound(f"supervisor {self.name!r} has no child {child_id!r}")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _ensure_stop_task(self) -> asyncio.Task[None]:
        if self._stop_task is None:
            assert self._loop is not None
            self._stop_task = self._loop.create_task(self._do_stop(),
                                                     name=f"supervisor {self.name} stop")
        return self._stop_task

    async def _do_stop(self) -> None:
        assert self._lock is not None and self._events is not None
        if self._op is not None:
            self._op.cancel()
        async with self._lock:
            if self._state is _State.RUNNING:
                log.info("supervisor %r: stopping", self.name)
                self._state = _State.STOPPING
                self._notify()
                await self._terminate_all()
                self._state = _State.STOPPED
                log.info("supervisor %r: stopped", self.name)
        self._events.put_nowait(_WAKE)
        self._notify()

    async def kill(self) -> None:
        """Stop at once: the child being stopped and every remaining child are killed without grace (OTP
        ``brutal_kill``: SIGKILL to a process child's group; a nested supervisor is killed the same way), in
        reverse start order. Joins a graceful :meth:`stop` in progress and makes it brutal from here on (what
        an operator's second Ctrl-C asks for). Idempotent; returns when every child has exited."""
        await self._kill()

    async def _kill(self) -> None:
        """Brutal stop (parent's shutdown timeout passed, or :meth:`kill`): kill remaining children at once."""
        self._brutal = True
        child = self._stopping_child
        if child is not None:
            try:
                await child.stop(None)
            except Exception:
                log.exception("supervisor %r: killing %r failed", self.name, child)
        await self.stop()

    async def _start_slot(self, slot: _Slot) -> Child:
        spec = slot.spec
        try:
            child = await spec.start()
        except ChildStartError as exc:
            raise ChildStartError(f"supervisor {self.name!r}: child {spec.id!r} failed to "
                                  f"start: {exc}", child_id=spec.id, output=exc.output) from exc
        except Exception as exc:
            raise ChildStartError(f"supervisor {self.name!r}: child {spec.id!r} failed to "
                                  f"start: {exc!r}", child_id=spec.id) from exc
        if not isinstance(child, Child):
            raise ChildStartError(
                f"supervisor {self.name!r}: child {spec.id!r}: start returned {child!r}, "
                f"which is not a Child (needs pid, wait(), stop(timeout_s))", child_id=spec.id)
        assert self._loop is not None and self._events is not None
        slot.child = child
        slot.status = "running"
        self._starts[spec.id] += 1
        slot.watcher = self._loop.create_task(self._watch(slot, child),
                                              name=f"supervisor {self.name} watch {spec.id}")
        log.info("supervisor %r: started child %r (pid %s)", self.name, spec.id,
                 getattr(child, "pid", None))
        call_hook(self._on_child_start, "on_child_start", spec.id, child)
        self._notify()
        return child

    async def _watch(self, slot: _Slot, child: Child) -> None:
        """Wait for ``child``'s exit; report it (log line, ``on_child_exit``) at once, then queue it for
        :meth:`_handle`, which restarts by the strategy.

        The report does not wait for its turn in the queue: handling an exit can take as long as a child's
        start (a process: its imports and readiness, ~1 s), and exits that happen meanwhile were reported only
        after it. The node's hook is how the ingresses learn that a worker died and fail what they forwarded
        there; with two workers killed together, requests held by the second waited ~1 s for that (a
        fresh-user trial, 2026-12-02). Restarts stay one at a time, in arrival order (OTP). Only while
        running: an exit during start-up or stop is reported when handled, as before."""
        assert self._events is not None
        try:
            exit_ = await child.wait()
        except Exception as exc:
            exit_ = ChildExit(False, f"wait() raised {exc!r}")
        reported = False
        if self._state is _State.RUNNING and self._stop_task is None and slot.child is child:
            slot.status = "stopped" if _stays_down(slot.spec, exit_) else "restarting"  # as _handle sets it
            self._report_exit(slot, child, exit_, by_supervisor=False)
            reported = True
        self._events.put_nowait(_Exited(slot, child, exit_, reported))

    def _report_exit(self, slot: _Slot, child: Child, exit_: ChildExit, *,
                     by_supervisor: bool) -> None:
        slot.last_reason = exit_.reason
        # ERROR for a crash; WARNING for a normal exit the supervisor did not ask for that it restarts (a permanent
        # child's SIGTERM from outside: the restart counts against the intensity, so an operator who reads only
        # stderr sees it spent; a fresh-user trial saw SIGTERMed actors in node.log alone); INFO otherwise
        if by_supervisor:
            level = 20
        elif not exit_.normal:
            level = 40
        else:
            level = 20 if _stays_down(slot.spec, exit_) else 30
        log.log(level, "supervisor %r: child %r (pid %s) %s: %s", self.name, slot.spec.id,
                getattr(child, "pid", None), "stopped" if by_supervisor else "exited",
                exit_.reason)
        call_hook(self._on_child_exit, "on_child_exit", slot.spec.id, exit_)

    async def _terminate(self, slot: _Slot) -> None:
        """Stop one running child (OTP ``do_terminate/2``); runs to completion."""
        child, watcher = slot.child, slot.watcher
        assert child is not None and self._loop is not None
        slot.child = None
        slot.watcher = None
        slot.status = "stopped"
        if watcher is not None:
            watcher.cancel()
        timeout_s = None if self._brutal else slot.spec.shutdown_timeout_s
        self._stopping_child = child
        try:
            await finish_despite_cancel(
                self._loop.create_task(self._stop_child(slot, child, timeout_s)))
        finally:
            self._stopping_child = None

    async def _stop_child(self, slot: _Slot, child: Child, timeout_s: float | None) -> None:
        try:
            exit_ = await child.stop(timeout_s)
        except Exception as exc:
            log.exception("supervisor %r: stopping child %r raised", self.name, slot.spec.id)
            exit_ = ChildExit(False, f"stop() raised {exc!r}")
        self._report_exit(slot, child, exit_, by_supervisor=True)
        if slot.spec.restart is Restart.TEMPORARY and slot in self._slots:
            self._slots.remove(slot)
        self._notify()

    async def _terminate_all(self) -> None:
        """Stop all children in reverse start order (OTP ``terminate_children/2``)."""
        for slot in reversed(list(self._slots)):
            if slot.child is not None:
                await self._terminate(slot)
            elif slot.status == "restarting":
                slot.status = "stopped"
        self._notify()

    async def _handle(self, event: object) -> None:
        """Handle one queued event (OTP ``handle_info({'EXIT',..})`` / ``try_again``)."""
        assert self._lock is not None
        async with self._lock:
            if self._state is not _State.RUNNING or self._stop_task is not None:
                return
            if isinstance(event, _Exited):
                slot = event.slot
                if slot.child is not event.child or slot not in self._slots:
                    return  # stale: that incarnation was stopped by us meanwhile
                restart = slot.spec.restart
                stays_down = _stays_down(slot.spec, event.exit)
                slot.child = None
                slot.watcher = None
                slot.status = "stopped" if stays_down else "restarting"
                if not event.reported:
                    self._report_exit(slot, event.child, event.exit, by_supervisor=False)
                if stays_down:
                    if restart is Restart.TEMPORARY:
                        self._slots.remove(slot)
                    self._notify()
                    return
                await self._restart(slot, counted=not self._exempt(slot, event.exit))
            elif isinstance(event, _TryAgain):
                slot = event.slot
                if slot not in self._slots or slot.child is not None \
                        or slot.status != "restarting":
                    return  # terminated or restarted meanwhile
                await self._restart(slot)

    def _exempt(self, slot: _Slot, exit_: ChildExit) -> bool:
        """Whether the child's spec exempts this exit from the intensity (:attr:`ChildSpec.exempt`)."""
        exempt = slot.spec.exempt
        if exempt is None or exit_.normal:
            return False
        try:
            if exempt(exit_):
                log.warning("supervisor %r: child %r: %s: not counted against the restart intensity (its spec "
                            "exempts it)", self.name, slot.spec.id, exit_.reason)
                return True
        except Exception:
            log.exception("supervisor %r: child %r: its exempt() raised; the restart counts", self.name,
                          slot.spec.id)
        return False

    async def _restart(self, slot: _Slot, counted: bool = True) -> None:
        """Count one restart (unless not ``counted``: :attr:`ChildSpec.exempt`), then escalate or apply the
        strategy (OTP ``restart/2,3``)."""
        if counted:
            self._restart_total += 1
        if counted and not self._restart_window.add(time.monotonic()):
            log.error("supervisor %r: reached max restart intensity (%d in %g s) after "
                      "child %r: %s; stopping all children", self.name, self.spec.intensity,
                      self.spec.period_s, slot.spec.id, slot.last_reason)
            failure = IntensityExceeded(self.name, intensity=self.spec.intensity,
                                        period_s=self.spec.period_s, child_id=slot.spec.id,
                                        reason=slot.last_reason)
            slot.status = "stopped"
            await self._terminate_all()
            self._failure = failure
            self._state = _State.FAILED
            self._notify()
            raise failure
        strategy = self.spec.strategy
        if strategy is Strategy.ONE_FOR_ONE:
            group = [slot]
        elif strategy is Strategy.ONE_FOR_ALL:
            group = list(self._slots)
        else:
            group = self._slots[self._slots.index(slot):]
        for other in reversed(group):
            if other.child is not None:
                await self._terminate(other)
        group = [s for s in group if s in self._slots]  # temporary ones were removed
        for member in group:
            member.status = "restarting"
        self._notify()
        log.info("supervisor %r: restarting %s (%s)", self.name,
                 ", ".join(repr(s.spec.id) for s in group), strategy.value)
        for i, member in enumerate(group):
            try:
                await self._start_slot(member)
            except ChildStartError as exc:
                # OTP: the failed child is marked restarting and retried through the
                # mailbox; the ones not attempted yet are left without a pid (the retry
                # applies the strategy again, which covers them).
                log.error("%s; will try again", exc)
                member.last_reason = str(exc)
                for not_attempted in group[i + 1:]:
                    not_attempted.status = "stopped"
                self._notify()
                assert self._events is not None
                self._events.put_nowait(_TryAgain(member))
                return


class _RunningLock:
    """``async with``: take the supervisor lock, require it to be running (and not
    stopping) once the lock is held."""

    def __init__(self, sup: Supervisor) -> None:
        self._sup = sup

    async def __aenter__(self) -> None:
        sup = self._sup
        if sup._lock is None or sup._state is not _State.RUNNING or sup._stop_task is not None:
            raise SupervisorNotRunning(f"supervisor {sup.name!r} is {sup._state.value}")
        await sup._lock.acquire()
        if sup._state is not _State.RUNNING or sup._stop_task is not None:
            sup._lock.release()
            raise SupervisorNotRunning(f"supervisor {sup.name!r} is {sup._state.value}")

    async def __aexit__(self, *exc_info: Any) -> None:
        assert self._sup._lock is not None
        self._sup._lock.release()


class SupervisorChild:
    """A :class:`Supervisor` running as the child of another supervisor.

    Usually created through :meth:`Supervisor.as_child_spec`. ``pid`` is ``None``.
    Exits: stopped → ``ChildExit(True, "stopped")``; escalated →
    ``ChildExit(False, "escalated: <IntensityExceeded message>")``.
    """

    def __init__(self, supervisor: Supervisor, run_task: asyncio.Task[None]) -> None:
        """Private: use :meth:`SupervisorChild.start`."""
        self.supervisor = supervisor
        """The nested supervisor."""
        self._run = run_task

    @classmethod
    async def start(cls, supervisor: Supervisor) -> SupervisorChild:
        """Start ``supervisor`` (all its children ready) and run it in a task.

        Raises:
            ChildStartError: one of its children failed to start (it stopped the others).
        """
        await supervisor.start()
        task = asyncio.get_running_loop().create_task(
            supervisor.run(), name=f"supervisor {supervisor.name} run")
        return cls(supervisor, task)

    @property
    def pid(self) -> None:
        """Always ``None``: the nested supervisor runs in this process."""
        return None

    async def wait(self) -> ChildExit:
        """Return once the nested supervisor's :meth:`Supervisor.run` has ended."""
        await asyncio.wait((self._run,))
        return self._exit()

    async def stop(self, timeout_s: float | None) -> ChildExit:
        """Stop the nested supervisor (its children in reverse start order).

        Args:
            timeout_s: ``math.inf`` (default in ``as_child_spec``) waits for a full
                graceful stop; past a finite timeout, or at once for ``None``, its
                remaining children are killed without grace.
        """
        timeout_s = check_shutdown_timeout(timeout_s, "timeout_s")
        sup = self.supervisor
        if not self._run.done():
            if timeout_s is None:
                await sup._kill()
            else:
                stopping = asyncio.ensure_future(sup.stop())
                done, _ = await asyncio.wait(
                    (stopping,), timeout=None if math.isinf(timeout_s) else timeout_s)
                if not done:
                    log.warning("supervisor %r did not stop within %g s; killing its children",
                                sup.name, timeout_s)
                    await sup._kill()
                    await asyncio.wait((stopping,))
            await asyncio.wait((self._run,))
        return self._exit()

    def _exit(self) -> ChildExit:
        if self._run.cancelled():
            return ChildExit(False, "cancelled")
        exc = self._run.exception()
        if exc is None:
            return ChildExit(True, "stopped")
        if isinstance(exc, IntensityExceeded):
            return ChildExit(False, f"escalated: {exc}")
        return ChildExit(False, f"raised {exc!r}")

    def __repr__(self) -> str:
        return f"<SupervisorChild {self.supervisor.name!r} {self.supervisor.state}>"
