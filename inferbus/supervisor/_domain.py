"""A nested supervisor as a failure domain: its escalations are restarted after a back-off, outside the parent's
restart intensity.

OTP counts a nested supervisor's escalation against its parent's intensity like any other exit, so siblings that
share a parent share its budget: in ``inferbus cluster up`` every region's and the witness's supervisors were
children of one ``cluster`` supervisor, and a crash loop in one region (its node killed twice a second) made that
supervisor give up and stop every region, the healthy primary included (a fresh-user trial, 2026-12-06). Regions
are failure domains of their own: on separate hosts, each is restarted by its own service manager, which backs off
a unit that keeps failing (systemd's ``RestartSec``, Kubernetes' CrashLoopBackOff: 10 s doubling to 5 minutes).
:func:`failure_domain_spec` gives a nested supervisor that treatment under a shared parent: an escalation (or a
failed start) does not count against the parent's intensity, and the next start waits ``backoff_s`` doubling up to
``max_backoff_s``, back to ``backoff_s`` once an incarnation has run ``reset_after_s``. The wait happens inside the
child (:class:`DomainChild`), not in the parent's restart, so the parent handles its other children and its stop
meanwhile.
"""

from __future__ import annotations

import asyncio
import math
import time

from ._spec import ChildExit, ChildSpec, Restart
from ._supervisor import Supervisor, SupervisorChild

__all__ = ["DomainChild", "backing_off", "failure_domain_spec", "reset_backoff"]


class _Backoff:
    """The delay before a failure domain's next start (s): 0 for the first start and after a long run."""

    def __init__(self, backoff_s: float, max_backoff_s: float, reset_after_s: float) -> None:
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.reset_after_s = reset_after_s
        self.failures = 0
        self.started_at: float | None = None

    def failed(self, now: float) -> None:
        if self.started_at is not None and now - self.started_at >= self.reset_after_s:
            self.failures = 0  # it ran long enough: a new failure starts the back-off over
        self.started_at = None  # (a failed start after it does not reset it again)
        self.failures += 1

    def delay_s(self) -> float:
        if not self.failures:
            return 0.0
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** (self.failures - 1))


class DomainChild:
    """A nested supervisor started after a delay (:func:`failure_domain_spec`); ``pid`` is None.

    While it waits, it is a running child holding nothing; it then starts the supervisor (all its children ready)
    and runs it. Exits: stopped (also while waiting) → ``ChildExit(True, "stopped")``; escalated → ``ChildExit(False,
    "escalated: ...")``; a failed start after the wait → ``ChildExit(False, "start failed: ...")``.
    """

    def __init__(self, supervisor: Supervisor, backoff: _Backoff, delay_s: float,
                 inner: SupervisorChild | None = None) -> None:
        """Private: use :func:`failure_domain_spec`."""
        self.supervisor = supervisor
        self.delay_s = delay_s
        """Seconds this incarnation waited (waits) before starting the supervisor."""
        self._backoff = backoff
        self._inner = inner
        self._stopped = False
        self._task = asyncio.get_running_loop().create_task(self._watch() if inner is not None else self._run(),
                                                            name=f"domain {supervisor.name}")

    @classmethod
    async def start(cls, supervisor: Supervisor, backoff: _Backoff) -> DomainChild:
        """Start at once when no back-off is due (the first start: a failure is the parent's ``ChildStartError``),
        else return a child that starts ``supervisor`` after the delay.

        Raises:
            ChildStartError: (no delay due) one of its children failed to start (it stopped the others).
        """
        delay_s = backoff.delay_s()
        if delay_s:
            return cls(supervisor, backoff, delay_s)
        inner = await SupervisorChild.start(supervisor)
        backoff.started_at = time.monotonic()
        return cls(supervisor, backoff, 0.0, inner)

    async def _run(self) -> ChildExit:
        await asyncio.sleep(self.delay_s)
        try:
            self._inner = await SupervisorChild.start(self.supervisor)
        except Exception as exc:  # ChildStartError: the supervisor stopped what it had started
            return ChildExit(False, f"start failed: {exc}")
        self._backoff.started_at = time.monotonic()
        return await self._watch()

    async def _watch(self) -> ChildExit:
        assert self._inner is not None
        return await self._inner.wait()

    @property
    def waiting(self) -> bool:
        """Whether it is still waiting out its back-off (its supervisor not started yet)."""
        return self._inner is None and not self._task.done()

    @property
    def pid(self) -> None:
        """Always ``None``: the nested supervisor runs in this process."""
        return None

    async def wait(self) -> ChildExit:
        """Return once the domain has ended (its supervisor stopped or escalated, or its delayed start failed)."""
        await asyncio.wait((self._task,))
        return self._exit()

    async def stop(self, timeout_s: float | None) -> ChildExit:
        """Stop the nested supervisor, or its start while it waits (nothing runs then)."""
        self._stopped = True
        if self._inner is None and not self._task.done():
            self._task.cancel()  # waiting, or starting: SupervisorChild.start stops what it started when cancelled
            await asyncio.wait((self._task,))
        if self._inner is not None:
            await self._inner.stop(timeout_s)
        await asyncio.wait((self._task,))
        return self._exit()

    def _exit(self) -> ChildExit:
        if self._task.cancelled():
            return ChildExit(True, "stopped") if self._stopped else ChildExit(False, "cancelled")
        exc = self._task.exception()
        if exc is not None:
            return ChildExit(False, f"raised {exc!r}")
        return self._task.result()

    def __repr__(self) -> str:
        return f"<DomainChild {self.supervisor.name!r} {self.supervisor.state}>"


def failure_domain_spec(supervisor: Supervisor, id: str | None = None, *, backoff_s: float = 1.0,
                        max_backoff_s: float = 30.0, reset_after_s: float = 60.0) -> ChildSpec:
    """A ChildSpec that runs ``supervisor`` as a failure domain of its parent (module docstring): permanent, its
    escalations and failed starts restarted without counting against the parent's intensity (:attr:`ChildSpec.exempt`)
    after ``backoff_s`` seconds, doubling per failure up to ``max_backoff_s``, back to ``backoff_s`` once an
    incarnation ran ``reset_after_s`` seconds. Not in OTP, where a nested supervisor's escalation counts in its parent (use
    :meth:`Supervisor.as_child_spec` for that).

    Raises:
        ValueError: ``backoff_s`` or ``reset_after_s`` not a finite number > 0, or ``max_backoff_s`` below
            ``backoff_s``.
    """
    for name, v in (("backoff_s", backoff_s), ("reset_after_s", reset_after_s), ("max_backoff_s", max_backoff_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"failure_domain_spec: {name} must be a finite number of seconds > 0, got {v!r}")
    if max_backoff_s < backoff_s:
        raise ValueError(f"failure_domain_spec: max_backoff_s ({max_backoff_s}) is below backoff_s ({backoff_s})")
    backoff = _Backoff(float(backoff_s), float(max_backoff_s), float(reset_after_s))

    def exempt(exit_: ChildExit) -> bool:
        backoff.failed(time.monotonic())
        return True

    return ChildSpec(id if id is not None else supervisor.name, _DomainStart(supervisor, backoff),
                     restart=Restart.PERMANENT, shutdown_timeout_s=math.inf, exempt=exempt)


class _DomainStart:
    """The start function of a :func:`failure_domain_spec` (it keeps the domain's back-off)."""

    def __init__(self, supervisor: Supervisor, backoff: _Backoff) -> None:
        self.supervisor = supervisor
        self.backoff = backoff
        self.current: DomainChild | None = None  # the last incarnation started

    async def __call__(self) -> DomainChild:
        self.current = await DomainChild.start(self.supervisor, self.backoff)
        return self.current


def backing_off(spec: ChildSpec) -> bool:
    """Whether a :func:`failure_domain_spec`'s domain is waiting out a back-off now (False for another spec)."""
    return isinstance(spec.start, _DomainStart) and spec.start.current is not None and spec.start.current.waiting


def reset_backoff(spec: ChildSpec) -> None:
    """Forget the failures of a :func:`failure_domain_spec`'s domain: its next start is at once (an operator's
    deliberate restart, e.g. ``inferbus cluster restore``). Nothing for another spec."""
    if isinstance(spec.start, _DomainStart):
        spec.start.backoff.failures = 0
        spec.start.backoff.started_at = None
