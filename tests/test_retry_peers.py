"""A client's retry that lands on another ingress replica joins the first copy (no second execution).

Real nats-server, two ingress replicas in one queue group, two workers slowed by fault injection; the
retries carry ``Inferbus-Attempt`` as the SDK sends them, so the replica without the first copy asks its
peers (``<p>._rid``) which worker holds it.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import msgpack
import nats
import pytest
from nats.errors import TimeoutError as NatsTimeout

from conftest import start_deployment
from test_reliability_lib import Reports, ingress_counts, models_subset, set_fault

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

PREFIX = "rp"
W0, W1 = "n1-w0", "n1-w1"


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    root = tmp_path_factory.mktemp("retry-peers")
    models = models_subset(root / "models", ["typed"], {"typed": {"cache_ttl_ms": 0}})
    d = start_deployment(root / "dep", workers=2, prefix=PREFIX, extra=[
        "--models", str(models), "--no-cache", "--fault-injection", "--ingress", "2", "--health-timeout-s", "3",
        # the default 5 ms peer query can go unanswered on a starved 2-core box (then the retry is routed afresh
        # and this test's exact count of peer-found retries fails by chance): give the peer time to answer
        "--peer-query-timeout-ms", "250"])
    yield d
    d.stop()


def _body(k: int, rid: str | None = None) -> bytes:
    return msgpack.packb({**({"id": rid} if rid else {}),
                          "inputs": [{"name": "a", "datatype": "INT32", "shape": [1, 1], "data": [k]},
                                     {"name": "b", "datatype": "FP16", "shape": [1, 4], "data": [0.25] * 4}]})


def _id_carrier(rid: str, id_in: str, k: int) -> tuple[bytes, dict]:
    """The body and headers of a request whose id ``rid`` is the ``Inferbus-Request-Id`` header (``id_in`` =
    ``header``) or the body's ``id`` (``body``: a plain KServe client's idempotency key)."""
    if id_in == "header":
        return _body(k), {"Inferbus-Request-Id": rid, "Inferbus-Timeout-Ms": "3000"}
    return _body(k, rid), {"Inferbus-Timeout-Ms": "3000"}


ID_IN = pytest.mark.parametrize("id_in", ["header", "body"])


@ID_IN
async def test_retries_through_either_ingress_run_the_model_once(dep, id_in):
    nc = await nats.connect(dep.nats_url)
    reports = await Reports.start(nc, PREFIX)
    try:
        await reports.wait(lambda r: {W0, W1} <= set(r), what="both workers reporting")
        for w in (W0, W1):
            await set_fault(nc, PREFIX, w, compute_delay_ms=1500)
        await reports.wait(lambda r: all(r[w].in_flight == 0 for w in (W0, W1)), what="idle")
        ran0 = reports.computed()
        peer0 = sum(c.get("peer_sticky_retries", 0) for c in await ingress_counts(nc))
        joins0 = sum(r.dedup_joins for r in reports.latest.values())
        rid = uuid.uuid4().hex
        body, headers = _id_carrier(rid, id_in, 21)
        with pytest.raises(NatsTimeout):  # the first attempt: abandoned by the client while it computes
            await nc.request(f"{PREFIX}.infer.typed", body, timeout=0.2, headers=headers)
        t0 = time.monotonic()
        late = []
        for attempt in range(2, 14):  # 12 retries: each lands on either replica (queue group)
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            late.append(sub)
            await nc.publish(f"{PREFIX}.infer.typed", body, reply=inbox,
                             headers={**headers, "Inferbus-Attempt": str(attempt)})
            await asyncio.sleep(0.03)
        answers = []
        for sub in late:  # every retry gets the one computation's answer
            msg = await sub.next_msg(timeout=3.0)
            assert msg.headers["Inferbus-Request-Id"] == rid
            answers.append(msgpack.unpackb(msg.data))
        assert time.monotonic() - t0 < 2.5
        for a in answers:
            assert next(o for o in a["outputs"] if o["name"] == "a_times_2")["data"] == [42]
        for w in (W0, W1):
            await set_fault(nc, PREFIX, w)
        await reports.wait(lambda r: all(r[w].in_flight == 0 for w in (W0, W1)), what="idle")
        await reports.wait(lambda r: reports.computed() >= ran0 + 1, what="report of the run")
        await asyncio.sleep(0.3)  # one more report period: a second execution would show now
        assert reports.computed() - ran0 == 1  # one execution for 13 attempts through two ingresses
        assert sum(r.dedup_joins for r in reports.latest.values()) - joins0 == 12
        # both replicas took retries (all 12 on one: p = 2^-11), and the one without the first copy found
        # it through its peer rather than by chance of routing
        counts = await ingress_counts(nc)
        assert len(counts) == 2, counts
        assert sum(c["peer_sticky_retries"] for c in counts) - peer0 == 1, counts
    finally:
        await reports.stop()
        await nc.close()


@ID_IN
async def test_a_retry_after_the_answer_is_served_from_the_worker_that_computed_it(dep, id_in):
    """A copy of a request id sent *after* its first copy was answered (a lost reply, a late client retry) goes,
    through either ingress replica, to the worker that computed it, whose recent results answer it (``hit``):
    one execution for 13 attempts. Before, a completed copy left no trace at the ingresses, so each later
    attempt was routed afresh and mostly ran the model again on whichever worker the router picked. The same
    with the id in the body alone (a plain KServe client): the ingresses remembered only a header's id."""
    nc = await nats.connect(dep.nats_url)
    reports = await Reports.start(nc, PREFIX)
    try:
        await reports.wait(lambda r: {W0, W1} <= set(r), what="both workers reporting")
        for w in (W0, W1):
            await set_fault(nc, PREFIX, w)
        await reports.wait(lambda r: all(r[w].in_flight == 0 for w in (W0, W1)), what="idle")
        ran0 = reports.computed()
        rid = uuid.uuid4().hex
        body, headers = _id_carrier(rid, id_in, 33)
        first = await nc.request(f"{PREFIX}.infer.typed", body, timeout=3.0, headers=headers)
        assert not (first.headers or {}).get("Inferbus-Dedup")
        marks = []
        for attempt in range(2, 14):  # sequential: each one after the previous answer, on either replica
            msg = await nc.request(f"{PREFIX}.infer.typed", body, timeout=3.0,
                                   headers={**headers, "Inferbus-Attempt": str(attempt)})
            a = msgpack.unpackb(msg.data)
            assert next(o for o in a["outputs"] if o["name"] == "a_times_2")["data"] == [66]
            assert msg.headers["Inferbus-Request-Id"] == rid
            marks.append((msg.headers or {}).get("Inferbus-Dedup"))
        await reports.wait(lambda r: reports.computed() >= ran0 + 1, what="report of the run")
        await asyncio.sleep(0.3)  # one more report period: a second execution would show now
        assert reports.computed() - ran0 == 1, marks
        assert marks == ["hit"] * 12, marks
    finally:
        await reports.stop()
        await nc.close()
