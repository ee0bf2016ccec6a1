"""Busy polling: keep a process's event loop polling its sockets for a while after each request.

An idle asyncio process blocks in ``epoll_wait``. The next request then pays for the wake-up (the
scheduler, a vCPU leaving its halt state on a VM) and runs on cold CPU caches: on the H200 host a colocated
process spent ~300 CPU µs per cache miss at ~2.7k requests/s and ~170 µs at saturation, for the same work.
Measured effect (docs/performance.md, "Busy polling"): at light load the p50 falls (cache hits at
concurrency 1 by 18-42 %); near saturation on a 16-core host (a VM) the p99 rose and the closed-loop
throughput dropped 3-12 %.

The idea and the unit come from Linux socket busy polling (``net.core.busy_poll`` / ``SO_BUSY_POLL``, in
µs: spin on the device queue instead of sleeping) and OpenOnload's ``EF_POLL_USEC``. Here the spin is one
turn of the event loop at a time (``await asyncio.sleep(0)``: uvloop then polls with a zero timeout), for
``window_us`` after the last request, then the loop blocks again as usual.

Costs a full core while requests arrive at least every ``window_us``. Meant for processes with a core each
(``inferbus up --colocate --pin-cpus --busy-poll-us N``); off by default.
"""

from __future__ import annotations

import asyncio
import time

from .._limits import MAX_WINDOW_US  # (defined there, so the CLI's help reads it without importing the bus)
from .._limits import interval, number_as_typed


PAUSE_S = 0.001
"""While ``pause()`` is true the loop waits this long in its poll between checks instead of spinning (uvloop's
timers have 1 ms resolution); a thread's completion handed back with ``call_soon_threadsafe`` wakes it sooner."""


def check_busy_poll_us(value_us: float, what: str) -> float:
    """``value_us`` if it is a busy-polling setting this package accepts: 0 (off) to :data:`MAX_WINDOW_US` µs.

    Raises:
        ValueError: anything else (negative, above 1 s, nan, inf), naming ``what`` and the value.
    """
    if not 0 <= value_us <= MAX_WINDOW_US:  # also refuses nan
        raise ValueError(f"{what} must be in {interval(0, MAX_WINDOW_US)} µs (0 = off), got "
                         f"{number_as_typed(value_us)}")
    return value_us


class BusyPoll:
    """Spin the running event loop for ``window_us`` after the last :meth:`poke`.

    Start :meth:`run` as a task of the loop to keep polling; call :meth:`poke` from the request handlers
    (cheap: two attribute stores and a test). Loop thread only.

    A spinning loop holds the GIL: another thread of the process (a worker's inference thread) would get it
    only when CPython's switch interval (``sys.getswitchinterval()``, 5 ms) forces a hand-over. So while
    ``pause()`` is true the poller does not spin: the loop blocks in its poll (GIL released) for up to
    :data:`PAUSE_S` at a time and the thread runs at once.

    Args:
        window_us: how long to keep polling after the last request, µs (> 0, at most :data:`MAX_WINDOW_US`).
        pause: called before each turn; true = another thread of this process has work (do not spin).

    Raises:
        ValueError: ``window_us`` is not a number in (0, ``MAX_WINDOW_US``].
    """

    def __init__(self, window_us: float, pause=None) -> None:
        if not check_busy_poll_us(window_us, "BusyPoll: window_us"):
            raise ValueError("BusyPoll: window_us must be > 0 µs (0 means no poller at all)")
        self.window_s = window_us / 1e6
        self.pause = pause
        self.until = 0.0
        """``time.monotonic()`` until which the loop keeps polling."""
        self.spinning = False
        self.periods = 0
        """Times polling started after the loop had gone back to blocking."""
        self.turns = 0
        """Turns of the event loop spent spinning (one per ``asyncio.sleep(0)``)."""
        self.paused = 0
        """Waits of up to :data:`PAUSE_S` instead of a spin, because ``pause()`` was true."""
        self._wake = asyncio.Event()

    def poke(self, now: float) -> None:
        """A request arrived at ``now`` (``time.monotonic()`` seconds): poll until ``now + window_us``."""
        self.until = now + self.window_s
        if not self.spinning:
            self.spinning = True
            self._wake.set()

    async def run(self) -> None:
        """Poll while :attr:`until` is ahead, block while it is not; runs until cancelled."""
        wake = self._wake
        monotonic = time.monotonic
        sleep = asyncio.sleep
        while True:
            await wake.wait()
            wake.clear()
            self.periods += 1
            try:
                while monotonic() < self.until:
                    pause = self.pause
                    if pause is not None and pause():
                        self.paused += 1
                        await sleep(PAUSE_S)  # the loop blocks in its poll: the GIL is free for the thread
                    else:
                        await sleep(0)  # one turn of the loop: ready callbacks, then a zero-timeout poll
                        self.turns += 1
            finally:
                self.spinning = False
