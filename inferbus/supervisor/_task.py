"""asyncio-task children: :class:`TaskChild`.

A ``TaskChild`` runs ``fn(*args, task_status=...)`` as an asyncio task on the loop that
called :meth:`TaskChild.start`; ``fn`` reports readiness with
``task_status.started(value)``, the convention of anyio's ``TaskGroup.start()``.
Stopping a task child means cancelling its task: asyncio has no way to kill a task, so
a task that swallows cancellation can only be abandoned (see :meth:`TaskChild.stop`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

from ._aio import log
from ._errors import ChildStartError
from ._spec import ChildExit, check_shutdown_timeout

__all__ = ["TaskChild", "TaskStatus"]


class TaskStatus:
    """Handed to a task child's function as ``task_status`` (anyio-compatible)."""

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self._future = future

    def started(self, value: Any = None) -> None:
        """Signal that the task is ready; ``value`` becomes ``TaskChild.value``.

        Raises:
            RuntimeError: called more than once.
        """
        if self._future.done():
            raise RuntimeError("called 'started' twice on the same task status")
        self._future.set_result(value)


class TaskChild:
    """An asyncio task supervised as a child; create it with :meth:`start`.

    Satisfies the ``Child`` protocol (``pid`` is always ``None``). Exits: the function
    returned → ``ChildExit(True, "returned")``; raised → ``ChildExit(False,
    "raised ValueError('x')")``; cancelled by :meth:`stop` (its supervisor stopping it: OTP's
    ``shutdown``, an orderly end) → ``ChildExit(True, "stopped")``; cancelled by anything else →
    ``ChildExit(False, "cancelled")``.
    """

    def __init__(self, task: asyncio.Task[Any], name: str,
                 started: asyncio.Future[Any]) -> None:
        """Private: use :meth:`TaskChild.start`."""
        self._task = task
        self._started = started
        self._stopped = False
        """:meth:`stop` cancelled the task (its exit is then normal, ``"stopped"``)."""
        self.name = name
        """Task name, used in logs."""
        self.value: Any = None
        """The value passed to ``task_status.started()``."""

    @classmethod
    async def start(cls, fn: Callable[..., Awaitable[Any]], *args: Any,
                    name: str | None = None) -> TaskChild:
        """Run ``fn(*args, task_status=status)`` as a task; return once it is ready.

        Args:
            fn: ``async def fn(*args, task_status)``; must call
                ``task_status.started(value=None)`` once it is ready.
            *args: positional arguments for ``fn``.
            name: task name; default ``fn.__qualname__``.

        Returns:
            The running child; ``.value`` holds what ``fn`` passed to ``started()``.

        Raises:
            ChildStartError: ``fn`` raised (chained in ``__cause__``), returned or was
                cancelled before calling ``task_status.started()``.

        Cancellation: the task is cancelled and awaited before ``CancelledError``
        propagates.
        """
        loop = asyncio.get_running_loop()
        name = name or getattr(fn, "__qualname__", repr(fn))
        started: asyncio.Future[Any] = loop.create_future()
        coro = fn(*args, task_status=TaskStatus(started))
        task = loop.create_task(coro, name=name)  # type: ignore[arg-type]
        child = cls(task, name, started)
        task.add_done_callback(child._on_done)
        try:
            await asyncio.wait((started, task), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait((task,))
            raise
        if started.done():
            child.value = started.result()
            return child
        if task.cancelled():
            raise ChildStartError(f"task {name!r} was cancelled before task_status.started()")
        exc = task.exception()
        if exc is None:
            raise ChildStartError(f"task {name!r} returned without calling "
                                  f"task_status.started()")
        raise ChildStartError(f"task {name!r} raised {exc!r} before "
                              f"task_status.started()") from exc

    @property
    def pid(self) -> None:
        """Always ``None``: a task is not an OS process."""
        return None

    async def wait(self) -> ChildExit:
        """Return the exit once the task has finished; cancelling the caller does not
        affect the task."""
        await asyncio.wait((self._task,))
        return self._exit()

    async def stop(self, timeout_s: float | None) -> ChildExit:
        """Cancel the task and wait for it to finish.

        Args:
            timeout_s: how long to wait for the task to finish after cancelling it.
                ``None`` (brutal_kill) and ``math.inf`` wait until it has finished:
                cancellation is the strongest stop asyncio offers. After a finite timeout
                a task still running (it swallowed the cancellation) is abandoned: an
                error is logged and ``ChildExit(False, "ignored cancellation ...")`` is
                returned while the task keeps running.

        Returns:
            The exit (at once if the task had already finished).

        Cancellation: the task stays cancelled; the caller's cancellation propagates.
        """
        timeout_s = check_shutdown_timeout(timeout_s, "timeout_s")
        if not self._task.done():
            self._stopped = True
            self._task.cancel()
            wait_s = None if timeout_s is None or math.isinf(timeout_s) else timeout_s
            done, _ = await asyncio.wait((self._task,), timeout=wait_s)
            if not done:
                log.error("task child %r ignored cancellation for %g s; abandoned",
                          self.name, timeout_s)
                return ChildExit(False, f"ignored cancellation for {timeout_s:g} s; abandoned")
        return self._exit()

    def _exit(self) -> ChildExit:
        if self._task.cancelled():
            return ChildExit(True, "stopped") if self._stopped else ChildExit(False, "cancelled")
        exc = self._task.exception()
        if exc is not None:
            return ChildExit(False, f"raised {exc!r}")
        return ChildExit(True, "returned")

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        # Retrieve the exception (no "never retrieved" warning) and log the traceback
        # of a crash once (a crash before started() becomes ChildStartError instead);
        # the supervisor logs the one-line reason.
        if task.cancelled() or not self._started.done():
            return
        exc = task.exception()
        if exc is not None:
            log.error("task child %r crashed", self.name, exc_info=exc)

    def __repr__(self) -> str:
        return f"<TaskChild {self.name!r} {'done' if self._task.done() else 'running'}>"
