"""Erlang/OTP-style supervision for asyncio (and uvloop).

A :class:`Supervisor` starts children from :class:`ChildSpec` s (each start returns once
the child is ready), watches them, and restarts them by restart type
(:class:`Restart`) and strategy (:class:`Strategy`) within a restart intensity
(:class:`SupervisorSpec`); past it, it stops every child in reverse start order and
exits with :class:`IntensityExceeded`, which a parent supervisor sees as an abnormal
child exit. Children are OS processes (:class:`ProcessChild`), asyncio tasks
(:class:`TaskChild`), nested supervisors (:meth:`Supervisor.as_child_spec`) or any
object satisfying :class:`Child`.

This package knows nothing about inference or NATS. See ``docs/supervision.md``; the
semantics are those of OTP ``supervisor.erl``.
"""

from ._errors import (
    ChildNotFound,
    ChildRunning,
    ChildStartError,
    IntensityExceeded,
    SpecError,
    SupervisorError,
    SupervisorNotRunning,
)
from ._process import ProcessChild
from ._spec import Child, ChildExit, ChildInfo, ChildSpec, Restart, Strategy, SupervisorSpec
from ._supervisor import Supervisor, SupervisorChild
from ._domain import DomainChild, backing_off, failure_domain_spec, reset_backoff
from ._task import TaskChild, TaskStatus

__all__ = [
    "Child",
    "ChildExit",
    "ChildInfo",
    "ChildNotFound",
    "ChildRunning",
    "ChildSpec",
    "ChildStartError",
    "DomainChild",
    "IntensityExceeded",
    "ProcessChild",
    "Restart",
    "SpecError",
    "Strategy",
    "Supervisor",
    "SupervisorChild",
    "SupervisorError",
    "SupervisorNotRunning",
    "SupervisorSpec",
    "TaskChild",
    "TaskStatus",
    "backing_off",
    "failure_domain_spec",
    "reset_backoff",
]
