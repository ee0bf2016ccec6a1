"""Children that die with their parent: Linux ``prctl(PR_SET_PDEATHSIG)``.

A child started with :func:`die_with_parent` as its ``preexec_fn`` gets ``sig`` (SIGKILL by
default) from the kernel when its parent goes away, even by SIGKILL, so no worker, ingress,
nats-server or valkey-server is left running (re-parented to init and still answering in the
queue groups) after ``inferbus up`` is killed.

Why SIGKILL and not SIGTERM: the death signal is the last resort, sent only when the parent
died without stopping its children itself (SIGKILL, the OOM killer, a crash); a parent that
stops in order (``inferbus up`` on SIGTERM or SIGINT) still stops each child with SIGTERM and
its shutdown timeout first. A SIGTERM death signal left a child that was stopped at that
moment (SIGSTOP, a debugger) stopped for ever, re-parented to init, holding its port and its
NATS subscriptions (the server kept routing requests to it until its pings timed out), and,
once continued, exiting only then, after its drain (a
fresh-user trial). SIGKILL is the one signal a stopped process cannot hold off: the kernel
ends it at once. What SIGTERM would have bought instead, a drain, reaches nobody on a node
whose embedded nats-server dies at the same instant, and on a shared nats-server the requests
the dead node's workers held end as for any killed worker (their clients' attempts time out
or are retried elsewhere).

The kernel sends the signal when the *thread* that forked the child exits, not the process:
spawn from a thread that lives as long as the parent (the event loop's thread; never a
``to_thread`` / executor thread). Off Linux, or where libc has no ``prctl``, this is a no-op
(:func:`die_with_parent` returns ``None``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["die_with_parent", "die_with_parent_on"]

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when this process dies.

    Call it in the parent, on the thread that spawns (it records this process's pid). In the
    child, between fork and exec, the function sets ``PR_SET_PDEATHSIG`` (one ctypes call, no
    allocation on the Python heap beyond the call itself) and then checks ``getppid()``: a
    parent that died before the call (the fork race) makes the child exit at once with status
    1 instead of running as an orphan.

    Args:
        sig: the signal number the child gets (default SIGKILL, which also ends a stopped child;
            see the module's docstring).

    Returns:
        The function for ``subprocess.Popen(preexec_fn=...)`` / ``loop.subprocess_exec``, or
        ``None`` off Linux (pass it on as is: ``preexec_fn=None`` is the default).
    """
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()
    signum = int(sig)
    getppid, exit_now = os.getppid, os._exit

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if getppid() != parent:  # the parent died between fork and prctl: nobody would signal us
            exit_now(1)

    return preexec


def die_with_parent_on(cpus: tuple[int, ...] | None, sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """:func:`die_with_parent`'s ``preexec_fn``, run after setting the child's CPU affinity to ``cpus`` (in the
    child, before exec: the program starts on those cores, and so does every thread it makes; a Go program such
    as nats-server sizes ``GOMAXPROCS`` from it). ``cpus`` None or empty: :func:`die_with_parent` itself.

    Raises (in the child, which the spawn then reports as failed): OSError for a core this host does not have."""
    pdeathsig = die_with_parent(sig)
    if not cpus:
        return pdeathsig
    cores = tuple(cpus)
    setaffinity = os.sched_setaffinity

    def preexec() -> None:
        setaffinity(0, cores)
        if pdeathsig is not None:
            pdeathsig()

    return preexec
