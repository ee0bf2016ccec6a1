"""Specs and records of :mod:`inferbus.supervisor`: what to supervise and how.

The vocabulary is OTP's (``supervisor.erl``, "Supervisor Behaviour" in OTP Design
Principles): a *child spec* says how to start one child, when to restart it (*restart
type*) and how to stop it (*shutdown*); the *supervisor spec* (OTP: supervisor flags)
gives the *strategy* and the *restart intensity* (``intensity`` restarts within
``period_s`` seconds).

All dataclasses here are frozen and validated in ``__post_init__``; a bad value raises
:class:`SpecError` stating the allowed form.
"""

from __future__ import annotations

import math
import signal as _signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Protocol, runtime_checkable

from ._errors import SpecError

__all__ = [
    "Child",
    "ChildExit",
    "ChildInfo",
    "ChildSpec",
    "Restart",
    "Strategy",
    "SupervisorSpec",
    "check_shutdown_timeout",
]


class Restart(str, Enum):
    """When a child that exited is restarted (OTP ``restart()`` type).

    * ``PERMANENT``: always restarted, whatever the exit (normal included).
    * ``TRANSIENT``: restarted only after an abnormal exit (``ChildExit.normal`` false).
    * ``TEMPORARY``: never restarted, not even when a sibling's exit makes a
      ``one_for_all``/``rest_for_one`` supervisor stop it; once it has exited or been
      stopped its spec is removed from the supervisor, as OTP does.
    """

    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class Strategy(str, Enum):
    """What else is restarted when one child has to be restarted (OTP ``strategy()``).

    * ``ONE_FOR_ONE``: only that child.
    * ``ONE_FOR_ALL``: every other child is stopped in reverse start order, then all
      children are started again in start order.
    * ``REST_FOR_ONE``: the children after it in start order are stopped in reverse
      start order, then it and those children are started again in start order.
    """

    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


@dataclass(frozen=True)
class ChildExit:
    """How one incarnation of a child ended.

    Examples: ``ChildExit(True, "exit code 0", 0)``,
    ``ChildExit(False, "killed by signal 9 (SIGKILL)", -9)``,
    ``ChildExit(False, "raised ValueError('x')")``.
    """

    normal: bool
    """True for exit code 0, a task that returned, a nested supervisor that was stopped."""
    reason: str
    """Human-readable reason, e.g. ``"exit code 1"``, ``"killed by signal 9 (SIGKILL)"``."""
    exit_code: int | None = None
    """OS exit status as ``asyncio`` reports it (negative: killed by that signal);
    ``None`` for task and supervisor children."""

    @property
    def signal(self) -> str | None:
        """The name of the signal that killed the process (``"SIGKILL"``; ``None`` for an exit code, a task or
        supervisor child, or a number this platform has no signal for)."""
        if self.exit_code is None or self.exit_code >= 0:
            return None
        try:
            return _signal.Signals(-self.exit_code).name
        except ValueError:
            return None


@runtime_checkable
class Child(Protocol):
    """A running child, as returned (ready) by a ``ChildSpec.start`` function.

    Implementations here: :class:`ProcessChild`, :class:`TaskChild`,
    :class:`SupervisorChild`. Any object with these members works.
    """

    @property
    def pid(self) -> int | None:
        """OS process id, or ``None`` for a child that is not an OS process."""
        ...

    async def wait(self) -> ChildExit:
        """Return once the child has ended, normally or not; may be called many times."""
        ...

    async def stop(self, timeout_s: float | None) -> ChildExit:
        """Stop the child: graceful request, then kill after ``timeout_s`` seconds.

        ``None`` kills at once (OTP ``brutal_kill``); ``math.inf`` waits forever
        (OTP ``infinity``). Returns the exit; returns at once if already ended.
        """
        ...


def check_shutdown_timeout(value: object, what: str = "shutdown_timeout_s") -> float | None:
    """Validate a shutdown timeout: ``None`` (brutal_kill) or a number ``>= 0`` (inf ok)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or value < 0:
        raise SpecError(
            f"{what} must be None (brutal_kill), a number of seconds >= 0, or math.inf "
            f"(wait forever), got {value!r}")
    return float(value)


def _coerce_enum(enum_cls: type[Enum], value: object, what: str) -> Enum:
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls(value)
    except ValueError:
        allowed = ", ".join(f"{enum_cls.__name__}.{m.name} ({m.value!r})" for m in enum_cls)
        raise SpecError(f"{what} must be one of {allowed}, got {value!r}") from None


@dataclass(frozen=True)
class ChildSpec:
    """How to start, restart and stop one child (OTP ``child_spec()``).

    Example::

        ChildSpec("worker-0",
                  functools.partial(ProcessChild.start, [sys.executable, "-m", "worker"]),
                  restart=Restart.PERMANENT, shutdown_timeout_s=10.0)
    """

    id: str
    """Unique (within one supervisor), non-empty name of the child."""
    start: Callable[[], Awaitable[Child]]
    """Zero-argument coroutine function that starts the child and returns it once it is
    READY (like anyio's ``task_status.started()``). It runs on the supervisor's loop.
    It must be cancellation-safe: if cancelled (the supervisor is being stopped), it must
    stop whatever it had started before re-raising. Raising fails the start
    (``ChildStartError`` at ``Supervisor.start``, a counted restart attempt later)."""
    restart: Restart = Restart.PERMANENT
    """Restart type; a plain string such as ``"transient"`` is accepted and converted."""
    shutdown_timeout_s: float | None = 5.0
    """Seconds between the graceful stop request (SIGTERM / task cancellation) and the
    kill. ``None`` = OTP ``brutal_kill`` (kill at once), ``math.inf`` = OTP ``infinity``;
    otherwise ``>= 0``. Default 5.0 (OTP's default for workers is 5000 ms)."""
    exempt: Callable[[ChildExit], bool] | None = None
    """Called with each abnormal exit before its restart: True says the exit does not count against the
    supervisor's restart intensity (the child is restarted all the same). For a crash that an input caused, not the
    child: an inference worker killed by SIGFPE inside a model run is restarted, and the request is refused from
    then on, so a client sending several such requests must not make the node give up. Not in OTP, where every
    restart counts. None (default): every restart counts. An exception in it counts the exit (logged)."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise SpecError(f"ChildSpec.id must be a non-empty str, got {self.id!r}")
        if not callable(self.start):
            raise SpecError(
                f"ChildSpec {self.id!r}: start must be a zero-argument callable returning an "
                f"awaitable of a Child (e.g. functools.partial(ProcessChild.start, argv)), "
                f"got {self.start!r}")
        object.__setattr__(self, "restart",
                           _coerce_enum(Restart, self.restart, f"ChildSpec {self.id!r}: restart"))
        object.__setattr__(self, "shutdown_timeout_s", check_shutdown_timeout(
            self.shutdown_timeout_s, f"ChildSpec {self.id!r}: shutdown_timeout_s"))
        if self.exempt is not None and not callable(self.exempt):
            raise SpecError(f"ChildSpec {self.id!r}: exempt must be a callable of the ChildExit or None, "
                            f"got {self.exempt!r}")


@dataclass(frozen=True)
class SupervisorSpec:
    """Strategy and restart intensity of a supervisor (OTP ``sup_flags()``).

    If more than ``intensity`` restarts happen within any ``period_s`` seconds (a sliding
    window on ``time.monotonic()``), the supervisor stops all children in reverse start
    order and exits with :class:`IntensityExceeded` (escalation to its parent). With
    ``intensity=0`` the first restart is already one too many.
    Source: OTP ``supervisor.erl`` ``add_restart/1``.
    """

    strategy: Strategy = Strategy.ONE_FOR_ONE
    """Restart strategy; a plain string such as ``"one_for_all"`` is accepted."""
    intensity: int = 3
    """Maximum number of restarts within ``period_s``; an int ``>= 0``."""
    period_s: float = 5.0
    """Length of the sliding window in seconds; finite and ``> 0``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy",
                           _coerce_enum(Strategy, self.strategy, "SupervisorSpec.strategy"))
        if isinstance(self.intensity, bool) or not isinstance(self.intensity, int) \
                or self.intensity < 0:
            raise SpecError(
                f"SupervisorSpec.intensity must be an int >= 0 (max restarts within period_s), "
                f"got {self.intensity!r}")
        if isinstance(self.period_s, bool) or not isinstance(self.period_s, (int, float)) \
                or not math.isfinite(self.period_s) or self.period_s <= 0:
            raise SpecError(
                f"SupervisorSpec.period_s must be a finite number of seconds > 0, "
                f"got {self.period_s!r}")
        object.__setattr__(self, "period_s", float(self.period_s))


ChildStatus = Literal["not_started", "running", "restarting", "stopped"]


@dataclass(frozen=True)
class ChildInfo:
    """Snapshot of one child, as returned by ``Supervisor.which_children()``."""

    id: str
    """The child spec id."""
    pid: int | None
    """OS pid of the running incarnation; ``None`` when not running or not a process."""
    restarts: int
    """How many times this child was started again after its first start, over the whole
    life of the Supervisor object (restarts by the strategy, ``restart_child``, and starts
    after the supervisor itself was started again)."""
    status: ChildStatus
    """``"not_started"`` (never started yet: the supervisor is starting the children before it, in start
    order); ``"running"``; ``"restarting"`` (a restart is pending or in progress, including a
    failed restart waiting to be tried again); ``"stopped"`` (terminated, a transient child
    that exited normally, or the supervisor is not running)."""
    restart: Restart = field(default=Restart.PERMANENT)
    """The child's restart type."""
    last_exit: str = ""
    """Why its last incarnation exited (``ChildExit.reason``: ``killed by signal 9 (SIGKILL)``, ``exit code 0``...);
    "" while it never exited."""
