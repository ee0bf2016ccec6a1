"""Small asyncio helpers shared by the supervisor modules (private)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")

log = logging.getLogger("inferbus.supervisor")


async def wait_despite_cancel(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` is done even if the caller is cancelled meanwhile.

    The task itself is never cancelled by this call, and its outcome is not examined.
    If the caller was cancelled while waiting, ``CancelledError`` is raised once the
    task has finished. The wait is inside a shielded anyio ``CancelScope``, so a caller
    in a cancelled anyio task group is not re-cancelled on every loop iteration (anyio
    re-delivers cancellation until the task leaves the cancelled scope); a plain
    ``Task.cancel()`` is caught here and re-raised at the end.
    """
    cancelled = False
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.wait((task,))
            except asyncio.CancelledError:
                cancelled = True
    if cancelled:
        raise asyncio.CancelledError


async def finish_despite_cancel(task: asyncio.Future[T]) -> T:
    """Wait until ``task`` is done even if the caller is cancelled meanwhile.

    The task itself is never cancelled by this call. If the caller was cancelled while
    waiting, ``CancelledError`` is raised once the task has finished; otherwise the task's
    result (or exception) is returned (raised). Used where stopping must not be left
    half done (killing children), so cleanup is atomic with respect to cancellation.
    """
    await wait_despite_cancel(task)
    return task.result()


def call_hook(hook: Callable[..., Any] | None, what: str, *args: Any) -> None:
    """Call a user hook synchronously; log and ignore any ``Exception`` it raises."""
    if hook is None:
        return
    try:
        hook(*args)
    except Exception:
        log.exception("%s hook %r raised; ignored", what, hook)
