"""The router: picks the least-loaded live worker for a model version.

It runs inside every ingress process as an in-process actor (no extra bus hop,
DESIGN §4 budget of 3 one-way hops on a miss), fed by the workers' load reports
on ``<p>._load`` and by this ingress's own forwarded/completed counts.

Choice: among live workers that loaded the model version, the lowest load score
``in_flight_local + reported_queue_depth`` wins, ties broken by the EWMA service
time (µs). With more than ``FULL_SCAN_MAX`` candidates, power-of-two choices
(Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing", 2001)
samples two and keeps the better one, which spreads load across ingress
replicas that each see stale information without herding onto one worker.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from ..schemas._internal import LoadReport

FULL_SCAN_MAX = 8
_EWMA_ALPHA = 0.2


@dataclass
class WorkerState:
    """What one ingress knows about one worker."""

    worker_id: str
    models: frozenset[str] = frozenset()
    device_kind: str = "cpu"
    device_name: str = ""
    backend: str = ""
    precision: str = ""
    pid: int = 0
    in_flight: int = 0
    """Requests this ingress forwarded and has not seen completed."""
    queue_depth: int = 0
    """Mailbox depth in the worker's last report."""
    ewma_service_us: float = 0.0
    ewma_latency_us: float = 0.0
    """Forward → completion notice, as seen by this ingress."""
    last_report: float = 0.0
    """``time.monotonic()`` of the last report (0 = never)."""
    alive: bool = True
    """False after a ``down`` event until the next report from a new process."""
    sent: int = 0
    completed: int = 0
    server_errors: int = 0

    def score(self) -> tuple[int, float]:
        return (self.in_flight + self.queue_depth, self.ewma_service_us or self.ewma_latency_us)


@dataclass
class Router:
    """Least-loaded routing over the workers this ingress has heard from.

    Args:
        health_timeout_s: a worker silent for longer is not routed to.
    """

    health_timeout_s: float = 5.0
    workers: dict[str, WorkerState] = field(default_factory=dict)
    _by_model: dict[str, list[WorkerState]] = field(default_factory=dict)
    _rng: random.Random = field(default_factory=random.Random)

    def on_report(self, r: LoadReport, now: float | None = None) -> None:
        """Update from a worker's load report; a new pid revives a worker marked down."""
        now = time.monotonic() if now is None else now
        w = self.workers.get(r.worker_id)
        if w is None:
            w = self.workers[r.worker_id] = WorkerState(r.worker_id)
        if not w.alive and r.pid == w.pid:
            return  # a late report from the process that died
        models = frozenset(r.models)
        changed = models != w.models or not w.alive
        w.models, w.device_kind, w.device_name = models, r.device_kind, r.device_name
        w.backend, w.precision, w.pid = r.backend, r.precision, r.pid
        w.queue_depth, w.ewma_service_us, w.last_report, w.alive = r.queue_depth, r.ewma_service_us, now, True
        if changed:
            self._reindex()

    def on_down(self, worker_id: str, pid: int | None = None) -> None:
        """The worker's process died: stop routing to it at once."""
        w = self.workers.get(worker_id)
        if w is not None and (pid is None or pid == w.pid or w.pid == 0):
            w.alive = False
            w.in_flight = 0
            self._reindex()

    def _reindex(self) -> None:
        by: dict[str, list[WorkerState]] = {}
        for w in self.workers.values():
            if w.alive:
                for m in w.models:
                    by.setdefault(m, []).append(w)
        self._by_model = by

    def live(self, w: WorkerState, now: float) -> bool:
        return w.alive and (now - w.last_report) <= self.health_timeout_s

    def candidates(self, model_key: str, now: float | None = None) -> list[WorkerState]:
        now = time.monotonic() if now is None else now
        return [w for w in self._by_model.get(model_key, ()) if self.live(w, now)]

    def pick(self, model_key: str, now: float | None = None, exclude: str | None = None) -> WorkerState | None:
        """The worker to send the next request for ``model_key`` (``name:version``), or None when none is live."""
        now = time.monotonic() if now is None else now
        ws = self._by_model.get(model_key)
        if not ws:
            return None
        cands = [w for w in ws if w.worker_id != exclude and self.live(w, now)]
        if not cands:
            return None
        if len(cands) <= FULL_SCAN_MAX:
            return min(cands, key=WorkerState.score)
        a, b = self._rng.sample(cands, 2)
        return a if a.score() <= b.score() else b

    def on_sent(self, w: WorkerState) -> None:
        w.in_flight += 1
        w.sent += 1

    def on_done(self, worker_id: str, latency_us: float, server_error: bool = False) -> None:
        w = self.workers.get(worker_id)
        if w is None:
            return
        if w.in_flight > 0:
            w.in_flight -= 1
        w.completed += 1
        if server_error:
            w.server_errors += 1
        w.ewma_latency_us = latency_us if w.ewma_latency_us == 0 else (
            (1 - _EWMA_ALPHA) * w.ewma_latency_us + _EWMA_ALPHA * latency_us)

    def ready_models(self, now: float | None = None) -> set[str]:
        now = time.monotonic() if now is None else now
        return {m for m, ws in self._by_model.items() if any(self.live(w, now) for w in ws)}
