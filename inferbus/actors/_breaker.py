"""A circuit breaker per worker, kept by each router (Nygard, *Release It!*, 2nd ed. 2018, ch. 5).

States and transitions::

    CLOSED ──(failure_threshold consecutive failures)──▶ OPEN
    OPEN ──(open_s elapsed; checked lazily when the router asks)──▶ HALF_OPEN
    HALF_OPEN: lets ``half_open_probes`` requests through (the probes)
        probe succeeds ──▶ CLOSED          probe fails ──▶ OPEN (timer restarts)

What the router reports (``inferbus.actors._ingress``):

* failure: the worker answered INTERNAL; the worker's process died holding the
  request; the worker stopped reporting while holding it; no completion arrived
  within the request's deadline plus a grace period (a lost request);
* success: any completion the worker produced, including client errors
  (INVALID_ARGUMENT, NOT_FOUND, PAYLOAD_TOO_LARGE): they prove the worker works
  and never count against it;
* neutral: DEADLINE_EXCEEDED (the caller's budget ran out), RESOURCE_EXHAUSTED
  (shed by a full mailbox: overload is handled by least-loaded routing, not by
  the breaker), CANCELLED (a hedge loser). A neutral outcome of a probe frees the
  probe slot and the breaker stays HALF_OPEN.

A success while OPEN (a late completion of a request sent before the breaker
opened) does not close it; only a probe's verdict does, or any success once
HALF_OPEN.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum


class BreakerState(str, Enum):
    """State of one :class:`CircuitBreaker`; the value is what health and stats show."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:
        return self.value


class CircuitBreaker:
    """One worker's breaker. Not thread-safe: used from one event loop.

    Args:
        failure_threshold: consecutive failures that open a CLOSED breaker (>= 1; default 5).
        open_s: seconds an OPEN breaker refuses work before HALF_OPEN (> 0; default 30).
        half_open_probes: requests let through at once while HALF_OPEN (>= 1; default 1).
        on_state: called as ``on_state(old, new)`` on every change of state (the router counts breakers
            that are not CLOSED with it); None for none.

    Raises:
        ValueError: a parameter out of range.
    """

    __slots__ = ("failure_threshold", "open_s", "half_open_probes", "state", "consecutive_failures",
                 "opened_at", "probes_in_flight", "trips", "on_state")

    def __init__(self, failure_threshold: int = 5, open_s: float = 30.0, half_open_probes: int = 1,
                 on_state: Callable[[BreakerState, BreakerState], None] | None = None) -> None:
        if failure_threshold < 1:
            raise ValueError("CircuitBreaker.failure_threshold must be >= 1")
        if not open_s > 0:
            raise ValueError("CircuitBreaker.open_s must be > 0 seconds")
        if half_open_probes < 1:
            raise ValueError("CircuitBreaker.half_open_probes must be >= 1")
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self.half_open_probes = half_open_probes
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.opened_at = 0.0
        """``time.monotonic()`` when the breaker last opened."""
        self.probes_in_flight = 0
        self.trips = 0
        """Times the breaker opened since start."""
        self.on_state = on_state

    def _set(self, new: BreakerState) -> None:
        old, self.state = self.state, new
        if old is not new and self.on_state is not None:
            self.on_state(old, new)

    def allows(self, now: float) -> bool:
        """Whether a request may be sent now; an OPEN breaker past ``open_s`` becomes HALF_OPEN here."""
        st = self.state
        if st is BreakerState.CLOSED:
            return True
        if st is BreakerState.OPEN:
            if now - self.opened_at < self.open_s:
                return False
            self._set(BreakerState.HALF_OPEN)
            self.probes_in_flight = 0
        return self.probes_in_flight < self.half_open_probes

    def state_at(self, now: float) -> BreakerState:
        """The state the next request would see at ``now``: HALF_OPEN for an OPEN breaker whose ``open_s`` is over
        (:meth:`allows` makes that change only when a request asks), else :attr:`state`. For health and stats."""
        if self.state is BreakerState.OPEN and now - self.opened_at >= self.open_s:
            return BreakerState.HALF_OPEN
        return self.state

    def on_send(self) -> bool:
        """Record a request sent; returns True when it is a HALF_OPEN probe (pass that to the verdict)."""
        if self.state is BreakerState.HALF_OPEN:
            self.probes_in_flight += 1
            return True
        return False

    def _release(self, probe: bool) -> None:
        if probe and self.probes_in_flight > 0:
            self.probes_in_flight -= 1

    def on_success(self, probe: bool = False) -> None:
        """A completion that proves the worker works (a result, or a client error)."""
        self._release(probe)
        self.consecutive_failures = 0
        if self.state is BreakerState.HALF_OPEN:
            self._set(BreakerState.CLOSED)
            self.probes_in_flight = 0

    def on_failure(self, now: float, probe: bool = False) -> None:
        """A server-side failure; may open the breaker."""
        self._release(probe)
        self.consecutive_failures += 1
        if self.state is BreakerState.HALF_OPEN or (
                self.state is BreakerState.CLOSED and self.consecutive_failures >= self.failure_threshold):
            self._open(now)
        elif self.state is BreakerState.OPEN:
            pass  # late failures of requests sent before opening: the timer is not restarted

    def on_neutral(self, probe: bool = False) -> None:
        """An outcome that says nothing about the worker (deadline, shed, cancelled)."""
        self._release(probe)

    def _open(self, now: float) -> None:
        self._set(BreakerState.OPEN)
        self.opened_at = now
        self.probes_in_flight = 0
        self.trips += 1

    def __repr__(self) -> str:
        return (f"CircuitBreaker({self.state.value}, failures={self.consecutive_failures}/"
                f"{self.failure_threshold}, open_s={self.open_s})")
