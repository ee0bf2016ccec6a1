"""The drill load driver: open-loop load where every request has a unique id and a known answer.

Requests are sent on a fixed schedule (``rate_qps``) regardless of answers, so a
fault shows up as latency and failures rather than as a quietly lower offered
load. Each request carries a fresh ``Inferbus-Request-Id`` and an input whose
correct output was computed in-process beforehand, so the outcome of every
single request is known exactly:

* ``ok``: answered correctly within its budget (with ``references_by_version``: the correct answer of
  the model version stamped in the reply, ``model_version``, so a default-version swap under load is
  checked answer by answer);
* ``wrong``: answered, but not the reference answer (never acceptable);
* ``failed``: a typed error or no answer within the budget;
* ``duplicates``: request ids the workers *executed* more than once, counted from
  the workers' execution audit on ``<p>._audit`` when the deployment publishes it
  (``audit_subject``), else ``None`` (unknown, never guessed). Each audit batch names its worker
  (``Inferbus-Worker-Id``), so a duplicate shows where it ran: on two workers (the retry trade of
  docs/failure-semantics.md) or twice on one (a dedupe failure).

Latency is measured from the scheduled send time (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np
from hdrh.histogram import HdrHistogram

from inferbus.schemas import InferbusError


async def sleep_until(t: float) -> None:
    """Return once ``time.monotonic()`` has reached ``t``, never before: a loop's timer may fire a little early
    (uvloop's clock is read once per iteration, in whole milliseconds)."""
    while (left := t - time.monotonic()) > 0:
        await asyncio.sleep(left)


@dataclass
class RequestRecord:
    """One request's fate. Times in monotonic seconds; ``outcome`` is ``ok``, ``wrong`` or an error code."""

    request_id: str
    t_sched: float
    t_done: float
    outcome: str
    worker_id: str | None = None
    term: int | None = None
    model_version: str | None = None


@dataclass
class DrillFigures:
    """What a drill prints (``--json``)."""

    drill: str
    requests: int
    ok: int
    failed: int
    wrong: int
    duplicates: int | None
    availability: float
    """ok / requests (answered correctly within the deadline)."""
    p50_ms: float
    p99_ms: float
    p99_ms_during_fault: float | None
    detection_ms: float | None = None
    recovery_ms: float | None = None
    failover_ms: float | None = None
    """Region drills: from the fault until the standby, promoted, answers under its new term."""
    errors: dict = field(default_factory=dict)
    """Failed requests by error code (``DEADLINE_EXCEEDED``, ``UNAVAILABLE``, ...)."""
    extra: dict = field(default_factory=dict)
    """Drill-specific figures, plus from the driver: ``executions_audited``, ``max_ms`` (the slowest
    request), ``timeout_ms`` (the budget) and, when any, ``duplicates_sent_at_s`` / ``failed_sent_at_s``
    (when the first 20 duplicated / 50 failed requests were scheduled, seconds after the first request),
    ``duplicates_detail`` (the first 20 duplicated requests: sent at, the workers that ran each copy, the worker
    that answered, the outcome, ms to the answer) and ``duplicates_on_one_worker`` (requests one worker ran more
    than once: never expected, its recent results answer a copy)."""

    def to_dict(self) -> dict:
        return asdict(self)


class Driver:
    """Open-loop load against one model with per-request bookkeeping.

    Args:
        client: an :class:`inferbus.client.Client` (its retries are part of what is measured).
        inputs: list of feeds; references: their correct outputs (same order).
        model: model name. rate_qps: offered load. timeout_s: per-request budget.
        audit_subject: subject on which workers publish executed request ids (msgpack list), or None.
        references_by_version: model version → correct outputs of ``inputs`` for that version; when given,
            each answer is checked against the version its reply names (an unknown version is wrong).
    """

    def __init__(self, client, model: str, inputs: list[dict], references: list[dict], *, rate_qps: float,
                 timeout_s: float = 1.0, audit_subject: str | None = None,
                 references_by_version: dict[str, list[dict]] | None = None) -> None:
        self.client = client
        self.model = model
        self.inputs = inputs
        self.references = references
        self.rate_qps = rate_qps
        self.timeout_s = timeout_s
        self.audit_subject = audit_subject
        self.references_by_version = references_by_version
        self.records: list[RequestRecord] = []
        self.executions: Counter = Counter()
        self.executed_by: defaultdict[str, list[str]] = defaultdict(list)
        """Request id → the worker of each audited execution (``?`` for a batch without ``Inferbus-Worker-Id``)."""
        self.t_start: float | None = None
        """Monotonic time the first request was scheduled (set by :meth:`run`); the ``*_sent_at_s`` figures count
        from it."""
        self._stop = asyncio.Event()
        self.started = asyncio.Event()
        """Set by :meth:`run` once :attr:`t_start` is set (the first request is being scheduled): a drill that times
        its fault from the load's start waits for it."""
        self._run_id = uuid.uuid4().hex[:8]

    def _correct(self, i: int, outputs: dict, references: list[dict] | None = None) -> bool:
        references = self.references if references is None else references
        ref = references[i % len(references)]
        for name, want in ref.items():
            got = outputs.get(name)
            if got is None or got.shape != want.shape:
                return False
            if want.dtype.kind == "f":
                if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
                    return False
            elif not np.array_equal(got, want):
                return False
        return True

    async def _one(self, i: int, t_sched: float) -> None:
        rid = f"{self._run_id}-{i}"
        feed = self.inputs[i % len(self.inputs)]
        try:
            res = await self.client.infer_result(self.model, feed, timeout_s=self.timeout_s, request_id=rid)
        except InferbusError as err:
            self.records.append(RequestRecord(rid, t_sched, time.monotonic(), err.code.value))
            return
        if self.references_by_version is None:
            outcome = "ok" if self._correct(i, res.outputs) else "wrong"
        else:
            refs = self.references_by_version.get(res.model_version)
            outcome = "ok" if refs is not None and self._correct(i, res.outputs, refs) else "wrong"
        t_done = time.monotonic()
        if outcome == "ok" and t_done - t_sched > self.timeout_s:
            outcome = "DEADLINE_EXCEEDED"
        p = res.parameters or {}
        self.records.append(RequestRecord(rid, t_sched, t_done, outcome, p.get("worker_id"), p.get("term"),
                                          res.model_version))

    async def run(self, duration_s: float) -> None:
        """Offer load for ``duration_s`` seconds (or until :meth:`stop`), then wait for every request to end."""
        sub = None
        if self.audit_subject:
            import msgspec

            dec = msgspec.msgpack.Decoder(list[str])

            async def on_audit(msg):
                worker = (msg.headers or {}).get("Inferbus-Worker-Id", "?")
                for rid in dec.decode(msg.data):
                    if rid.startswith(self._run_id):
                        self.executions[rid] += 1
                        self.executed_by[rid].append(worker)

            sub = await self.client.nc.subscribe(self.audit_subject, cb=on_audit)
            await self.client.nc.flush()  # the server has the interest before the first request goes out
        tasks: set[asyncio.Task] = set()
        interval = 1.0 / self.rate_qps
        start = self.t_start = time.monotonic()
        self.started.set()
        i = 0
        while not self._stop.is_set():
            t_sched = start + i * interval
            if t_sched - start >= duration_s:
                break
            delay = t_sched - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            t = asyncio.create_task(self._one(i, t_sched))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.gather(*tasks)
        if sub is not None:
            await self.client.nc.flush()
            await asyncio.sleep(0.2)  # let the last audit batches arrive
            await sub.unsubscribe()

    def stop(self) -> None:
        self._stop.set()

    async def wait_into_load(self, load: asyncio.Task, at_s: float) -> None:
        """Return ``at_s`` seconds after the load's first request (:attr:`t_start` + ``at_s``, never before), ``load``
        being the task running :meth:`run`: a drill times its fault with it. Timed from the drill task's own start,
        the fault's time also counted the load's set-up (the audit subscription's round trip to the server), so a
        short ``fault_at_s`` came before much load had been sent. A load that ends before its first request raises
        its error here (``RuntimeError`` when it had none)."""
        started = asyncio.ensure_future(self.started.wait())
        try:
            await asyncio.wait({load, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not started.done():
                started.cancel()
        if self.t_start is None:
            await load
            raise RuntimeError("the load ended before its first request")
        await sleep_until(self.t_start + at_s)

    def fault_phases(self, injected: float, healed: float | None = None) -> dict:
        """A drill's fault on the load's clock, for its ``extra`` (call it once the load has ended), in seconds from
        the load's first request (:attr:`t_start`): ``fault_injected_at_s`` and, for a fault healed during the
        drill (``healed``, monotonic), ``fault_healed_at_s`` and ``fault_lasted_s`` (their difference);
        ``last_request_sent_at_s`` (the last request's planned time); then counts of requests by planned time:
        ``requests_before_fault`` (before the injection) and ``requests_during_fault`` (from the injection to the
        heal, or to the load's end for a fault not healed during the drill)."""
        start = self.t_start
        sent = [r.t_sched for r in self.records]
        end = healed if healed is not None else float("inf")
        out = {"fault_injected_at_s": round(injected - start, 3)}
        if healed is not None:
            out["fault_healed_at_s"] = round(healed - start, 3)
            out["fault_lasted_s"] = round(healed - injected, 3)
        out["last_request_sent_at_s"] = round(max(sent) - start, 3) if sent else None
        out["requests_before_fault"] = sum(1 for t in sent if t < injected)
        out["requests_during_fault"] = sum(1 for t in sent if injected <= t <= end)
        return out

    def figures(self, drill: str, fault_window: tuple[float, float] | None = None, *,
                detection_ms: float | None = None, recovery_ms: float | None = None, extra: dict | None = None
                ) -> DrillFigures:
        """Summarize the records; ``fault_window`` = (start, end) monotonic seconds for the during-fault p99.

        With a fault window and the audit, ``extra.duplicates_in_flight_at_fault`` counts the duplicated requests
        that were in flight when the fault began (sent at most ``timeout_s`` before it, not after): the only ones
        a frozen worker may run twice by design, when the freeze caught it computing them and the client's retry
        ran them elsewhere meanwhile (docs/failure-semantics.md, "A worker that freezes")."""
        recs = self.records
        hist = HdrHistogram(1, 600_000_000, 3)
        fault_hist = HdrHistogram(1, 600_000_000, 3)
        errors: Counter = Counter()
        ok = wrong = 0
        for r in recs:
            us = max(int((r.t_done - r.t_sched) * 1e6), 1)
            hist.record_value(us)
            if fault_window and fault_window[0] <= r.t_sched <= fault_window[1]:
                fault_hist.record_value(us)
            if r.outcome == "ok":
                ok += 1
            elif r.outcome == "wrong":
                wrong += 1
            else:
                errors[r.outcome] += 1
        n = len(recs)
        dups = sum(1 for c in self.executions.values() if c > 1) if self.audit_subject else None
        t0 = self.t_start if self.t_start is not None else (recs[0].t_sched if recs else 0.0)
        dup_at = sorted(round(r.t_sched - t0, 2) for r in recs if self.executions.get(r.request_id, 0) > 1)
        dups_in_flight = None
        if fault_window and self.audit_subject:
            dups_in_flight = sum(1 for r in recs if self.executions.get(r.request_id, 0) > 1
                                 and fault_window[0] - self.timeout_s <= r.t_sched <= fault_window[0])
        dup_detail = [{"sent_at_s": round(r.t_sched - t0, 3), "ran_on": self.executed_by.get(r.request_id, []),
                       "answered_by": r.worker_id, "outcome": r.outcome, "ms": round((r.t_done - r.t_sched) * 1000, 1)}
                      for r in sorted(recs, key=lambda r: r.t_sched) if self.executions.get(r.request_id, 0) > 1][:20]
        on_one_worker = sum(1 for ws in self.executed_by.values() if len(set(ws)) < len(ws) and "?" not in ws)
        failed_at = sorted(round(r.t_sched - t0, 2) for r in recs if r.outcome not in ("ok", "wrong"))
        by_version = Counter(r.model_version for r in recs if r.model_version is not None)
        return DrillFigures(
            drill=drill, requests=n, ok=ok, failed=n - ok - wrong, wrong=wrong, duplicates=dups,
            availability=round(ok / n, 6) if n else 0.0,
            p50_ms=hist.get_value_at_percentile(50) / 1000 if n else 0.0,
            p99_ms=hist.get_value_at_percentile(99) / 1000 if n else 0.0,
            p99_ms_during_fault=(fault_hist.get_value_at_percentile(99) / 1000
                                 if fault_hist.get_total_count() else None),
            detection_ms=detection_ms, recovery_ms=recovery_ms, errors=dict(errors),
            extra={**(extra or {}), "executions_audited": sum(self.executions.values()) if self.audit_subject else None,
                   "max_ms": round(hist.get_max_value() / 1000, 1) if n else None, "timeout_ms": self.timeout_s * 1000,
                   **({"duplicates_sent_at_s": dup_at[:20], "duplicates_detail": dup_detail} if dup_at else {}),
                   **({"duplicates_on_one_worker": on_one_worker} if self.audit_subject else {}),
                   **({"duplicates_in_flight_at_fault": dups_in_flight} if dups_in_flight is not None else {}),
                   **({"failed_sent_at_s": failed_at[:50]} if failed_at else {}),
                   **({"answers_by_version": dict(sorted(by_version.items()))}
                      if self.references_by_version is not None else {})},
        )
