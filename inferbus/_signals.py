"""Stopping a command's run on SIGTERM or SIGINT with its clean-up done (``bench``, ``chaos run``)."""

from __future__ import annotations

import asyncio
import signal


class StoppedBySignal(Exception):
    """The run was stopped by ``args[0]`` (a :class:`signal.Signals`); its clean-up ran. Exit with ``128 + signal``."""


async def until_signal(coro):
    """Await ``coro``; SIGTERM or SIGINT cancels it (so its ``finally`` blocks stop what it started), then
    :class:`StoppedBySignal` is raised with the first signal. A second signal cancels that clean-up too.

    The handlers are the loop's (``loop.add_signal_handler``), so a SIGINT that came in ignored (a background job of a
    non-interactive shell) stops the run as well, and SIGTERM's default action (the process killed alone, its child
    processes and folders left behind) never applies. Where the loop takes no handlers, ``coro`` runs without them.

    Raises:
        StoppedBySignal: a signal stopped it.
    """
    task = asyncio.current_task()
    got: list[signal.Signals] = []
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        got.append(sig)
        task.cancel()

    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - no signal handlers on this loop
            pass
    try:
        return await coro
    except asyncio.CancelledError:
        if got:
            raise StoppedBySignal(got[0]) from None
        raise
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
