"""Hedged requests after the first answer (docs/failure-semantics.md, "Hedged requests"; docs/observability.md,
"Tracing"): the ingress span names the copy that answered and ends with its answer, and the losing copy, still
pending when its worker dies, is dropped: not sent again, not answered UNAVAILABLE (the client has its answer).

One real node (1 ingress, 2 worker processes, ``--fault-injection``, every request traced to a collector run here).
Each test sends one raw hedged NATS request (its own reply subject, where every reply is counted) and chooses the
winner with per-worker compute delays: both workers are delayed, and once the first copy (``Inferbus-Hedge:
primary``) is seen on one worker's subject, the other worker's delay is changed before the hedge (``copy``) reaches
it (a worker reads its delay when it takes a request). The counts come from the ingress's ``$SRV.STATS`` and from
the node's ``/metrics`` (``--metrics-port``), which renders them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import nats
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from conftest import start_deployment
from conftest import uvloop_backend as anyio_backend  # noqa: F401  (process-heavy: one loop is enough)
from inferbus.bus import headers as H
from inferbus.schemas import InferRequest, decode_error, decode_response, encode_request, input_from_numpy
from test_metrics import scrape, total
from test_reliability_lib import Reports, models_subset, set_fault
from test_tracing import Collector, attrs, digits_input, traceparent

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

PREFIX = "hl"
WORKERS = ("n1-w0", "n1-w1")
HEDGE_MS = 300
"""The requests' hedge delay: the other worker's fault is set within it, after the first copy is seen."""


@pytest.fixture(scope="module")
def collector():
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def node(collector, tmp_path_factory):
    """A node of 1 ingress and 2 worker processes obeying injected faults, every request traced."""
    root = tmp_path_factory.mktemp("hedge_losers")
    dep = start_deployment(root / "dep", workers=2, prefix=PREFIX,
                           extra=["--models", str(models_subset(root / "models", ["digits"])), "--fault-injection",
                                  "--hedge-budget", "1", "--trace-otlp-endpoint", collector.url, "--trace-ratio", "1",
                                  "--metrics-port", "0", "--metrics-host", "127.0.0.1"])
    try:
        dep.metrics_url = dep.printed_metrics_url()
        yield dep
    finally:
        dep.stop()


async def ingress_infer(nc) -> dict:
    """The ingress's ``infer`` endpoint in ``$SRV.STATS`` (one ingress): ``num_errors`` and ``data`` (``counts``,
    ``pending``, ``per_model``, ``workers``)."""
    msg = await nc.request("$SRV.STATS.inferbus-ingress", b"", timeout=5)
    [e] = [e for e in json.loads(msg.data)["endpoints"] if e["name"] == "infer"]
    return e


async def until(nc, predicate, what: str, timeout_s: float = 15.0) -> dict:
    """Poll the ingress's ``infer`` stats until ``predicate(stats)``; returns them."""
    deadline = time.monotonic() + timeout_s
    while True:
        e = await ingress_infer(nc)
        if predicate(e):
            return e
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {json.dumps(e['data'], default=str)[:3000]}"
        await asyncio.sleep(0.05)


COUNTS = ("requests", "ok_forwarded", "hedges", "hedge_wins", "hedge_cancels", "hedge_losers_dropped",
          "resent_after_death", "errors", "unavailable", "lost", "held", "hedges_on_refusal")
"""The ingress's counts the tests follow (others, e.g. ``route_scans`` or a crash's ``crash_checks``, move too)."""


def snapshot(e: dict) -> dict:
    """What the tests compare before and after: the ingress's :data:`COUNTS`, its ``infer`` endpoint's errors, and
    digits:1's successful forwards and errors by code (``per_model``: what ``/metrics`` renders as
    ``inferbus_model_request_success_total`` and ``..._failure_total``)."""
    d = e["data"]
    pm = d.get("per_model", {}).get("digits:1", {})
    return {**{k: d["counts"].get(k, 0) for k in COUNTS}, "num_errors": e["num_errors"],
            "ok": (pm.get("forward") or {}).get("count", 0), **{f"model_errors.{c}": n
                                                                 for c, n in (pm.get("errors") or {}).items()}}


def delta(before: dict, after: dict) -> dict:
    """The values that changed, by how much."""
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted({*before, *after})
            if after.get(k, 0) != before.get(k, 0)}


METRICS = {
    "hedges": ("inferbus_hedges_total", {}),
    "hedge_wins": ("inferbus_hedge_wins_total", {}),
    "hedge_cancels": ("inferbus_ingress_events_total", {"event": "hedge_cancels"}),
    "hedge_losers_dropped": ("inferbus_ingress_events_total", {"event": "hedge_losers_dropped"}),
    "resent_after_death": ("inferbus_ingress_events_total", {"event": "resent_after_death"}),
    "ingress_errors": ("inferbus_ingress_errors_total", {}),
    "request_errors": ("inferbus_request_errors_total", {}),
    "success": ("inferbus_model_request_success_total", {"model": "digits"}),
    "failure": ("inferbus_model_request_failure_total", {"model": "digits"}),
}
"""The ``/metrics`` series the tests follow, by a short name."""


def metrics(url: str) -> dict:
    """One scrape of :data:`METRICS` (each summed over its series) and of the ingress's in-flight counts per worker
    (``in_flight``: ``inferbus_worker_in_flight_requests_seen`` summed)."""
    samples = scrape(url)
    out = {k: total(samples, name, **labels) for k, (name, labels) in METRICS.items()}
    out["in_flight"] = total(samples, "inferbus_worker_in_flight_requests_seen")
    return out


class Hedged:
    """One raw hedged request and what it led to: the forwards seen on the workers' subjects (``(worker, mark)``),
    the replies on its own reply subject, its trace."""

    def __init__(self, nc, reports: Reports) -> None:
        self.nc, self.reports = nc, reports
        self.forwards: list[tuple[str, str | None]] = []
        self.replies: list = []
        self.answered_ns = 0
        self._forward = asyncio.Event()
        self._reply = asyncio.Event()
        self._subs = []

    async def send(self, first_delay_ms: float, other_delay_ms: float) -> tuple[str, str]:
        """Both workers delayed ``first_delay_ms``; the request sent, hedged after :data:`HEDGE_MS`; once its first
        copy is seen at one worker, the other's delay set to ``other_delay_ms``. Returns ``(first copy's worker,
        hedge's worker)`` once both copies were seen."""
        nc = self.nc
        for w in WORKERS:
            await set_fault(nc, PREFIX, w, compute_delay_ms=first_delay_ms)

        async def on_forward(msg) -> None:  # (a plain subscriber: a copy of each forward, the workers get theirs)
            self.forwards.append((msg.subject.rsplit(".", 1)[1], (msg.headers or {}).get(H.HEDGE)))
            self._forward.set()

        async def on_reply(msg) -> None:
            if not self.replies:
                self.answered_ns = time.time_ns()
            self.replies.append(msg)
            self._reply.set()

        inbox = nc.new_inbox()
        self._subs = [await nc.subscribe(f"{PREFIX}._w.*", cb=on_forward), await nc.subscribe(inbox, cb=on_reply)]
        await nc.flush()
        tp, self.trace_id, self.client_span = traceparent("01")
        body = encode_request(InferRequest(inputs=[
            input_from_numpy(k, v) for k, v in digits_input(time.time_ns() % 2**32).items()]))
        await nc.publish(f"{PREFIX}.infer.digits", body, reply=inbox,
                         headers={H.HEDGE: str(HEDGE_MS), H.TIMEOUT_MS: "15000", "traceparent": tp})
        await asyncio.wait_for(self._forward.wait(), 5)
        first, mark = self.forwards[0]
        assert mark == "primary", self.forwards
        other = next(w for w in WORKERS if w != first)
        await set_fault(nc, PREFIX, other, compute_delay_ms=other_delay_ms)
        deadline = time.monotonic() + 5
        while len(self.forwards) < 2:
            assert time.monotonic() < deadline, f"no hedge sent: {self.forwards}"
            self._forward.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._forward.wait(), 0.5)
        assert self.forwards == [(first, "primary"), (other, "copy")], self.forwards
        return first, other

    async def answer(self):
        """The first reply (an InferResponse)."""
        await asyncio.wait_for(self._reply.wait(), 10)
        m = self.replies[0]
        assert decode_error(m.headers, m.data) is None, decode_error(m.headers, m.data)
        return decode_response(m.data)

    async def quiet(self) -> None:
        """Let whatever else is on its way to the reply subject arrive (the ingress holds nothing of the request by
        now: any second reply was written before its completion notice)."""
        await self.nc.flush()
        await asyncio.sleep(0.3)

    async def close(self) -> None:
        for s in self._subs:
            with contextlib.suppress(Exception):
                await s.unsubscribe()
        for w in WORKERS:  # (a killed one is restarted without the fault)
            with contextlib.suppress(Exception):
                await set_fault(self.nc, PREFIX, w)


@pytest.fixture
async def env(node):
    """A connection, the workers' reports and the node's /metrics URL, once the ingress sees both workers healthy and
    nothing pending."""
    nc = await nats.connect(node.nats_url)
    reports = await Reports.start(nc, PREFIX)
    try:
        await reports.wait(lambda r: set(WORKERS) <= set(r), what="both workers reporting")
        await until(nc, lambda e: e["data"]["pending"] == 0 and all(
            e["data"]["health"].get(w) == "ok" and e["data"]["breakers"].get(w) == "closed" for w in WORKERS),
            "both workers healthy at the ingress, nothing pending")
        yield nc, reports, node.metrics_url
    finally:
        await reports.stop()
        await nc.close()


def spans_of(collector: Collector, trace_id: bytes, n: int):
    """The ingress span and the worker spans (by worker id) of a trace, once ``n`` spans arrived."""
    got = collector.wait_trace(trace_id, n)
    [ingress] = [s for s, _ in got if s.kind == Span.SPAN_KIND_SERVER]
    workers = {}
    for s, _ in got:
        if s.kind == Span.SPAN_KIND_CONSUMER:
            workers.setdefault(attrs(s)["inferbus.worker.id"], []).append(s)
    return ingress, workers


async def test_a_hedge_that_answers_first_has_the_ingress_span(env, collector):
    """The first copy's worker computes for 3 s, the hedge's at once: the hedge answers. The ingress span names the
    hedge's worker and ends with its answer, not 3 s later with the first copy's CANCELLED completion (which named
    the first copy's worker: the span went with the first copy whatever answered). One reply; the hedge counted as
    sent, won and its loser cancelled; no error anywhere."""
    nc, reports, url = env
    before, m0 = snapshot(await ingress_infer(nc)), metrics(url)
    req = Hedged(nc, reports)
    try:
        first, second = await req.send(3000, 0)
        r = await req.answer()
        assert r.parameters["worker_id"] == second
        # the first copy, cancelled while its worker slept, completes CANCELLED: then nothing is pending
        ingress, workers = spans_of(collector, req.trace_id, 3)
        after_e = await until(nc, lambda e: e["data"]["pending"] == 0, "the first copy's completion")
        await req.quiet()
    finally:
        await req.close()
    assert len(req.replies) == 1, [(m.headers, m.data[:100]) for m in req.replies]
    a = attrs(ingress)
    [loser], [winner] = workers[first], workers[second]
    assert attrs(loser)["error.type"] == "CANCELLED"
    assert a["inferbus.worker.id"] == second, (a, first, second)
    assert ingress.status.code != Status.STATUS_CODE_ERROR and "error.type" not in a, (ingress.status, a)
    assert ingress.parent_span_id == req.client_span
    assert winner.parent_span_id == loser.parent_span_id == ingress.span_id
    # ended by the hedge's answer (~0.3 s in), long before the loser's completion (~3 s in)
    assert ingress.end_time_unix_nano < loser.end_time_unix_nano - 1.5e9, \
        (ingress.end_time_unix_nano - ingress.start_time_unix_nano) / 1e9
    assert ingress.end_time_unix_nano < req.answered_ns + 1e9, (ingress.end_time_unix_nano - req.answered_ns) / 1e9
    assert delta(before, snapshot(after_e)) == {"requests": 1, "ok_forwarded": 1, "hedges": 1, "hedge_wins": 1,
                                                "hedge_cancels": 1, "ok": 1}
    assert all(after_e["data"]["workers"][w]["in_flight"] == 0 for w in WORKERS), after_e["data"]["workers"]
    assert delta(m0, metrics(url)) == {"hedges": 1, "hedge_wins": 1, "hedge_cancels": 1, "success": 1}


async def test_a_dead_first_copy_of_an_answered_hedge_is_not_sent_again(env, collector):
    """The hedge answers (as above); then the first copy's worker, still holding it (a 5 s compute delay), is
    SIGKILLed. The ingress drops the first copy: not sent again (it was: the model ran a third time and the client's
    reply subject got a second answer), no error, and the ingress span (the hedge's) ended before the kill."""
    nc, reports, url = env
    before, m0 = snapshot(await ingress_infer(nc)), metrics(url)
    req = Hedged(nc, reports)
    try:
        first, second = await req.send(5000, 0)
        r = await req.answer()
        assert r.parameters["worker_id"] == second
        await until(nc, lambda e: e["data"]["counts"]["hedge_cancels"] > before["hedge_cancels"],
                    "the hedge settled")
        old_pid = reports.latest[first].pid
        killed_ns = time.time_ns()
        os.kill(old_pid, signal.SIGKILL)
        # the death handled: the first copy is no longer pending (dropped here; sent again and answered before)
        after_e = await until(nc, lambda e: e["data"]["pending"] == 0, "the first copy's worker's death handled")
        await req.quiet()
    finally:
        await req.close()
    assert len(req.replies) == 1, [(decode_error(m.headers, m.data) or decode_response(m.data).parameters["worker_id"])
                                   for m in req.replies]
    assert req.forwards == [(first, "primary"), (second, "copy")], req.forwards  # nothing sent again
    d = delta(before, snapshot(after_e))
    assert d == {"requests": 1, "ok_forwarded": 1, "hedges": 1, "hedge_wins": 1, "hedge_cancels": 1, "ok": 1,
                 "hedge_losers_dropped": 1}, d
    # the winner's count released by its completion, the dead worker's with its death (nothing held there any more)
    assert all(after_e["data"]["workers"][w]["in_flight"] == 0 for w in WORKERS), after_e["data"]["workers"]
    assert delta(m0, metrics(url)) == {"hedges": 1, "hedge_wins": 1, "hedge_cancels": 1,
                                                "hedge_losers_dropped": 1, "success": 1}
    ingress, workers = spans_of(collector, req.trace_id, 2)  # the ingress's and the hedge's (the killed one's never ends)
    assert set(workers) == {second} and len(workers[second]) == 1, workers
    assert attrs(ingress)["inferbus.worker.id"] == second
    assert ingress.end_time_unix_nano < killed_ns


async def test_a_dead_hedge_of_an_answered_first_copy_is_not_answered(env, collector):
    """The symmetric case: the first copy answers after 1 s while the hedge's worker sleeps 5 s on its copy; that
    worker is SIGKILLed. The hedge is dropped: no UNAVAILABLE to the client's reply subject after its answer (it got
    one: a hedge's copy is never sent again, so it was answered the worker's death), no error counted."""
    nc, reports, url = env
    before, m0 = snapshot(await ingress_infer(nc)), metrics(url)
    req = Hedged(nc, reports)
    try:
        first, second = await req.send(1000, 5000)
        r = await req.answer()
        assert r.parameters["worker_id"] == first
        await until(nc, lambda e: e["data"]["counts"]["hedge_cancels"] > before["hedge_cancels"],
                    "the hedge settled")
        old_pid = reports.latest[second].pid
        os.kill(old_pid, signal.SIGKILL)
        after_e = await until(nc, lambda e: e["data"]["pending"] == 0, "the hedge's worker's death handled")
        await req.quiet()
    finally:
        await req.close()
    assert len(req.replies) == 1, [(decode_error(m.headers, m.data) or decode_response(m.data).parameters["worker_id"])
                                   for m in req.replies]
    assert req.forwards == [(first, "primary"), (second, "copy")], req.forwards
    d = delta(before, snapshot(after_e))
    assert d == {"requests": 1, "ok_forwarded": 1, "hedges": 1, "hedge_cancels": 1, "ok": 1,
                 "hedge_losers_dropped": 1}, d
    assert all(after_e["data"]["workers"][w]["in_flight"] == 0 for w in WORKERS), after_e["data"]["workers"]
    assert delta(m0, metrics(url)) == {"hedges": 1, "hedge_cancels": 1, "hedge_losers_dropped": 1,
                                                "success": 1}
    ingress, workers = spans_of(collector, req.trace_id, 2)
    assert set(workers) == {first}, workers
    a = attrs(ingress)
    assert a["inferbus.worker.id"] == first and "error.type" not in a, a


async def test_a_hedge_sent_on_a_refusal_has_the_ingress_span(env, collector):
    """One worker sheds every request (as from a full mailbox, while it reports an empty queue): a first copy it sheds
    is not answered by it but held, and the ingress sends the hedge at once to the other worker, which answers (the
    hedge delay, 5 s, is over the 3 s budget: no timed hedge). The ingress span names the worker that answered and
    ends with its answer; it ended at the refusal, OK, naming the worker that shed the request."""
    nc, reports, url = env
    shedding, other = WORKERS
    forwards: dict[str, list[tuple[str, str | None]]] = {}

    async def on_forward(msg) -> None:
        rid = (msg.headers or {}).get(H.REQUEST_ID)
        forwards.setdefault(rid, []).append((msg.subject.rsplit(".", 1)[1], (msg.headers or {}).get(H.HEDGE)))

    async def one(rid: str, tp: str):
        body = encode_request(InferRequest(inputs=[
            input_from_numpy(k, v) for k, v in digits_input(time.time_ns() % 2**32).items()]))
        m = await nc.request(f"{PREFIX}.infer.digits", body, timeout=5, headers={
            H.HEDGE: "5000", H.TIMEOUT_MS: "3000", H.REQUEST_ID: rid, "traceparent": tp})
        assert decode_error(m.headers, m.data) is None, decode_error(m.headers, m.data)
        return decode_response(m.data)

    sub = await nc.subscribe(f"{PREFIX}._w.*", cb=on_forward)
    await set_fault(nc, PREFIX, shedding, shed=True)
    found = None
    try:
        for i in range(10):  # pairs: the shedding worker looks idle, so it gets the first copy of one of a pair
            tps = {f"hl-held-{i}-{j}-{time.time_ns()}": traceparent("01") for j in range(2)}
            answers = await asyncio.gather(*(one(rid, tp) for rid, (tp, _, _) in tps.items()))
            await nc.flush()
            for (rid, (_, trace_id, _)), r in zip(tps.items(), answers):
                if forwards.get(rid) == [(shedding, "primary"), (other, "copy")]:
                    assert r.parameters["worker_id"] == other
                    found = trace_id
            if found:
                break
    finally:
        await sub.unsubscribe()
        await set_fault(nc, PREFIX, shedding)
    assert found is not None, forwards
    deadline = time.monotonic() + 15

    def arrived() -> bool:  # the ingress's span and the answering worker's (each process exports its own)
        got = collector.trace(found)
        return any(s.kind == Span.SPAN_KIND_SERVER for s, _ in got) and any(
            s.kind == Span.SPAN_KIND_CONSUMER and attrs(s).get("inferbus.worker.id") == other for s, _ in got)

    while not arrived():
        assert time.monotonic() < deadline, [(s.name, attrs(s)) for s, _ in collector.trace(found)]
        await asyncio.sleep(0.05)
    ingress, workers = spans_of(collector, found, len(collector.trace(found)))
    a = attrs(ingress)
    assert a["inferbus.worker.id"] == other, (a, workers)
    assert ingress.status.code != Status.STATUS_CODE_ERROR and "error.type" not in a, (ingress.status, a)
    assert workers[other][0].parent_span_id == ingress.span_id
    # ended with the answer: after the answering worker received the hedge
    assert ingress.end_time_unix_nano > workers[other][0].start_time_unix_nano
