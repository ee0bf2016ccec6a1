"""The router: picks the least-loaded healthy worker for a model version.

It runs inside every ingress process as an in-process actor (no extra bus hop,
DESIGN §4 budget of 3 one-way hops on a miss), fed by the workers' load reports
on ``<p>._load`` and by this ingress's own forwarded/completed counts.

Choice: among routable workers that loaded the model version, the shortest
expected delay wins: ``(in_flight_local + reported_queue_depth + 1) × service
time of its device class``, ties broken by the load count, then the worker's
own EWMA. The class is (device kind, backend) and its service time the lowest
EWMA compute time (µs) reported by its workers, so a device twice as slow
receives about half the requests (mixed GPU / TPU / CPU deployments, issue 4)
while workers of one class share load evenly; a class not yet measured is
priced as the fastest measured one. With more than ``FULL_SCAN_MAX`` candidates, power-of-two
choices (Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing",
2001) samples two and keeps the better one, which spreads load across ingress
replicas that each see stale information without herding onto one worker.

Colocated worker (``local_worker_id``, a worker in this ingress's own process):
its hop is a function call, not two bus messages (forward and completion
notice), so its expected delay is priced ``local_hop_us`` lower than it would
be for a remote worker; on equal price it wins, also over the random
exploration among ties; with power-of-two choices it is always one of the two.
A local worker whose queue costs more than the hop loses to a less loaded remote
one, so remote workers (another process's, a GPU's) still get traffic under load.
When the local worker surely wins, :meth:`Router.pick` returns it without pricing
the others (:meth:`Router._local_wins`; same choice as the full scan).

Routable = live and healthy and its circuit breaker lets the request through:

* live: no ``down`` event for its current process, and a load report within
  ``health_timeout_s`` (default 5 s);
* healthy: the error rate in its last report is at most ``max_error_rate``
  (default 1 %) once its window holds ``min_window_requests`` requests. Client
  errors never count (the worker counts only its own failures). When every live
  worker of a model is over the error rate, they are all used anyway (the panic
  mode of Envoy's outlier detection), since refusing everything helps nobody and
  the breakers still cut off workers that fail outright;
* breaker: see :mod:`inferbus.actors._breaker` (CLOSED → OPEN after 5
  consecutive failures, OPEN 30 s, HALF_OPEN one probe).

Same NATS server (``server``): when a deployment spreads over several nats-servers joined by gateways
(``NodeConfig.spread_servers``, docs/architecture.md), a worker connected to another server than this
ingress is reached over the gateway, and so are its answer to the client (who reached this ingress
through this ingress's server) and its completion notice. Each worker reports the server it is
connected to (``LoadReport.server``); a worker on this ingress's server is priced ``server_hop_us``
lower (on top of ``local_hop_us`` for the colocated one), and only while the workers report more
than one server: a one-server deployment routes exactly as before.

A worker that is taken out of routing comes back by itself: a fresh report
(live), a window whose errors slid out (healthy), a successful probe (breaker).

Forgotten: a worker with no report for ``forget_after_s`` (:func:`forget_after_s`, ``max(60 s, 12 ×
health_timeout_s)`` by default) is dropped from the table (:meth:`Router.forget`), breaker and load with it, so
that the workers of a node that vanished without a ``down`` event (SIGKILLed whole, its host gone) do not stay
listed ``silent`` for ever. A report from it later makes it a new worker: learned as at its first report, its
breaker CLOSED.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

from ..schemas._internal import LoadReport
from ._breaker import BreakerState, CircuitBreaker

FULL_SCAN_MAX = 8
EXPLORE = 0.1
"""Share of picks made at random among workers of equal expected delay (instead of by their own EWMA)."""
_EWMA_ALPHA = 0.2

#: Outcomes of a forwarded request, as the router counts them (see _breaker).
OK, CLIENT_ERROR, SERVER_ERROR, NEUTRAL = "ok", "client_error", "server_error", "neutral"


#: A batch the worker reports computing (``LoadReport.computing_ms``) for longer than both of these, in ms and in
#: the worker's service times (``ewma_service_us``: 256 is the most requests the inference thread takes in one
#: batch), counts as that many service times queued at it, at most its mailbox's capacity (:meth:`Router.on_report`):
#: a long legal request delays what is routed behind it by about its age so far.
LONG_BATCH_MIN_MS = 20.0
LONG_BATCH_SERVICES = 256

REPORT_GAP_INTERVALS = 10
"""A report later than this many of the worker's report intervals after the one before marks a gap
(:attr:`WorkerState.gap_at`): an overloaded worker's loop still reports on time (its requests are short), a frozen
or partitioned one does not."""

GAP_BUSY_CPU_RATIO = 0.5
"""A report after a gap whose :attr:`LoadReport.cpu_ratio` is at least this (the process used half a core or more
through the gap) marks the worker behind (:attr:`WorkerState.behind_at`), not frozen: its loop was busy, not
stopped (a colocated process working off its own ingress's backlog; a second-trial finding of 2026-12-05, where an
ingress took such a gap for a freeze and opened a serving worker's breaker). A stopped (SIGSTOP) or starved process
uses next to no CPU through its gap."""

REGION_FRESH_S = 0.5
"""Report age (s) past which this region's workers lose their preference (:meth:`Router.pick`, ``region``): when
every worker of this ingress's region has been silent longer, a worker of another region that reported within it is
picked instead. Five report periods (workers report every 100 ms); the age an ingress's retry of a request held at
a worker stops going to that worker too (``_STICKY_REPORT_AGE_S``)."""


FORGET_AFTER_MIN_S = 60.0
FORGET_AFTER_TIMEOUTS = 12
"""A worker with no report for ``max(FORGET_AFTER_MIN_S, FORGET_AFTER_TIMEOUTS × health_timeout_s)`` (60 s by default)
is forgotten (:meth:`Router.forget`). Why: far past the health timeout, so that the silent-worker check failed its
requests long before, and a worker only frozen, cut off or restarting for a while (a node restarts a worker in
seconds; the worker-hang drill freezes one for 2 s) is not dropped and learned again in a loop; with the defaults,
past the health timeout plus a breaker's open period (5 + 30 s), so that forgetting an open breaker does not let a
failing worker back before its probe would have come; and a minute is the least Consul's
``deregister_critical_service_after`` takes, under Eureka's 90 s lease eviction: a replica gone that long is gone for
a service registry too. Scaled with the health timeout (12 of them) for deployments that set a long one."""


def forget_after_s(health_timeout_s: float) -> float:
    """The default report age (s) past which a worker is forgotten, for ``health_timeout_s`` (s): ``max(60 s, 12 ×
    health_timeout_s)`` (:data:`FORGET_AFTER_MIN_S`, :data:`FORGET_AFTER_TIMEOUTS`)."""
    return max(FORGET_AFTER_MIN_S, FORGET_AFTER_TIMEOUTS * health_timeout_s)


_TIE_MARGIN_US = 1e-6
"""How far under ``local_hop_us`` the local fast path of :meth:`Router.pick` keeps ``k × least`` (µs): a tie in
exact arithmetic is left to the full choice, whose floating-point sums may round it either way."""


@dataclass
class WorkerState:
    """What one ingress knows about one worker."""

    worker_id: str
    breaker: CircuitBreaker
    models: frozenset[str] = frozenset()
    device_kind: str = "cpu"
    device_name: str = ""
    backend: str = ""
    precision: str = ""
    pid: int = 0
    in_flight: int = 0
    """Requests this ingress forwarded and has not seen completed."""
    queue_depth: int = 0
    """Mailbox depth in the worker's last report, plus, while it reports a batch computing abnormally long, that
    batch's age in service times (``LONG_BATCH_SERVICES``)."""
    ewma_service_us: float = 0.0
    ewma_latency_us: float = 0.0
    """Forward → completion notice, as seen by this ingress."""
    last_report: float = 0.0
    """``time.monotonic()`` of the last report (0 = never)."""
    alive: bool = True
    """False after a ``down`` event until the next report from a new process."""
    draining: bool = False
    region: str = ""
    """Region the worker reported (the router prefers its own region's workers)."""
    server: str = ""
    """The NATS server the worker is connected to (``host:port``), from its last report."""
    error_rate: float = 0.0
    """From the last report: server-side failures / requests in the worker's sliding window."""
    window_requests: int = 0
    computing_ms: float = 0.0
    """From the last report: how long its inference thread has been computing the current batch, ms (0 idle)."""
    computing_overdue: bool = False
    """From the last report: that batch is past the latest deadline of its requests."""
    long_batch_depth: int = 0
    """The part of ``queue_depth`` that prices a batch computing abnormally long (0 otherwise)."""
    behind_at: float = float("-inf")
    """``time.monotonic()`` of the last report that showed the worker behind its own input: a backlog in its
    subscription (``LoadReport.backlog_msgs`` > 0) or requests queued (``queue_depth`` > 0; -inf: never). Not requests
    it dropped expired or shed, which it counts after the fact. A queue behind a batch computing past its deadlines
    (a hung model) marks it too: the ingress blames what goes missing while the worker reports such a batch."""
    gap_at: float = float("-inf")
    """``time.monotonic()`` of the last report that came after a gap of more than ``REPORT_GAP_INTERVALS`` report
    intervals while its process used little CPU (``GAP_BUSY_CPU_RATIO``; -inf: never): the worker was frozen or cut
    off, so a backlog it reports then is what it read while frozen, not an overload (the ingress blames what went
    missing then, as before)."""
    report_interval_s: float = 0.1
    """The worker's report interval (:attr:`LoadReport.interval_ms`), from its last report."""
    sent: int = 0
    completed: int = 0
    server_errors: int = 0

    def in_report_gap(self, now: float) -> bool:
        """Whether the worker, alive and reporting before, has sent no report for more than ``REPORT_GAP_INTERVALS``
        of its intervals (``now``: ``time.monotonic()``): until its next report says whether its process ran
        through the gap (busy) or was stopped, a request of it gone missing can be neither blamed nor excused."""
        return self.alive and self.last_report > 0 and now - self.last_report > REPORT_GAP_INTERVALS * \
            self.report_interval_s

    def score(self) -> tuple[int, float]:
        return (self.in_flight + self.queue_depth, self.ewma_service_us or self.ewma_latency_us)


@dataclass
class Router:
    """Least-loaded routing over the workers this ingress has heard from.

    Args:
        health_timeout_s: a worker silent for longer is not routed to (> 0, default 5 s).
        forget_after_s: a worker silent for longer is dropped from the table (:meth:`forget`; > ``health_timeout_s``,
            default 60 s: :func:`forget_after_s`; ``inf``: never).
        max_error_rate: a worker whose reported error rate is above this is unhealthy (0..1, default 0.01).
        min_window_requests: the error rate is judged only over at least this many requests (default 100).
        breaker_failures / breaker_open_s / breaker_probes: see :class:`CircuitBreaker`.
    """

    health_timeout_s: float = 5.0
    forget_after_s: float = FORGET_AFTER_MIN_S
    max_error_rate: float = 0.01
    min_window_requests: int = 100
    breaker_failures: int = 5
    breaker_open_s: float = 30.0
    breaker_probes: int = 1
    region: str = ""
    """This ingress's region: its workers are preferred; another region's only when none here is usable
    (no cross-region hop on the hot path, and no traffic into a region that may have just died)."""
    local_worker_id: str = ""
    """The worker hosted in this ingress's process (colocated); preferred on ties. Empty = none."""
    behind_until: float = 0.0
    """Monotonic time until which a worker is not judged by its report's age (:meth:`live`): the ingress sets it to
    ``health_timeout_s`` past each request it handles while a backlog waits in its own ``infer`` subscription. The
    load reports arrive in the same stream, behind that backlog, so their age says how far behind this ingress
    reads, not that a worker is silent (a dead process is still known at once, from the node's down event). A fresh-user trial: two colocated processes given 30,000
    requests at once read their reports seconds late and answered 3,464 of them UNAVAILABLE, "no live, healthy
    worker", with both workers serving."""
    local_hop_us: float = 250.0
    """What the bus hop to a remote worker costs beyond the local one's call (forward + completion notice;
    ~225 µs forward_hop at c=1 on the H200 host, performance.md), µs: subtracted from the local worker's
    expected delay, so it keeps work until its queue costs more than the hop."""
    server: str = ""
    """The NATS server this ingress is connected to (``host:port``; the ingress keeps it current). Empty =
    not known: no worker gets the same-server discount."""
    server_hop_us: float = 150.0
    """What reaching a worker on another nats-server costs beyond one on this ingress's server, µs: a
    gateway crossing added 100–200 µs to a request-reply round trip on the 2-core development box (2
    crossings; docs/performance.md, fourth session), and a forwarded miss crosses up to three times
    (forward, answer, completion notice). Subtracted from a same-server worker's expected delay."""
    workers: dict[str, WorkerState] = field(default_factory=dict)
    _multi_server: bool = False
    """Workers report more than one NATS server (kept on reports): only then is the same-server price applied
    (on one server it would lower every worker alike)."""
    scans: int = 0
    """Choices made by pricing every worker (:meth:`_pick_scan`), not by the local fast path: the ingress's
    ``counts.route_scans``."""
    _by_model: dict[str, list[WorkerState]] = field(default_factory=dict)
    _rng: random.Random = field(default_factory=random.Random)
    _not_closed: set[str] = field(default_factory=set)
    """Workers whose breaker is not CLOSED (kept by the breakers' ``on_state``): the local fast path of
    :meth:`pick` runs only when none of them is alive with the model, so a HALF_OPEN probe is never skipped (a
    dead worker's open breaker, which nothing will close, does not turn the fast path off)."""
    _min_service_us: dict[str, tuple[float, WorkerState | None, bool]] = field(default_factory=dict)
    """model key → ``(least, fastest, one_class)``: the least ``ewma_service_us`` > 0 among its workers (0 =
    none measured; a lower bound of any worker's price), the worker that has it (None: none measured), and
    whether all its workers are of one device class (kind, backend). Recomputed lazily; cleared when a report
    changes a worker's EWMA or class, and on every reindex."""

    def _new(self, worker_id: str) -> WorkerState:
        w = self.workers[worker_id] = WorkerState(
            worker_id, CircuitBreaker(self.breaker_failures, self.breaker_open_s, self.breaker_probes,
                                      on_state=lambda old, new: self._on_breaker(worker_id, new)))
        return w

    def _on_breaker(self, worker_id: str, new: BreakerState) -> None:
        if new is BreakerState.CLOSED:
            self._not_closed.discard(worker_id)
        else:
            self._not_closed.add(worker_id)

    def _breaker_pending(self, model_key: str) -> bool:
        """Whether a live worker of ``model_key`` has a breaker that is not CLOSED (a probe may be due)."""
        for worker_id in self._not_closed:
            w = self.workers.get(worker_id)
            if w is not None and w.alive and model_key in w.models:
                return True
        return False

    def on_report(self, r: LoadReport, now: float | None = None) -> None:
        """Update from a worker's load report; a new pid revives a worker marked down."""
        now = time.monotonic() if now is None else now
        w = self.workers.get(r.worker_id)
        if w is None:
            w = self._new(r.worker_id)
        if not w.alive and r.pid == w.pid:
            return  # a late report from the process that died
        models = frozenset(r.models)
        changed = models != w.models or not w.alive
        if w.ewma_service_us != r.ewma_service_us or w.device_kind != r.device_kind or w.backend != r.backend:
            self._min_service_us.clear()
        w.models, w.device_kind, w.device_name = models, r.device_kind, r.device_name
        w.backend, w.precision, w.pid = r.backend, r.precision, r.pid
        w.report_interval_s = max(r.interval_ms, 1) / 1000.0
        if w.last_report and now - w.last_report > REPORT_GAP_INTERVALS * w.report_interval_s:
            if r.cpu_ratio >= GAP_BUSY_CPU_RATIO:
                w.behind_at = now  # its process ran through the gap: its loop was too busy to report (an overload)
            else:
                w.gap_at = now  # reports stopped for a while: the worker was frozen (SIGSTOP) or cut off
        w.queue_depth, w.ewma_service_us, w.last_report, w.alive = r.queue_depth, r.ewma_service_us, now, True
        extra = 0
        if r.computing_ms > LONG_BATCH_MIN_MS and r.ewma_service_us > 0:
            # a batch computing far longer than the largest normal one (one legal multi-second request): what
            # waits behind it waits that long, so price the worker as if that many service times were queued
            # (else an ingress that did not send the long request sees an idle worker and ties it with one)
            behind = r.computing_ms * 1000.0 / r.ewma_service_us
            if behind > LONG_BATCH_SERVICES:
                # at most a full mailbox: the others are preferred until their own queues are as long, then it
                # takes its share again (uncapped, a burst all went to the one idle worker, whose bounded mailbox
                # shed what the busy one would have queued)
                extra = min(int(behind), r.capacity)
                w.queue_depth += extra
        w.long_batch_depth = extra
        w.draining = r.draining
        w.region = r.region
        if w.server != r.server:
            w.server = r.server
            self._multi_server = len({x.server for x in self.workers.values()}) > 1
        w.error_rate, w.window_requests = r.error_rate, r.window_requests
        w.computing_ms, w.computing_overdue = r.computing_ms, r.computing_overdue
        if r.backlog_msgs > 0 or r.queue_depth > 0:  # (an overdue batch behind a queue is told apart by the ingress)
            w.behind_at = now
        if changed:
            self._reindex()

    def on_down(self, worker_id: str, pid: int | None = None, now: float | None = None, charge: bool = True) -> None:
        """The worker's process died: stop routing to it at once; one failure for its breaker unless ``charge`` is
        False (the request it died of is known, and at fault: a query of death)."""
        w = self.workers.get(worker_id)
        if w is not None and (pid is None or pid == w.pid or w.pid == 0):
            w.alive = False
            w.in_flight = 0
            if charge:
                w.breaker.on_failure(time.monotonic() if now is None else now)
            self._reindex()

    def forget(self, now: float | None = None, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Drop the workers with no report for more than :attr:`forget_after_s` (down or silent): their state, breaker
        and load go with them, and they are no longer in :meth:`status` (health, metrics). Returns their ids (sorted).

        Kept: the colocated worker (its process is this one), the ids in ``keep`` (the caller's: workers it still
        holds requests of), and every worker while this ingress is behind its own input (:attr:`behind_until`: the
        reports' age then says how far behind it reads). A later report of a forgotten worker makes it a new worker
        (:meth:`on_report`); a completion of a request forwarded to it before (:meth:`on_done`) finds none, or the
        new one, whose in-flight count does not go below 0 and whose breaker takes it as any other verdict."""
        now = time.monotonic() if now is None else now
        if now < self.behind_until:
            return []
        limit = self.forget_after_s
        gone = sorted(wid for wid, w in self.workers.items() if now - w.last_report > limit
                      and wid != self.local_worker_id and wid not in keep)
        if gone:
            for wid in gone:
                del self.workers[wid]
                self._not_closed.discard(wid)
            self._multi_server = len({x.server for x in self.workers.values()}) > 1
            self._reindex()
        return gone

    def _reindex(self) -> None:
        by: dict[str, list[WorkerState]] = {}
        for w in self.workers.values():
            if w.alive:
                for m in w.models:
                    by.setdefault(m, []).append(w)
        self._by_model = by
        self._min_service_us.clear()

    # ---- health ---------------------------------------------------------------------------------
    def live(self, w: WorkerState, now: float) -> bool:
        """Process up and a report within ``health_timeout_s`` (any report age until :attr:`behind_until`)."""
        return w.alive and ((now - w.last_report) <= self.health_timeout_s or now < self.behind_until)

    def error_healthy(self, w: WorkerState) -> bool:
        """Reported error rate within ``max_error_rate`` (or too few requests to judge)."""
        return w.window_requests < self.min_window_requests or w.error_rate <= self.max_error_rate

    def health_reason(self, w: WorkerState, now: float) -> str:
        """``ok`` or why the worker is not routed to: ``down``, ``silent`` (no report for ``health_timeout_s``),
        ``draining``, ``quiet`` (no report for :attr:`suspect_s`: routed to only when no fresher worker of the
        model is live; not while this ingress is behind its own input, :attr:`behind_until`), ``error_rate``,
        ``breaker_open``."""
        if not w.alive:
            return "down"
        age = now - w.last_report
        if age > self.health_timeout_s:
            return "silent"
        if w.draining:
            return "draining"
        if age > self.suspect_s and now >= self.behind_until:
            return "quiet"
        if not self.error_healthy(w):
            return "error_rate"
        b = w.breaker
        if b.state_at(now) is BreakerState.OPEN:
            return "breaker_open"
        return "ok"

    # ---- choice ----------------------------------------------------------------------------------
    def candidates(self, model_key: str, now: float | None = None) -> list[WorkerState]:
        """Live, not draining workers of ``model_key`` (health and breakers not applied)."""
        now = time.monotonic() if now is None else now
        return [w for w in self._by_model.get(model_key, ()) if self.live(w, now) and not w.draining]

    def pick(self, model_key: str, now: float | None = None, exclude: str | None = None) -> WorkerState | None:
        """The worker to send the next request for ``model_key`` (``name:version``), or None.

        ``exclude`` is a worker id not to pick (the primary of a hedge). Call
        :meth:`on_sent` with the result before forwarding (breaker probe accounting).
        """
        now = time.monotonic() if now is None else now
        local = self.local_worker_id
        if local and local != exclude and (not self._not_closed or not self._breaker_pending(model_key)):
            lw = self.workers.get(local)
            if lw is not None and self._local_wins(lw, model_key, now, exclude):
                return lw
        return self._pick_scan(model_key, now, exclude)

    @property
    def suspect_s(self) -> float:
        """The report age past which a live worker is suspected (frozen, partitioned): ``max(0.5 s, 0.5 ×
        health_timeout_s)``. An ingress then sends a retry of a request it holds there, or the request itself, to
        another worker and cancels the old copy; such a worker gets a new request only when no fresher one can take
        it (:meth:`pick`). Kept above the workers' stall fence (the node sets ``stall_fence_s = 0.3 ×
        health_timeout_s``) plus one report period, so a suspected worker that thaws refuses the old copy instead
        of running it twice."""
        return max(0.5, 0.5 * self.health_timeout_s)

    def _pick_scan(self, model_key: str, now: float, exclude: str | None,
                   among: list[WorkerState] | None = None) -> WorkerState | None:
        """:meth:`pick` by pricing every routable worker (what the local fast path must agree with); counted in
        :attr:`scans`. Workers silent past :attr:`suspect_s` are priced only when no other is live (``among``:
        then those)."""
        if among is None:
            self.scans += 1
        ws = self._by_model.get(model_key) if among is None else among
        if not ws:
            return None
        # one pass over the model's workers (kept per model on reports, see _reindex): live, then healthy and
        # let through by the breaker; the same filters, in the same order, as separate passes would apply
        behind = now < self.behind_until
        timeout = math.inf if behind else self.health_timeout_s  # (live())
        suspect = math.inf if behind or among is not None else self.suspect_s
        min_window = self.min_window_requests
        max_rate = self.max_error_rate
        live = []
        cands = []
        quiet = None
        half = None
        for w in ws:
            if not w.alive or w.draining or w.worker_id == exclude:
                continue
            age = now - w.last_report
            if age > timeout:
                continue
            if age > suspect:
                # frozen or cut off for half the health timeout (a worker reports every 100 ms): a request sent
                # there waited for the thaw and was refused by the worker's stall fence (a fresh-user trial)
                quiet = [w] if quiet is None else quiet + [w]
                continue
            live.append(w)
            if (w.window_requests < min_window or w.error_rate <= max_rate) and w.breaker.allows(now):
                cands.append(w)
                if half is None and w.breaker.state is BreakerState.HALF_OPEN:
                    half = w
        if not live:
            return None if quiet is None else self._pick_scan(model_key, now, exclude, quiet)
        if not cands:
            # panic mode: every live worker is over the error rate; use them rather than refuse all
            cands = [w for w in live if w.breaker.allows(now)]
            if not cands:
                return None
            for w in cands:
                if w.breaker.state is BreakerState.HALF_OPEN:
                    half = w
                    break
        if half is not None:
            return half  # its probe goes first: else a tie-break could leave it untried (and out) for long
        if self.region:
            region = self.region
            local = [w for w in cands if w.region == region]
            if local:
                if not behind and all(now - w.last_report > REGION_FRESH_S for w in local):
                    # every worker of this region has been silent a while (frozen, cut off): one of another region
                    # that reports takes it, rather than waiting out the suspicion age at a frozen one (a fresh-user
                    # trial: the primary region's only worker SIGSTOPped, every request with a 1 s budget failed
                    # for 1.5 s while the standby region's worker idled)
                    cands = [w for w in cands if now - w.last_report <= REGION_FRESH_S] or local
                else:
                    cands = local
        n = len(cands)
        if n == 1:
            return cands[0]
        # shortest expected delay: (queued + 1) x service time of the worker's device class (kind, backend),
        # so a device twice as slow gets about half the load (issue 4). Per class, not per worker: one
        # worker's stale estimate (a slow first request after a restart) must not starve it at low load.
        speed: dict[tuple[str, str], float] = {}
        for w in cands:
            e = w.ewma_service_us
            if e > 0:
                c = (w.device_kind, w.backend)
                s = speed.get(c)
                if s is None or e < s:
                    speed[c] = e
        floor = min(speed.values()) if speed else 1.0  # a class not yet measured is priced as the fastest one
        get = speed.get
        local = self.local_worker_id
        server = self.server if self._multi_server else ""
        server_hop = self.server_hop_us
        if n <= FULL_SCAN_MAX:
            rng = self._rng
            cost = [(w.in_flight + w.queue_depth + 1) * get((w.device_kind, w.backend), floor)
                    - (server_hop if server and w.server == server else 0.0) for w in cands]
            if local:
                for i, w in enumerate(cands):
                    if w.worker_id == local:
                        cost[i] -= self.local_hop_us
                        break
            if rng.random() < EXPLORE:
                # equal expected delay: now and then ignore the worker's own EWMA (the last tie-break),
                # so a worker that looks slow (cold after a restart) still gets traffic at low load
                best = min(cost)
                tied = [w for w, c in zip(cands, cost) if c == best]
                if len(tied) > 1:
                    for w in tied:
                        if w.worker_id == local:
                            return w  # the colocated worker's hop is a call: it wins every tie
                    return rng.choice(tied)
            best_w = cands[0]
            best_k = (cost[0], best_w.worker_id != local, best_w.score())
            for i in range(1, n):
                c = cost[i]
                if c <= best_k[0]:
                    w = cands[i]
                    k = (c, w.worker_id != local, w.score())
                    if k < best_k:
                        best_w, best_k = w, k
            return best_w
        # power of two choices; the colocated worker, else one on this ingress's server, is always one of them
        lw = self.workers.get(local) if local else None
        if lw is None or not any(w is lw for w in cands):
            same = [w for w in cands if w.server == server] if server else ()
            lw = self._rng.choice(same) if same else None
        if lw is not None:
            a, b = lw, self._rng.choice([w for w in cands if w is not lw])
        else:
            a, b = self._rng.sample(cands, 2)
        is_local = a.worker_id == local
        ka = ((a.in_flight + a.queue_depth + 1) * get((a.device_kind, a.backend), floor)
              - (self.local_hop_us if is_local else 0.0) - (server_hop if server and a.server == server else 0.0),
              not is_local, a.score())
        kb = ((b.in_flight + b.queue_depth + 1) * get((b.device_kind, b.backend), floor)
              - (server_hop if server and b.server == server else 0.0), True, b.score())
        return a if ka <= kb else b

    def _local_wins(self, lw: WorkerState, model_key: str, now: float, exclude: str | None = None) -> bool:
        """Whether the full choice below would surely pick the colocated worker ``lw``, known without pricing
        every worker (the common case of a colocated ingress; with 8 workers the full pass costs about a fifth
        of a miss's instructions, ``bench.pathcost --instructions``).

        Needs ``lw`` routable for ``model_key`` (live, healthy, not draining, in this ingress's region when it
        has one, on its server when that is priced) and measured; the caller checks that no live worker of the
        model has an OPEN or HALF_OPEN breaker (a probe goes first) and that ``lw`` is not ``exclude``. With
        ``k`` requests in flight or queued at ``lw``, ``e`` its EWMA, ``h`` = ``local_hop_us`` and ``least``
        the least EWMA of the model's workers (:attr:`_min_service_us`), True when either

        * the model's workers are all of one device class, the worker with ``least`` is routable now (so
          ``least`` is the class's price in the full choice) and ``k × least < h``: ``lw`` then costs
          ``(k + 1) × least − h`` < ``least``, what an idle worker costs, and no worker costs less than an
          idle one (the full choice's own comparison; exact ties are left to it); or
        * ``(k + 1) × e − h ≤ least``: ``lw``'s price is at most its own EWMA, every other worker's at least
          ``least``, and the local worker wins ties.

        The first is the full choice's own bound when the others are idle; the second, all that can be said
        without knowing which workers are candidates, stops ``e / least − 1`` requests earlier (under an open
        load's bursts, 1–2 of a burst of 4–6 on the H200 host, each paying the full pass).
        """
        if not (lw.alive and not lw.draining and (now - lw.last_report <= self.health_timeout_s or now < self.behind_until)
                and (lw.window_requests < self.min_window_requests or lw.error_rate <= self.max_error_rate)
                and model_key in lw.models):
            return False
        e = lw.ewma_service_us
        if e <= 0 or (self.region and (lw.region != self.region or (
                now - lw.last_report > REGION_FRESH_S and now >= self.behind_until))) or (
                self._multi_server and self.server and lw.server != self.server):
            return False  # (a silent worker of this region: the full choice may prefer another region's)
        entry = self._min_service_us.get(model_key)
        if entry is None:
            entry = self._min_service_us[model_key] = self._least_price(model_key)
        least, fastest, one_class = entry
        k = lw.in_flight + lw.queue_depth
        hop = self.local_hop_us
        if (one_class and fastest is not None and k * least < hop - _TIE_MARGIN_US and fastest.alive
                and not fastest.draining and now - fastest.last_report <= self.health_timeout_s
                and (fastest.window_requests < self.min_window_requests or fastest.error_rate <= self.max_error_rate)
                and (not self.region or fastest.region == self.region) and fastest.worker_id != exclude):
            return True
        return (k + 1) * e - hop <= least

    def _least_price(self, model_key: str) -> tuple[float, WorkerState | None, bool]:
        """``(least, fastest, one_class)`` of :attr:`_min_service_us` for ``model_key``, from its live workers."""
        ws = self._by_model.get(model_key, ())
        fastest = None
        for w in ws:
            if w.ewma_service_us > 0 and (fastest is None or w.ewma_service_us < fastest.ewma_service_us):
                fastest = w
        classes = {(w.device_kind, w.backend) for w in ws}
        return (fastest.ewma_service_us if fastest is not None else 0.0), fastest, len(classes) <= 1

    def on_sent(self, w: WorkerState) -> bool:
        """Count a forwarded request; returns True when it is the breaker's HALF_OPEN probe."""
        w.in_flight += 1
        w.sent += 1
        return w.breaker.on_send()

    def on_done(self, worker_id: str, latency_us: float, server_error: bool = False, *, outcome: str | None = None,
                probe: bool = False, now: float | None = None) -> None:
        """A forwarded request finished (or was given up on).

        Args:
            latency_us: forward → completion, µs (EWMA input; ignored for non-results).
            server_error: legacy flag; same as ``outcome=SERVER_ERROR``.
            outcome: OK, CLIENT_ERROR, SERVER_ERROR or NEUTRAL (breaker verdict, see _breaker).
            probe: the request was the breaker's probe (from :meth:`on_sent`).
        """
        w = self.workers.get(worker_id)
        if w is None:
            return
        if outcome is None:
            outcome = SERVER_ERROR if server_error else OK
        if w.in_flight > 0:
            w.in_flight -= 1
        w.completed += 1
        if outcome == OK:  # the common case first: one comparison
            w.breaker.on_success(probe)
            w.ewma_latency_us = latency_us if w.ewma_latency_us == 0 else (
                (1 - _EWMA_ALPHA) * w.ewma_latency_us + _EWMA_ALPHA * latency_us)
        elif outcome == SERVER_ERROR:
            w.server_errors += 1
            w.breaker.on_failure(time.monotonic() if now is None else now, probe)
        elif outcome == NEUTRAL:
            w.breaker.on_neutral(probe)
        else:  # CLIENT_ERROR (or any other verdict): the worker works
            w.breaker.on_success(probe)

    def on_silent(self, worker_id: str, now: float | None = None) -> None:
        """The worker stopped reporting while holding requests: one failure for its breaker."""
        w = self.workers.get(worker_id)
        if w is not None:
            w.breaker.on_failure(time.monotonic() if now is None else now)

    def ready_models(self, now: float | None = None) -> set[str]:
        """Model versions with at least one live worker whose breaker is not OPEN."""
        now = time.monotonic() if now is None else now
        out = set()
        for m, ws in self._by_model.items():
            for w in ws:
                if self.live(w, now) and not w.draining and self.health_reason(w, now) != "breaker_open":
                    out.add(m)
                    break
        return out

    def status(self, now: float | None = None) -> dict[str, dict]:
        """Per worker: health verdict, breaker state, load; for health replies and stats."""
        now = time.monotonic() if now is None else now
        out = {}
        for wid, w in sorted(self.workers.items()):
            b = w.breaker
            state = b.state_at(now)  # what the next request would see
            out[wid] = {
                "health": self.health_reason(w, now), "breaker": state.value, "breaker_trips": b.trips,
                "consecutive_failures": b.consecutive_failures, "error_rate": round(w.error_rate, 5),
                "window_requests": w.window_requests, "in_flight": w.in_flight,
                "queue_depth": w.queue_depth - w.long_batch_depth, "long_batch_depth": w.long_batch_depth,
                "computing_ms": round(w.computing_ms, 1), "computing_overdue": w.computing_overdue,
                "report_age_ms": round((now - w.last_report) * 1000, 1) if w.last_report else None,
                "pid": w.pid, "sent": w.sent, "server_errors": w.server_errors, "nats_server": w.server,
            }
        return out
