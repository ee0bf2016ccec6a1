"""A lean request driver on one NATS connection: no task and no future per request.

Requests are published with a reply subject ``<inbox>.<n>`` under one wildcard
subscription; the subscription callback matches each answer to its request by
``n``, records its latency and, in a closed loop, sends that caller's next
request at once. Bodies are encoded before the step starts. This is what lets
one Python process offer tens of thousands of requests per second without
becoming the bottleneck it measures (the SDK's ``request()`` creates a future
and an ``asyncio.wait_for`` timer per call). Headers are encoded once per step
(:func:`inferbus.bus.publish_raw`), and latencies are kept in a list during the
step and put into the HDR histogram after it.

Open loop: the schedule is cut into ticks of ``tick_s`` (1 ms by default, the
event loop's timer resolution); the requests due in a tick are sent together
and their latency is counted from the tick's scheduled time, so a generator or
system stall shows up in the latency (no coordinated omission). uvloop's
timers have 1 ms resolution and may fire up to 1 ms early, so hitting a tick on
time needs a precise wake-up (``precise=True``): a timerfd the loop watches
(:mod:`inferbus.loadgen._timer`, ``timer=True``, Linux; it does not spin), else a
spin through the last 0.5 ms before the tick (``timer=False``, or no timerfd: for
hosts with cores to spare; that sleep could still end up to ~1.4 ms late). Without
it (``precise=False``, where a spinning generator would steal the pipeline's CPU) the generator sleeps through the remainder and the
latency of a request sent late by less than ``grace_s`` (timer granularity) is
counted from its actual send time; a later send still counts from its schedule.
``send_lag`` records how late each request actually left, either way.

Every answer is judged by the target (:meth:`Target.judge`): error code,
correctness against the reference, and response parameters (cache hit, batch
size; the stage timings of one answer in :data:`STAGE_SAMPLE_EVERY`).
A request unanswered within ``timeout_s`` counts as error ``TIMEOUT``; an open loop's request not sent because
the connection is down and its buffer full, as ``DISCONNECTED`` (:meth:`LeanDriver.open`).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Callable

from ..bus import header_block, publish_raw
from ._result import Recorder
from ._timer import tick_timer
from ._workload import Workload

STAGE_SAMPLE_EVERY = 8
"""The driver adds up the stage timings (``parameters.timings_us``) of one answer in this many: their means stay
those of the whole step, and the other answers cost the generator no timings decode (it runs on the cores the
system under test uses)."""

Judge = Callable[[int, "dict | None", bytes], "tuple[str | None, bool, dict | None]"]


@dataclass
class Target:
    """What one step sends and how it judges an answer.

    Attributes:
        name: ``inferbus``, ``echo`` ... (reported as the result's target).
        subject: where requests go.
        bodies: request bodies, used cyclically (request ``i`` sends ``bodies[i % len]``).
        headers: headers sent with every request (None = plain PUB).
        judge: ``judge(i, headers, body) -> (error code | None, correct, parameters | None)``.
        deadline_after_s: when set, each request also carries ``Inferbus-Deadline-Unix-Ms``: its scheduled send
            time (wall clock) plus this many seconds, the moment the driver stops waiting for it (as the SDK
            sends it), so the ingress refuses a request that waited out its client in the bus.
    """

    name: str
    subject: str
    bodies: list[bytes]
    headers: dict | None
    judge: Judge
    deadline_after_s: float | None = None

    def __post_init__(self) -> None:
        self.header_block = header_block(self.headers) if self.headers else None
        # the block without its closing CRLF: each request appends its deadline header and the CRLF
        self.header_head = self.header_block[:-2] if self.header_block else b"NATS/1.0\r\n"


def infer_target(work: Workload, prefix: str = "inferbus", timeout_ms: float = 1000.0) -> Target:
    """Requests for ``work``'s model version on its public subject, judged against the reference."""
    mv = work.mv
    subject = f"{prefix}.infer.{mv.name}.{mv.version}"
    return Target("inferbus", subject, work.bodies, {"Inferbus-Timeout-Ms": f"{timeout_ms:.3f}"}, work.check_reply,
                  timeout_ms / 1000.0)


def echo_target(work: Workload, subject: str, timeout_ms: float = 1000.0) -> Target:
    """The same bodies and headers as :func:`infer_target`, sent to an echo responder; right = echoed unchanged."""
    bodies = work.bodies

    def judge(i: int, headers, body: bytes):
        if headers and headers.get("Status") == "503":
            return "NO_RESPONDERS", False, None
        return None, body == bodies[i % len(bodies)], None

    return Target("echo", subject, bodies, {"Inferbus-Timeout-Ms": f"{timeout_ms:.3f}"}, judge, timeout_ms / 1000.0)


class LeanDriver:
    """Closed- and open-loop steps over one connected nats-py client; one step at a time.

    Call :meth:`start` once (subscribes the reply inbox), then any number of
    :meth:`closed` / :meth:`open` steps.

    ``nc`` should bound nats-py's forced flush (``flush_timeout``, as the generator processes' connections do:
    :data:`inferbus.loadgen._procs.FLUSH_TIMEOUT_S`): without it a publish made while more than ``pending_size``
    bytes wait to be written can wait for ever if the connection is lost meanwhile, and the step with it.
    """

    def __init__(self, nc) -> None:
        self.nc = nc
        self._inbox = nc.new_inbox()
        self._plen = len(self._inbox) + 1
        self._pending: dict[int, tuple[float, int, int, float]] = {}
        """token -> (reference time, request index, closed-loop slot, µs of the reference's send lag)"""
        self._tok = 0
        self._rec: Recorder | None = None
        self._target: Target | None = None
        self._next: Callable | None = None
        self._done = asyncio.Event()
        self._sending = False
        self._last = 0.0
        self._wall_offset_s = 0.0
        self._timeout_s = float("inf")
        self.late = 0
        self.pacing = ""
        """How the last open-loop step paced its ticks: ``timerfd``, ``spin`` or ``sleep``."""

    async def start(self) -> None:
        await self.nc.subscribe(self._inbox + ".*", cb=self._on_reply, pending_msgs_limit=1_000_000,
                                pending_bytes_limit=1 << 30)
        await self.nc.flush()

    async def _send(self, i: int, t_ref: float, slot: int, lag_us: float = 0.0) -> None:
        """Publish request ``i``; its latency counts from ``t_ref``, which its send left ``lag_us`` behind (the
        open loop's lateness against its schedule, part of the latency; 0 when counted from the send)."""
        tok = self._tok = self._tok + 1
        t = self._target
        self._pending[tok] = (t_ref, i, slot, lag_us)
        block = t.header_block
        if t.deadline_after_s is not None:
            block = t.header_head + b"Inferbus-Deadline-Unix-Ms: %d\r\n\r\n" % (
                (t_ref + self._wall_offset_s + t.deadline_after_s) * 1000.0)
        await publish_raw(self.nc, t.subject, t.bodies[i % len(t.bodies)], reply=f"{self._inbox}.{tok}",
                          headers=block)

    async def _on_reply(self, msg) -> None:
        now = time.monotonic()
        try:
            tok = int(msg.subject[self._plen:])
        except ValueError:
            return
        ent = self._pending.pop(tok, None)
        if ent is None or self._rec is None:
            self.late += 1
            return
        t_ref, i, slot, lag_us = ent
        if now - t_ref > self._timeout_s:  # late: the sweep (every 5-50 ms) had not counted it out yet
            self._rec.record(self._timeout_s * 1e6, "TIMEOUT")
        else:
            err, correct, params = self._target.judge(i, msg.headers, msg.data)
            # the arrival on the wall clock (the worker's done stamp is one): reply_hop ends here, not after the judge
            self._rec.record((now - t_ref) * 1e6, err, correct, params, lag_us, (now + self._wall_offset_s) * 1e6)
        self._last = now
        if self._next is not None:
            await self._next(slot, now)
        elif not self._pending and not self._sending:
            self._done.set()

    async def _sweep(self, timeout_s: float, on_timeout) -> None:
        period = min(max(timeout_s / 4, 0.005), 0.05)
        while True:
            await asyncio.sleep(period)
            limit = time.monotonic() - timeout_s
            expired = []
            for tok, (t_ref, i, slot, _) in self._pending.items():
                if t_ref > limit:
                    break  # insertion order = send order (closed: t_ref = send time)
                expired.append(tok)
            for tok in expired:
                t_ref, i, slot, _ = self._pending.pop(tok)
                self._rec.record(timeout_s * 1e6, "TIMEOUT")
                self._last = time.monotonic()
                await on_timeout(slot)
            if not self._pending and not self._sending:
                self._done.set()

    async def _wait_done(self, sweeper: asyncio.Task) -> None:
        """Until the step is done, or its sweeper ended with an error, which is then the step's (e.g. the
        connection closed: the sweeper's send of a closed loop's next request raised ConnectionClosedError). Before,
        a sweeper that died left the step waiting for ever."""
        done = asyncio.ensure_future(self._done.wait())
        try:
            await asyncio.wait({done, sweeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            done.cancel()
        if not self._done.is_set() and sweeper.done() and not sweeper.cancelled() and sweeper.exception():
            raise sweeper.exception()

    def _begin(self, target: Target) -> Recorder:
        self._wall_offset_s = time.time() - time.monotonic()  # monotonic → wall clock, for deadline headers
        self._rec = Recorder(stage_every=STAGE_SAMPLE_EVERY)
        self._target = target
        self._pending.clear()
        self._done = asyncio.Event()
        self._last = 0.0
        return self._rec

    async def closed(self, target: Target, *, concurrency: int, duration_s: float, timeout_s: float = 1.0,
                     start_at: float | None = None, index_base: int = 0) -> tuple[Recorder, float, float]:
        """``concurrency`` callers for ``duration_s``; each sends its next request when its answer arrives.

        Returns:
            ``(recorder, elapsed_s, cpu_s)``: elapsed from the start to the last answer.
        """
        rec = self._begin(target)
        counter = iter(range(index_base, 10**15))
        if start_at is not None:
            await _sleep_until(start_at)
        start = time.monotonic()
        t_end = start + duration_s
        cpu0 = time.process_time()
        active = concurrency

        async def nxt(slot: int, now: float) -> None:
            nonlocal active
            if now < t_end:
                await self._send(next(counter), now, slot)
                return
            active -= 1
            if active == 0:
                self._done.set()

        self._next = nxt
        self._sending = True
        self._timeout_s = timeout_s  # an answer later than this is a TIMEOUT too (_on_reply)
        sweeper = asyncio.create_task(self._sweep(timeout_s, lambda slot: nxt(slot, time.monotonic())))
        try:
            for slot in range(concurrency):
                await self._send(next(counter), time.monotonic(), slot)
            self._sending = False
            await self._wait_done(sweeper)
        finally:
            sweeper.cancel()
            self._next = None
            self._sending = False
        elapsed = max(self._last, t_end) - start
        self._rec = None
        return rec, elapsed, time.process_time() - cpu0

    async def open(self, target: Target, *, rate_qps: float, duration_s: float, timeout_s: float = 1.0,
                   start_at: float | None = None, tick_s: float = 0.001, index_base: int = 0,
                   phase: float = 0.0, precise: bool = True, grace_s: float = 0.0015,
                   timer: bool = True) -> tuple[Recorder, float, float]:
        """Send at ``rate_qps`` for ``duration_s`` whatever the answers do; wait for the stragglers.

        A generator that falls so far behind the rate that the step's end has passed by :data:`NOT_SENT_AFTER`
        times ``duration_s`` (at least 1 s) stops sending: the requests it did not send are counted as the error
        ``NOT_SENT`` (the load asked for was not offered). Before 2026-12-02 it sent them all, however late:
        ``--rate 1e9 --duration 0.5`` ran for an hour's worth of requests (a fresh-user trial).

        While the connection is down (nats-py reconnecting) and more than its ``pending_size`` bytes already wait
        to be written, a tick's requests are not sent but counted as the error ``DISCONNECTED``, as nats-py's own
        publish refuses them then (``OutboundBufferLimitError``; :func:`inferbus.bus.publish_raw` does not check).
        Before, they were all buffered: a node stopped under ``--rate 200000`` left the generator holding every
        request of the step's rest in memory, counted as TIMEOUT as if the node were only saturated.

        Args:
            phase: fraction of a tick to shift this process's ticks by, so that
                several generator processes do not all fire on the same instant.
            precise: wake on each tick's time (True) or sleep through it (False).
            grace_s: with ``precise=False``, lateness counted from the actual send time.
            timer: with ``precise``, wake through a timerfd (:func:`~inferbus.loadgen._timer.tick_timer`; where
                there is none, as with False) rather than sleep to 0.5 ms before the tick and spin the rest.

        Returns:
            ``(recorder, elapsed_s, cpu_s)``.
        """
        rec = self._begin(target)
        total = int(rate_qps * duration_s)
        per_tick = rate_qps * tick_s
        if start_at is not None:
            await _sleep_until(start_at)
        start = time.monotonic() + phase * tick_s
        cpu0 = time.process_time()
        grace = 0.0 if precise else grace_s
        tt = tick_timer(asyncio.get_running_loop()) if precise and timer else None
        self.pacing = "sleep" if not precise else ("timerfd" if tt is not None else "spin")

        async def noop(slot: int) -> None:
            return None

        nc = self.nc
        buffer_limit = getattr(nc, "_max_pending_size", 0) or 64 * 1024 * 1024  # nats-py's pending_size

        self._sending = True
        self._timeout_s = timeout_s
        sweeper = asyncio.create_task(self._sweep(timeout_s, noop))
        sent = 0
        k = 0
        give_up = start + duration_s + max(1.0, NOT_SENT_AFTER * duration_s)
        try:
            while sent < total:
                t_k = start + k * tick_s
                now = time.monotonic()
                if now > give_up:
                    rec.errors["NOT_SENT"] += total - sent
                    break
                if precise:
                    if tt is not None and now < t_k:
                        await tt.wait_until(t_k)
                        now = time.monotonic()
                    while now < t_k:
                        await asyncio.sleep(t_k - now if t_k - now > 0.0005 else 0)
                        now = time.monotonic()
                elif now < t_k:
                    await asyncio.sleep(t_k - now)
                due = min(total, math.floor((k + 1) * per_tick))
                if due > sent and not nc.is_connected and nc.pending_data_size > buffer_limit:
                    rec.errors["DISCONNECTED"] += due - sent  # down, its buffer full: nats-py would refuse them
                    sent = due
                while sent < due:
                    t_send = time.monotonic()
                    lag = t_send - t_k
                    rec.record_lag(lag * 1e6)
                    if 0 < lag < grace:  # counted from the send
                        await self._send(index_base + sent, t_send, 0)
                    else:
                        await self._send(index_base + sent, t_k, 0, lag * 1e6 if lag > 0 else 0.0)
                    sent += 1
                k += 1
            self._sending = False
            if self._pending:
                await self._wait_done(sweeper)
        finally:
            sweeper.cancel()
            self._sending = False
            if tt is not None:
                tt.close()
        elapsed = max(self._last, start + 1e-6) - start
        self._rec = None
        return rec, elapsed, time.process_time() - cpu0


NOT_SENT_AFTER = 1.0
"""An open-loop generator still sending this many step durations (at least 1 s) after its step's end stops."""


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
