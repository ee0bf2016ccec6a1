"""Errors raised by :mod:`inferbus.supervisor`.

Every error the package raises on purpose derives from one base class::

    SupervisorError
    ├── SpecError            (also ValueError)   a ChildSpec / SupervisorSpec / argument is invalid;
    │                                            raised before anything starts
    ├── ChildStartError                          a child's start function failed, raised, or the
    │                                            child did not become ready (start_timeout_s, exited
    │                                            before READY); the cause is chained in __cause__
    ├── IntensityExceeded                        more than `intensity` restarts within `period_s`;
    │                                            all children were stopped, the supervisor exits
    │                                            (OTP: reached_max_restart_intensity → shutdown)
    ├── ChildNotFound        (also LookupError)  no child spec with that id (or a temporary child
    │                                            that has already been removed, as in OTP)
    ├── ChildRunning                             restart_child() on a child that is running or
    │                                            restarting (OTP: {error, running | restarting})
    └── SupervisorNotRunning                     an operation needs a started supervisor, or the
                                                 supervisor stopped while a call was waiting

Cancellation (``asyncio.CancelledError``) is never translated or swallowed: it is a
``BaseException`` and passes through every ``except Exception`` in this package.
"""

from __future__ import annotations

__all__ = [
    "ChildNotFound",
    "ChildRunning",
    "ChildStartError",
    "IntensityExceeded",
    "SpecError",
    "SupervisorError",
    "SupervisorNotRunning",
]


class SupervisorError(Exception):
    """Base class of every error raised on purpose by :mod:`inferbus.supervisor`."""


class SpecError(SupervisorError, ValueError):
    """A child spec, supervisor spec or argument is invalid.

    The message states the allowed form. Raised by ``__post_init__`` of the spec
    dataclasses and by :class:`~inferbus.supervisor.Supervisor` before any child starts
    (OTP validates all flags and child specs before anything starts, too).
    """


class ChildStartError(SupervisorError):
    """A child could not be started or did not become ready.

    Attributes:
        child_id: id of the child spec (``None`` when raised by ``ProcessChild.start`` or
            ``TaskChild.start`` outside a supervisor; the supervisor re-raises with the id).
        output: the last lines the child printed (stdout and stderr interleaved), oldest
            first; empty for task children.

    The underlying exception, if any, is chained in ``__cause__``.
    """

    def __init__(self, message: str, *, child_id: str | None = None,
                 output: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.child_id = child_id
        self.output = output


class IntensityExceeded(SupervisorError):
    """More than ``intensity`` restarts happened within ``period_s`` seconds.

    When this is raised (by :meth:`Supervisor.run`), every child has already been
    stopped in reverse start order. A supervisor nested in another one exits abnormally
    with this reason, so its parent applies its own restart strategy (escalation).

    Attributes:
        supervisor: name of the supervisor that gave up.
        intensity: the configured maximum number of restarts.
        period_s: the configured sliding window, in seconds.
        child_id: id of the child whose exit triggered the restart that was one too many.
        reason: that child's exit reason (``ChildExit.reason``).

    Source: OTP ``supervisor.erl`` ``add_restart/1`` and ``restart/2``
    (``reached_max_restart_intensity``).
    """

    def __init__(self, supervisor: str, *, intensity: int, period_s: float,
                 child_id: str, reason: str) -> None:
        # a failed start's reason names the supervisor and the child again, over several lines (its output): said
        # once, on one line (a fresh-user trial read "supervisor 'node-n1': ... child 'worker:n1-w1' (supervisor
        # 'node-n1': child 'worker:n1-w1' failed to start: ...")
        said = f"supervisor {supervisor!r}: child {child_id!r} "
        last = (f"{reason[len(said):]}" if reason.startswith(said) else f"({reason})")
        super().__init__(
            f"supervisor {supervisor!r}: more than {intensity} restart(s) within "
            f"{period_s:g} s; last: child {child_id!r} {' '.join(last.split())}; all children stopped")
        self.supervisor = supervisor
        self.intensity = intensity
        self.period_s = period_s
        self.child_id = child_id
        self.reason = reason


class ChildNotFound(SupervisorError, LookupError):
    """No child with that id is known to the supervisor."""


class ChildRunning(SupervisorError):
    """``restart_child`` was called for a child that is running or being restarted."""


class SupervisorNotRunning(SupervisorError):
    """The supervisor is not started, or it stopped while the call was waiting."""
