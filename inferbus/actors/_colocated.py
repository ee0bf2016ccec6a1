"""A colocated process: one ingress and one worker in the same OS process, event loop and NATS connection.

Why (docs/architecture.md, "Colocated workers"): on a miss the ingress → worker
forward and the worker → ingress completion notice are two of the four messages
a request costs through nats-server, and the forward wakes a second event loop.
When the router picks the worker in its own process, the ingress hands it the
request as it already holds it (:meth:`~inferbus.actors._worker.Worker.submit_local`:
the decoded, validated tensors and the forward's fields as values; no forward
publish, no header block, no second decode), and the worker settles the
completion at the ingress by a call (no completion notice); the reply still goes
from the worker to the client's reply subject over NATS. A miss served locally is
2 messages through the bus, like the echo.

Both actors are the unchanged :class:`~inferbus.actors._ingress.Ingress` and
:class:`~inferbus.actors._worker.Worker`: the worker keeps its own subject
(other ingresses forward to it), its load reports, dedupe, hedge cancellation,
audit, deadline checks and stall fence.

Start-up: the worker subscribes first, then the ingress; ``READY`` is printed
once both are subscribed, so the node supervisor's "started" still means
"reachable". Failure: if either actor's task ends (an exception), the other is
stopped and the process exits with status 1, so the node supervisor sees one
crash, publishes the worker's ``down`` event (every other ingress fails the
requests it had forwarded here with UNAVAILABLE) and restarts both.
"""

from __future__ import annotations

import asyncio
import sys

from ..bus import close_connection
from ._common import announce_ready, connect_logged, log, run_actor, serving_gc, set_affinity
from ._config import ColocatedConfig
from ._ingress import Ingress
from ._worker import STOP_CLOSE_DRAIN_S, Worker


class Colocated:
    """An ingress and its local worker; ``run()`` serves until cancelled (SIGTERM) or either actor fails."""

    def __init__(self, config: ColocatedConfig) -> None:
        self.config = config
        self.worker = Worker(config.worker)
        self.ingress = Ingress(config.ingress)
        self.ingress.attach_local_worker(self.worker)
        self.failed: BaseException | None = None

    async def run(self) -> None:
        """Connect once, start the worker then the ingress on that connection, print ``READY``, serve.

        Raises:
            RuntimeError: an actor stopped (its exception chained); the process should exit abnormally.
        """
        set_affinity(self.config.ingress.cpu_affinity or self.config.worker.cpu_affinity)
        nc = await connect_logged(self.config.ingress.bus, f"colocated-{self.config.ingress.ingress_id}")
        tasks: list[asyncio.Task] = []
        try:
            for actor in (self.worker, self.ingress):  # worker first: the ingress may route to it at once
                up = asyncio.Event()
                task = asyncio.create_task(actor.run(nc=nc, ready=up.set))
                tasks.append(task)
                waiter = asyncio.create_task(up.wait())
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if task.done():
                    raise RuntimeError(f"{type(actor).__name__} did not start") from task.exception()
            serving_gc()
            announce_ready()
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            failed = next(iter(done))
            exc = failed.exception() if not failed.cancelled() else None
            raise RuntimeError(f"colocated {self.config.ingress.ingress_id}: an actor stopped: {exc!r}") from exc
        finally:
            for task in reversed(tasks):  # ingress first: stop taking requests, then the worker
                task.cancel()
                try:
                    await task
                except BaseException:
                    pass
            # a second SIGTERM cuts the drain short (nothing left unretrieved), the close still follows
            await close_connection(nc, drain=True, drain_timeout_s=STOP_CLOSE_DRAIN_S)


def main(config_json: str) -> None:
    """Process entry: ``python -m inferbus.actors colocated '<ColocatedConfig JSON>'``; exits 1 if an actor fails."""
    cfg = ColocatedConfig.from_json(config_json)
    actor = Colocated(cfg)
    try:
        run_actor(actor.run)
    except RuntimeError as exc:
        log(str(exc))
        sys.exit(1)
