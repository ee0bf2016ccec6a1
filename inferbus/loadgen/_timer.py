"""A precise wake-up for the open loop's ticks: a Linux timerfd watched by the event loop.

uvloop (libuv) keeps its clock and its timers in whole milliseconds, so ``asyncio.sleep(0.6e-3)`` may end
anywhere from ~0 to ~1.5 ms later. The lean driver used to sleep until less than 0.5 ms was left and spin
the rest (``asyncio.sleep(0)``); on the H200 its send lag was still 1.1–1.4 ms at p99 at every rate
(docs/performance.md, twenty-eighth session): a sleep that began 0.5–1 ms before a tick could end past it. A
timerfd armed at the tick's absolute time on ``CLOCK_MONOTONIC`` (the clock of :func:`time.monotonic` on
Linux) becomes readable when it expires, never before (timerfd_create(2)). The loop sees that through its own
poll (``add_reader``), with the kernel's wake-up latency and the thread's timer slack, which
:func:`tick_timer` sets to 1 ns (prctl(2) ``PR_SET_TIMERSLACK``; the default slack is 50 µs).

Uses :func:`os.timerfd_create` where Python has it (3.13+), else libc through :mod:`ctypes`.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_PR_SET_TIMERSLACK = 29


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class TickTimer:
    """Wait until an absolute :func:`time.monotonic` time on one event loop, with µs precision.

    Not thread-safe; one waiter at a time. :meth:`close` releases the descriptor.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiter: asyncio.Future | None = None
        if hasattr(os, "timerfd_create"):
            self._fd = os.timerfd_create(time.CLOCK_MONOTONIC, flags=os.TFD_NONBLOCK | os.TFD_CLOEXEC)
            self._libc = None
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"timerfd_create: {os.strerror(err)}")
            self._fd, self._libc = fd, libc
            self._spec = _Itimerspec()
        try:
            loop.add_reader(self._fd, self._expired)
        except BaseException:  # a loop that cannot watch descriptors: the caller paces otherwise; no fd left open
            os.close(self._fd)
            self._fd = -1
            raise

    def _arm(self, t: float) -> None:
        ns = max(1, int(t * 1e9))  # 0 would disarm the timer
        if self._libc is None:
            os.timerfd_settime_ns(self._fd, flags=os.TFD_TIMER_ABSTIME, initial=ns)
            return
        v = self._spec.it_value
        v.tv_sec, v.tv_nsec = divmod(ns, 1_000_000_000)
        if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def _expired(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiration count; reading re-arms readiness
        except BlockingIOError:
            return
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_result(None)

    async def wait_until(self, t: float) -> None:
        """Return at :func:`time.monotonic` time ``t`` (s) or just after; at once when it has passed.

        Raises:
            OSError: the kernel refused to arm the timer.
        """
        if t <= time.monotonic():
            return
        w = self._waiter = self._loop.create_future()
        self._arm(t)
        try:
            await w
        finally:
            self._waiter = None

    def close(self) -> None:
        """Stop watching the timer and close its descriptor (idempotent)."""
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


def tick_timer(loop: asyncio.AbstractEventLoop) -> TickTimer | None:
    """A :class:`TickTimer` on ``loop``, with this thread's timer slack set to 1 ns; None where there is no
    timerfd (not Linux) or the loop cannot watch descriptors: the caller then paces as before."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        timer = TickTimer(loop)
    except (OSError, AttributeError, NotImplementedError):
        return None
    try:
        ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the default slack (50 µs) then applies
    return timer
