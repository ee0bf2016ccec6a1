"""Named fault injectors, each with its heal (library code; drills and tests reuse them by name).

An injector acts on a *target*: the running deployment, reached through
:class:`NodeTarget` (an in-process :class:`inferbus.actors.Node`). Choose one by
name with :func:`get_fault`; an unknown name raises :class:`UnknownFault`.

| name            | inject                                              | heal                                   |
|-----------------|-----------------------------------------------------|----------------------------------------|
| kill-worker     | SIGKILL one worker process                          | wait for the supervisor's restart      |
| kill-ingress    | SIGKILL one ingress process                         | wait for the restart                   |
| kill-aggregator | SIGKILL the aggregator                              | wait for the restart                   |
| hang-worker     | SIGSTOP one worker (hung, not dead)                 | SIGCONT                                |
| slow-worker     | duty-cycle SIGSTOP/SIGCONT (worker runs ~1/4 speed) | stop cycling, SIGCONT                  |
| kill-nats       | SIGKILL the (embedded) nats-server                  | wait for the node's restart (same port)|
| kill-valkey     | SIGKILL the (embedded) Valkey                       | wait for the node's restart (same port)|
| model-swap      | make another version the default (``digits`` 1 → 2)  | make the previous default again        |

Topology faults (:mod:`chaos.topology_faults`, target :class:`chaos.topology_faults.TopologyTarget`:
a local multi-region :class:`inferbus.cluster.Topology` and one of its regions):
``kill-nats-node``, ``gateway-latency``, ``gateway-drop``, ``gateway-degrade``, ``gateway-cut``,
``isolate-region``, ``kill-region``. The actor faults above (kill/hang/slow) and ``kill-valkey``
also act on a topology target (the region's node runs the actors in its own process tree, its
supervisor restarts them; the region's Valkey is restarted by the topology's supervisor).
``kill-nats`` is for a single node (its only server); on a topology use ``kill-nats-node``.
``model-swap`` acts on a single node (:class:`NodeTarget`): the topology drills' load checks answers
against one version only, so there it raises :class:`FaultUnavailable` saying so.

Every injector is ``async inject(target, **options) -> Fault`` and returns once the fault is in
place; :meth:`Fault.heal` undoes it (or waits for the system to) and returns when healed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field


class FaultError(Exception):
    """Base of fault-injection errors."""


class UnknownFault(FaultError, KeyError):
    """No injector has that name."""


class FaultUnavailable(FaultError):
    """The injector exists but cannot act on this target (e.g. no embedded server to kill)."""


@dataclass
class NodeTarget:
    """A running in-process :class:`inferbus.actors.Node` as a fault target."""

    node: object

    def child_pid(self, prefix: str, index: int = 0) -> tuple[str, int]:
        """``(child_id, pid)`` of the ``index``-th (modulo) running child whose id starts with ``prefix``."""
        kids = [c for c in self.node.supervisor.which_children() if c.id.startswith(prefix) and c.pid]
        if not kids:
            raise FaultUnavailable(f"no running child whose id starts with {prefix!r}")
        c = sorted(kids, key=lambda c: c.id)[index % len(kids)]
        return c.id, c.pid

    async def wait_restart(self, child_id: str, old_pid: int, timeout_s: float = 60.0) -> None:
        """Wait until the node's supervisor runs ``child_id`` again under a new pid.

        Raises:
            FaultError: not restarted within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for c in self.node.supervisor.which_children():
                if c.id == child_id and c.pid and c.pid != old_pid and c.status == "running":
                    return
            await asyncio.sleep(0.01)
        raise FaultError(f"{child_id} was not restarted within {timeout_s}s")


@dataclass
class Fault:
    """One injected fault: what was done, when, and how to heal it."""

    name: str
    target_id: str
    pid: int | None
    t_inject: float
    _heal: object = None
    _task: asyncio.Task | None = field(default=None, repr=False)
    info: dict = field(default_factory=dict)
    """What the injector or its heal learnt (e.g. ``restarted_at``, ``rejoined_at``: monotonic seconds)."""

    async def heal(self) -> float:
        """Undo the fault (or wait for the system to undo it); returns monotonic time when healed."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._heal is not None:
            await self._heal()
        return time.monotonic()


def _signal(pid: int, sig: int) -> None:
    """Send ``sig`` to the process ``pid`` (gone: nothing to do).

    Raises:
        FaultError: ``pid`` is not a process id (``os.kill`` reads 0 as this process's group and -1 as every process
            it may signal: a drill would SIGSTOP or SIGKILL itself and the test run that started it)."""
    if not (isinstance(pid, int) and pid > 0):
        raise FaultError(f"no process to signal: pid {pid!r}")
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


async def _wait_restart(target, child_id: str, old_pid: int, timeout_s: float = 60.0) -> None:
    await target.wait_restart(child_id, old_pid, timeout_s)


def _kill_child(prefix: str):
    async def inject(target: NodeTarget, index: int = 0, **_) -> Fault:
        cid, pid = target.child_pid(prefix, index)
        _signal(pid, signal.SIGKILL)
        f = Fault(f"kill-{prefix.rstrip(':')}", cid, pid, time.monotonic())
        f._heal = lambda: _wait_restart(target, cid, pid)
        return f
    return inject


async def _hang_worker(target: NodeTarget, index: int = 0, **_) -> Fault:
    cid, pid = target.child_pid("worker:", index)
    _signal(pid, signal.SIGSTOP)
    f = Fault("hang-worker", cid, pid, time.monotonic())

    async def heal():
        _signal(pid, signal.SIGCONT)
    f._heal = heal
    return f


async def _slow_worker(target: NodeTarget, index: int = 0, stop_ms: float = 15.0, run_ms: float = 5.0, **_) -> Fault:
    cid, pid = target.child_pid("worker:", index)

    async def cycle():
        try:
            while True:
                _signal(pid, signal.SIGSTOP)
                await asyncio.sleep(stop_ms / 1000)
                _signal(pid, signal.SIGCONT)
                await asyncio.sleep(run_ms / 1000)
        finally:
            _signal(pid, signal.SIGCONT)

    f = Fault("slow-worker", cid, pid, time.monotonic())
    f._task = asyncio.create_task(cycle())
    return f


def _kill_server(attr: str, name: str):
    async def inject(target, **kw) -> Fault:
        from .topology_faults import TopologyTarget, kill_valkey_topology

        if isinstance(target, TopologyTarget):
            if attr == "valkey":
                return await kill_valkey_topology(target, **kw)
            raise FaultUnavailable(f"{name}: kills a single node's only server; on a topology use kill-nats-node")
        srv = getattr(getattr(target, "node", None), attr, None)
        if srv is None or (srv.proc is None and srv.child is None):
            raise FaultUnavailable(f"{name}: the deployment has no embedded server to kill (it uses a URL)")
        pid = srv.pid
        await asyncio.to_thread(srv.kill)
        f = Fault(name, attr, pid, time.monotonic())

        async def heal():
            if srv.child is not None:  # the node supervises it: its supervisor restarts it
                return await srv.wait_restarted(pid)
            srv.spawn()  # on the loop's thread (PDEATHSIG follows the spawning thread)
            await asyncio.to_thread(srv.wait_ready)
        f._heal = heal
        return f
    return inject


async def _model_swap(target, model: str = "digits", to_version: str | None = None, timeout_s: float = 30.0,
                      **_) -> Fault:
    """Swap the default version of ``model`` under load (model-management ``default``); heal swaps it back.

    ``to_version``: the version to make the default (default: the highest other served version).
    ``Fault.info``: ``from_version``, ``to_version``, ``swap_ms`` / ``heal_ms`` (each write's own answer
    time at the ingress), ``revision``. Raises :class:`FaultUnavailable` on a topology target or when the
    model serves one version only.
    """
    if not isinstance(target, NodeTarget):
        raise FaultUnavailable("model-swap: acts on a single node (NodeTarget); the topology drills check "
                               "answers against one model version only")
    from inferbus.client import Client
    from inferbus.model_admin import model_control

    node = target.node
    client = Client(node.nc, node.config.prefix)
    served = (await client.model(model, timeout_s=5.0)).versions
    state = await model_control(client, "load", model, served[0], timeout_s=timeout_s)  # served: a no-op read
    old = state.default_version
    new = to_version or next((v for v in sorted(served, key=lambda v: (len(v), v), reverse=True) if v != old), None)
    if new is None or new == old:
        raise FaultUnavailable(f"model-swap: model {model!r} serves one version only ({', '.join(served)})")
    t0 = time.monotonic()
    r = await model_control(client, "default", model, new, timeout_s=timeout_s)
    f = Fault("model-swap", f"{model}:{old}->{new}", None, t0,
              info={"from_version": old, "to_version": new, "swap_ms": r.elapsed_ms, "revision": r.revision})

    async def heal():
        back = await model_control(client, "default", model, old, timeout_s=timeout_s)
        f.info["heal_ms"] = back.elapsed_ms
        f.info["healed_at"] = time.monotonic()
    f._heal = heal
    return f


def _topology_fault(name: str):
    async def inject(target, **options) -> Fault:
        from .topology_faults import TOPOLOGY_FAULTS

        return await TOPOLOGY_FAULTS[name](target, **options)
    inject.__name__ = name.replace("-", "_")
    return inject


FAULTS = {
    "kill-worker": _kill_child("worker:"),
    "kill-ingress": _kill_child("ingress:"),
    "kill-aggregator": _kill_child("aggregator"),
    "hang-worker": _hang_worker,
    "slow-worker": _slow_worker,
    "kill-nats": _kill_server("nats", "kill-nats"),
    "kill-valkey": _kill_server("valkey", "kill-valkey"),
    "model-swap": _model_swap,
    **{n: _topology_fault(n) for n in ("kill-nats-node", "gateway-latency", "gateway-drop", "gateway-degrade",
                                       "gateway-cut", "isolate-region", "kill-region")},
}
"""Every injector by name (node and topology faults)."""


def get_fault(name: str):
    """The injector called ``name``: ``async inject(target, **options) -> Fault``.

    Raises:
        UnknownFault: no such injector (the message lists the known names).
    """
    try:
        return FAULTS[name]
    except KeyError:
        raise UnknownFault(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}") from None
