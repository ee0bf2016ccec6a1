"""A model that fails on one input and runs others: the request is the client's error, not the worker's.

A fresh-user trial (2026-12-04, 2-core box): ``lookup``, a Gather over a 3-row table, given ``idx = 7``. ONNX Runtime
fails the run (``indices element out of data bounds``); the worker answered INTERNAL, a server error, and ten such
requests in a row opened the breaker of both workers: the node refused every model, ``digits`` included, for ~30 s,
and most of the bad requests waited out their budget as UNAVAILABLE instead of getting their error. Now the worker
runs the model's warm-up input again after such a failure; when that runs, the answer is INVALID_ARGUMENT with the
runtime's words and no worker is blamed. Against real ``inferbus up`` processes, with and without ``--colocate``
(the colocated ingress runs a lone miss itself, :meth:`Worker.run_now`; otherwise the worker's batch path).
"""

from __future__ import annotations

import asyncio
import json
import time

import anyio
import numpy as np
import pytest

from conftest import start_deployment, uvloop_backend as anyio_backend  # noqa: F401 (process-heavy tests: one loop)
from inferbus.client import Client
from inferbus.schemas import InvalidArgument
from test_reliability_lib import ingress_counts, models_subset, write_onnx_model

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

TABLE = np.array([10.0, 20.0, 30.0], np.float32)


def _lookup_model(folder) -> None:
    """``lookup``: idx INT64 [n, 1] -> v = TABLE[idx] FP32 [n, 1] (ONNX Gather; an idx outside -3..2 fails the run)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["v"], axis=0)], "lookup",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["n", 1])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, ["n", 1])],
        initializer=[helper.make_tensor("table", TensorProto.FLOAT, [3], TABLE.tolist())])
    write_onnx_model(folder, graph, {"max_batch_size": 8, "cache_ttl_ms": 0})


@pytest.fixture(scope="module", params=["forwarded", "colocated"])
def dep(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    models = models_subset(root / "models", ["digits"])
    _lookup_model(models / "lookup")
    extra = ["--models", str(models), "--no-cache"] + (["--colocate"] if request.param == "colocated" else [])
    d = start_deployment(root / "dep", workers=2, prefix="mif", extra=extra)
    yield d
    d.stop()


async def test_a_model_failure_the_input_causes_is_invalid_argument_and_blames_no_worker(dep):
    client = await Client.connect(dep.nats_url, "mif")
    try:
        for i in range(10):  # twice the breaker's consecutive failures (5), one at a time
            t0 = time.monotonic()
            with pytest.raises(InvalidArgument) as ei:
                await client.infer("lookup", {"idx": np.array([[7 + i]], np.int64)}, timeout_s=5.0)
            took_s = time.monotonic() - t0
            msg = ei.value.message
            assert "model 'lookup' version 1 failed on this input" in msg and "out of data bounds" in msg, msg
            assert took_s < 2.5, took_s  # answered, not waited out (a slack bound for a shared host, budget 5 s)
        health = await client.health(timeout_s=5.0)
        h = health.parameters
        assert health.ready is True, h
        for wid, w in h["workers"].items():
            assert w["breaker"] == "closed" and w["breaker_trips"] == 0, (wid, w)
        # every model still served at once
        out = await client.infer("digits", {"pixels": np.full((1, 64), 0.5, np.float32)}, timeout_s=5.0)
        assert out["probabilities"].shape == (1, 10)
        out = await client.infer("lookup", {"idx": np.array([[2], [0]], np.int64)}, timeout_s=5.0)
        np.testing.assert_array_equal(out["v"], TABLE[[[2], [0]]])

        # one bad request among good ones sent at once (merged into batches where they meet): only it fails
        async def one(i: int):
            idx = 99 if i == 10 else i % 3
            try:
                got = await client.infer("lookup", {"idx": np.array([[idx]], np.int64)}, timeout_s=5.0)
            except InvalidArgument as err:
                return i, err
            return i, got["v"]

        results = dict(await asyncio.gather(*(one(i) for i in range(21))))
        assert isinstance(results.pop(10), InvalidArgument)
        for i, v in results.items():
            assert not isinstance(v, Exception), (i, v)
            np.testing.assert_array_equal(v, TABLE[[[i % 3]]])
    finally:
        await client.close()
    # the workers' $SRV.STATS count them under input_failures (this deployment's, other tests' included: at least
    # the eleven above), none under errors (server-side failures, what the health window and the load reports hold
    # against a worker)
    stats = await _worker_stats(dep.nats_url)
    assert sum(d["input_failures"] for d in stats) >= 11, stats
    assert sum(d["errors"] for d in stats) == 0, stats


async def _worker_stats(nats_url: str) -> list[dict]:
    """The ``infer`` endpoint data of both workers' ``$SRV.STATS`` replies."""
    import nats

    nc = await nats.connect(nats_url)
    try:
        msgs = []

        async def on_stats(msg) -> None:
            msgs.append(msg)

        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, cb=on_stats)
        await nc.publish("$SRV.STATS.inferbus-worker", b"", reply=inbox)
        deadline = time.monotonic() + 3
        while len(msgs) < 2 and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        await sub.unsubscribe()
    finally:
        await nc.close()
    datas = [e.get("data") or {} for m in msgs for e in json.loads(m.data)["endpoints"] if e["name"] == "infer"]
    assert len(datas) == 2, [m.data[:300] for m in msgs]
    return datas




def test_bench_says_how_to_load_a_model_that_fails_on_drawn_inputs(tmp_path):
    """``inferbus bench lookup``: the load draws integers in [0, 100) for ``idx``, the model fails on them, and the
    generator's one line said only the runtime's words (a fresh-user trial). It now names the dataset file that
    mends it; with that file, the rows made distinct for a cache-miss load (+1 or more) fail too, and the line says
    to load it with ``--hit``, which then runs with every answer right (``cache_ttl_ms`` 0: each one computed)."""
    import subprocess
    import sys

    from conftest import ROOT

    models = tmp_path / "models"
    _lookup_model(models / "lookup")
    argv = [sys.executable, "-m", "inferbus.cli", "bench", "lookup", "--models", str(models), "--workers", "1",
            "--concurrency", "2", "--duration", "0.5", "--json"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=ROOT)
    data = models / "lookup" / "data" / "test.npz"
    assert p.returncode == 1 and "fails on the random inputs drawn for a model without a dataset" in p.stderr and \
        f"give it rows it accepts in {data}" in p.stderr and "out of data bounds" in p.stderr, p.stderr[-2000:]
    data.parent.mkdir()
    np.savez(data, idx=np.array([[0], [1], [2]] * 10, np.int64))
    p = subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert p.returncode == 1 and f"fails on a row of {data} made distinct" in p.stderr and "out of data bounds" in p.stderr and "bench --hit" in \
        p.stderr, p.stderr[-2000:]
    p = subprocess.run(argv + ["--hit"], capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    step = json.loads(p.stdout)[0]
    assert step["requests"] > 0 and step["wrong"] == 0 and not step["errors"], step


def _div_model(folder) -> None:
    """``div``: out = d / (e - 1), INT64 [n, 1]. Its zero warm-up input runs (0 / -1); d = INT64_MIN, e = 0 (INT64_MIN
    / -1) kills ONNX Runtime's process with SIGFPE (onnxruntime 1.2x on x86-64)."""
    from onnx import TensorProto, helper

    i64 = TensorProto.INT64
    graph = helper.make_graph(
        [helper.make_node("Sub", ["e", "one"], ["em"]), helper.make_node("Div", ["d", "em"], ["out"])], "div",
        [helper.make_tensor_value_info("d", i64, ["n", 1]), helper.make_tensor_value_info("e", i64, ["n", 1])],
        [helper.make_tensor_value_info("out", i64, ["n", 1])], initializer=[helper.make_tensor("one", i64, [], [1])])
    write_onnx_model(folder, graph, {"max_batch_size": 8, "cache_ttl_ms": 0})  # no cache key: the body identifies it


@pytest.fixture
def poisoned(tmp_path):
    root = tmp_path
    models = models_subset(root / "models", ["digits"])
    _div_model(models / "div")
    d = start_deployment(root / "dep", workers=2, prefix="qod", extra=["--models", str(models)])
    yield d
    d.stop()


POISON = {"d": np.array([[np.iinfo(np.int64).min]], np.int64), "e": np.array([[0]], np.int64)}


async def _killer_answered(client, deaths, words: str, within_s: float, dep) -> float:
    """Send :data:`POISON` (10 s budget): it must end INTERNAL saying ``words`` within ``within_s``, and ``deaths()``
    must reach 1 within 5 s after. Returns the seconds the call took."""
    from inferbus.schemas import Internal

    t0 = time.monotonic()
    with pytest.raises(Internal) as ei:
        await client.infer("div", POISON, timeout_s=10.0)
    took_s = time.monotonic() - t0
    assert words in ei.value.message, ei.value.message
    assert took_s < within_s, took_s
    deadline = time.monotonic() + 5
    while deaths() < 1:
        assert time.monotonic() < deadline, dep.log.read_text()[-3000:]
        await anyio.sleep(0.1)
    return took_s


async def _killer_among_innocents(client, timeout_s: float, warm: int) -> tuple[str, list]:
    """``warm`` innocent ``div`` calls one by one, then :data:`POISON` (which must end INTERNAL) sent at once with 23
    innocents (``d = 2k, e = 3``: answer ``[[k]]``), each with ``timeout_s``. Returns the killer's message and the
    innocents' results in order (an exception where a call failed)."""
    from inferbus.schemas import Internal

    async def innocent(k: int):
        out = await client.infer("div", {"d": np.array([[2 * k]], np.int64), "e": np.array([[3]], np.int64)},
                                 timeout_s=timeout_s)
        return out["out"].tolist()

    async def killer():
        with pytest.raises(Internal) as ei:
            await client.infer("div", POISON, timeout_s=timeout_s)
        return ei.value.message

    for k in range(warm):  # every worker serves
        assert await innocent(k) == [[k]]
    results = await asyncio.gather(*(innocent(k) for k in range(1, 12)), killer(),
                                   *(innocent(k) for k in range(12, 24)), return_exceptions=True)
    return results.pop(11), results


def _sigfpe_deaths(dep, kind: str = "worker") -> int:
    """Exits by SIGFPE of ``dep``'s ``kind`` processes (``worker`` or ``colocated``), from its node's output."""
    import re

    return len(re.findall(kind + r":n1-w\d' \(pid \d+\) exited: killed by signal 8", dep.log.read_text()))


@pytest.fixture
def poisoned_colocated(tmp_path):
    models = models_subset(tmp_path / "models", ["digits"])
    _div_model(models / "div")
    d = start_deployment(tmp_path / "dep", workers=2, prefix="qodc", extra=["--models", str(models), "--colocate"])
    yield d
    d.stop()


async def _div_serves_again(client) -> None:
    """Wait (30 s at most) until ``div`` answers other inputs right again: its workers restarted."""
    deadline = time.monotonic() + 30
    while True:
        try:
            out = await client.infer("div", {"d": np.array([[6]], np.int64), "e": np.array([[3]], np.int64)},
                                     timeout_s=5.0)
            break
        except Exception:
            assert time.monotonic() < deadline
            await anyio.sleep(0.2)
    assert out["out"].tolist() == [[3]]


async def test_a_request_that_kills_its_worker_running_alone_is_answered_at_once_and_then_refused(poisoned):
    """A fresh-user trial: INT64_MIN / -1 kills ONNX Runtime's process (SIGFPE). The ingress answered UNAVAILABLE
    "safe to retry", the SDK retried it on the next worker, and one request killed every worker of the model again
    and again (11 deaths for one request with a 10 s budget; `digits` requests failed meanwhile). Now a request that
    a worker was running alone when a fault signal killed it is answered INTERNAL (not retried) at that first death
    (a later trial: the second death took the model's other worker down too), and the same inputs are refused on
    sight."""

    from inferbus.schemas import Internal

    def deaths() -> int:
        return _sigfpe_deaths(poisoned)

    client = await Client.connect(poisoned.nats_url, "qod")
    try:
        # answered, not the budget waited out
        await _killer_answered(client, deaths, "a worker died (killed by signal 8 (SIGFPE)) running this request to "
                               "div:1 alone", 8, poisoned)
        assert deaths() == 1, poisoned.log.read_text()[-3000:]
        # the same inputs again (another request id, and no cache key: the body's digest), from the SDK and from a
        # raw client with no request id: refused at once, no worker dies (a second trial: with the model's cache
        # off, each new SDK call cost two deaths, and their breakers took every model down)
        with pytest.raises(Internal) as ei:
            await client.infer("div", POISON, timeout_s=10.0)
        assert "is taken to be what kills them" in ei.value.message, ei.value.message
        from inferbus.schemas import InferRequest, encode_request, input_from_numpy

        body = encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in POISON.items()]))
        raw = await client.nc.request("qod.infer.div", body, timeout=5.0)
        assert raw.headers.get("Nats-Service-Error-Code") == "500" and b"what kills them" in raw.data, raw.headers
        # the node serves on: other inputs of the model, other models (the workers restarted)
        await _div_serves_again(client)
        checks = (await client.health(timeout_s=5.0)).parameters["counts"]["crash_checks"]
        assert checks >= 3  # the refused SDK call, the raw copy, the innocent div call
        for v in (0.5, 0.25, 0.75):
            out = await client.infer("digits", {"pixels": np.full((1, 64), v, np.float32)}, timeout_s=5.0)
            assert out["probabilities"].shape == (1, 10)
        assert deaths() == 1, poisoned.log.read_text()[-3000:]
        counts = (await client.health(timeout_s=5.0)).parameters["counts"]
        assert counts["query_of_death"] == 3, counts  # answered at the death, refused twice
        # another model's requests are not looked up in the crash memory (their inputs not digested) while it
        # remembers div's crash
        assert counts["crash_checks"] == checks, counts
    finally:
        await client.close()


async def test_requests_that_shared_the_killers_runs_are_answered_and_only_its_runs_are_counted(poisoned):
    """A fresh-user trial: 3 of 24 innocent requests sent with the killer were refused with it: the ingress counted a
    crash against every request the worker held, and an innocent that shared the killer's batch at both deaths was
    taken for it. Now the node reads what the dying worker's model run held (its flight record) and the ingress
    counts only those; a request counted once runs alone after that (``Inferbus-Alone``), so the second crash is
    the killer's alone. The node's down events say what the run held: at the second death, one request."""
    from inferbus.schemas._internal import ProcessEvent, decode_internal

    client = await Client.connect(poisoned.nats_url, "qod")
    events: list[ProcessEvent] = []

    async def on_event(msg):
        ev = decode_internal(msg.data)
        if isinstance(ev, ProcessEvent) and ev.kind == "down":
            events.append(ev)

    sub = await client.nc.subscribe("qod._events", cb=on_event)
    try:
        qod, results = await _killer_among_innocents(client, 15.0, 3)
        assert "this request to div:1" in str(qod) and "is taken to be what kills them" in str(qod), qod
        assert results == [[[k]] for k in range(1, 24)], [r for r in results if not isinstance(r, list)]
        deadline = time.monotonic() + 5
        while not events:
            assert time.monotonic() < deadline, events
            await anyio.sleep(0.05)
        await anyio.sleep(0.5)
        assert 1 <= len(events) <= 2 and all("signal 8" in e.reason and e.fault for e in events), events
        assert all(ing.startswith("n1-i") for e in events for ing, _ in e.running), events
        # a first run of several makes suspects, each run alone after; the killer dies alone then (or at once)
        assert len(events[-1].running) == 1 and all(len(e.running) > 1 for e in events[:-1]), events
        counts = (await client.health(timeout_s=5.0)).parameters["counts"]
        assert counts["suspects_alone"] >= len(events) - 1, counts
        print(f"deaths {len(events)}, runs held {[len(e.running) for e in events]}")
    finally:
        await sub.unsubscribe()
        await client.close()


async def test_a_raw_client_gets_every_innocent_answered_when_a_killer_takes_their_worker_down(poisoned):
    """A fresh-user trial (2026-12-05): a raw NATS client (no SDK, no retries) sending 23-39 innocent requests with a
    killer got 11-19 of them UNAVAILABLE "safe to retry": the dying worker held them, and the ingress answered
    them so. Now the ingress sends each again to another worker within its budget (``counts.resent_after_death``);
    the raw client gets every innocent's result and the killer's INTERNAL, one answer each. Each request's id is
    the body's ``id`` alone (a plain KServe client): every answer carries it as ``Inferbus-Request-Id``, the
    killer's INTERNAL (made by the ingress) too; before, the ingress's own answers to such a request had none."""
    import nats

    from inferbus.schemas import InferRequest, decode_response, encode_request, input_from_numpy, output_to_numpy

    def body(feeds, rid: str) -> bytes:
        return encode_request(InferRequest(id=rid, inputs=[input_from_numpy(k, v) for k, v in feeds.items()]))

    client = await Client.connect(poisoned.nats_url, "qod")
    nc = await nats.connect(poisoned.nats_url)
    try:
        for k in range(3):  # warm: both workers serve
            out = await client.infer("div", {"d": np.array([[2 * k]], np.int64), "e": np.array([[3]], np.int64)},
                                     timeout_s=10.0)
            assert out["out"].tolist() == [[k]]
        answers: dict[int, list] = {}
        inbox = nc.new_inbox()

        async def on_answer(msg):
            answers.setdefault(int(msg.subject.rsplit(".", 1)[1]), []).append(msg)

        await nc.subscribe(inbox + ".*", cb=on_answer)
        n, killer = 24, 11
        for k in range(n):
            feeds = POISON if k == killer else {"d": np.array([[2 * k]], np.int64), "e": np.array([[3]], np.int64)}
            await nc.publish("qod.infer.div", body(feeds, f"raw-{k}"), reply=f"{inbox}.{k}",
                             headers={"Inferbus-Timeout-Ms": "15000"})
        await nc.flush()
        deadline = time.monotonic() + 20
        while len(answers) < n:
            assert time.monotonic() < deadline, sorted(answers)
            await anyio.sleep(0.05)
        await anyio.sleep(0.5)  # (a second answer to any of them would come meanwhile)
        assert all(len(v) == 1 for v in answers.values()), {k: len(v) for k, v in answers.items() if len(v) != 1}
        ids = {k: (m[0].headers or {}).get("Inferbus-Request-Id") for k, m in answers.items()}
        assert ids == {k: f"raw-{k}" for k in range(n)}, ids
        codes = {k: (m[0].headers or {}).get("Nats-Service-Error-Code") for k, m in answers.items()}
        assert codes.pop(killer) == "500", answers[killer][0].data
        wrong = {k: (c, answers[k][0].data[:200]) for k, c in codes.items() if c is not None}
        assert not wrong, wrong  # every innocent answered with its result, none UNAVAILABLE
        for k in codes:
            out = output_to_numpy(decode_response(answers[k][0].data).outputs[0])
            assert out.tolist() == [[k]], (k, out)
        counts = (await client.health(timeout_s=5.0)).parameters["counts"]
        print(f"raw client, {n - 1} innocents and a killer: resent {counts['resent_after_death']}, "
              f"suspects alone {counts['suspects_alone']}, query_of_death {counts['query_of_death']}")
    finally:
        await nc.close()
        await client.close()


async def test_a_stream_of_different_killers_does_not_make_the_node_give_up(poisoned):
    """A fresh-user trial: six or seven different killer requests (INT64_MIN / -1 beside another row each time), sent
    one after another, made 10 worker restarts in 10 s, and the node's supervisor gave up: ``inferbus up`` stopped,
    embedded NATS and Valkey with it. A crash by a fault signal inside a model run that held requests (the worker's
    flight record) no longer counts against the node's restart intensity: twelve killers, each answered INTERNAL, and
    the node serves on."""
    client = await Client.connect(poisoned.nats_url, "qod")
    try:
        from inferbus.schemas import Internal

        for v in range(12):
            killer = {"d": np.array([[np.iinfo(np.int64).min], [v]], np.int64), "e": np.array([[0], [3]], np.int64)}
            with pytest.raises(Internal) as ei:
                await client.infer("div", killer, timeout_s=15.0)
            assert "is taken to be what kills them" in ei.value.message, (v, ei.value.message)
        assert poisoned.proc.poll() is None, poisoned.log.read_text()[-3000:]
        assert "restarted too often" not in poisoned.log.read_text()
        await _div_serves_again(client)
        deadline = time.monotonic() + 5  # (the last exit's second line can come just after a worker serves again)
        while poisoned.log.read_text().count("not counted against the restart intensity") < 12:
            assert time.monotonic() < deadline, poisoned.log.read_text()[-3000:]
            await anyio.sleep(0.1)
    finally:
        await client.close()


async def test_a_killer_at_colocated_processes_is_refused_by_the_processes_it_did_not_reach(poisoned_colocated):
    """``inferbus up --colocate``: the ingress and the worker are one process, so the crash took the ingress's memory
    with it, and the SDK's retries carried the killer from process to process (a trial: 8 deaths for one 10 s call,
    which ended DEADLINE_EXCEEDED). Now the worker writes the in-process request itself into its flight record, the
    node passes its id and body digest on in the down event, and the other processes' ingresses refuse it: the call
    ends INTERNAL, the killer's words, well within its budget; one process died (two if a retry outran the
    crash's news), not counted against the node's restart intensity; the node serves on, and the restarted process
    refuses the killer too (its new ingress asked a peer for the memory)."""

    dep = poisoned_colocated

    def deaths() -> int:
        return _sigfpe_deaths(dep, "colocated")

    client = await Client.connect(dep.nats_url, "qodc", attempt_timeout_ms=300)
    try:
        for k in range(4):  # both processes serve
            out = await client.infer("div", {"d": np.array([[2 * k]], np.int64), "e": np.array([[3]], np.int64)},
                                     timeout_s=10.0)
            assert out["out"].tolist() == [[k]]
        took_s = await _killer_answered(client, deaths, "running this request to div:1 alone: it is taken to be what "
                                        "kills them", 5, dep)
        await _div_serves_again(client)
        n = deaths()
        assert 1 <= n <= 2, dep.log.read_text()[-3000:]
        # the restarted process's new ingress asked a peer for the memory before it took requests: the same bytes
        # from a raw client, over both processes, are each refused and nothing dies again
        from inferbus.schemas import InferRequest, encode_request, input_from_numpy

        deadline = time.monotonic() + 30
        while len(await ingress_counts(client.nc)) < 2:  # the restarted process serves again
            assert time.monotonic() < deadline, dep.log.read_text()[-3000:]
            await anyio.sleep(0.2)

        body = encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in POISON.items()]))
        # the queue group picks a member at random: 8 at a time until each process has refused some (a CI run's 8
        # all went to one of the two, p = 1/128), 48 at most
        for _ in range(6):
            for _ in range(8):
                raw = await client.nc.request("qodc.infer.div", body, timeout=5.0)
                assert raw.headers.get("Nats-Service-Error-Code") == "500" and b"what kills them" in raw.data, \
                    (raw.headers, raw.data[:300])
            counts = await ingress_counts(client.nc)
            if len(counts) == 2 and all(c["query_of_death"] > 0 for c in counts):
                break
        assert len(counts) == 2 and all(c["query_of_death"] > 0 for c in counts), counts  # both refused some
        assert any(c["deaths_shared_in"] > 0 for c in counts), counts
        assert deaths() == n, dep.log.read_text()[-3000:]
        assert dep.log.read_text().count("not counted against the restart intensity") == n
        assert dep.proc.poll() is None
        out = await client.infer("digits", {"pixels": np.full((1, 64), 0.5, np.float32)}, timeout_s=5.0)
        assert out["probabilities"].shape == (1, 10)
        print(f"colocated killer: {n} process death(s), answered INTERNAL in {took_s:.2f} s")
    finally:
        await client.close()


@pytest.mark.parametrize("attempt_timeout_ms", [300, None])
async def test_a_killer_in_a_burst_at_colocated_processes_is_answered_and_costs_at_most_three_deaths(
        poisoned_colocated, attempt_timeout_ms):
    """A fresh-user trial (2026-12-05): at ``--colocate --workers 2``, a killer sent with 23 innocent requests (SDK)
    first ran in a batch, and ended DEADLINE_EXCEEDED after 10 s with 6 deaths: both processes died, and the process
    restarted next had no peer left that remembered it. Now the node remembers too and counts the in-process requests
    of the crashed process itself; and while a crash of the model is remembered, a colocated ingress sends its
    requests to another process's worker (a crash's suspect above all): the killer ends INTERNAL within its budget.
    With a warm client (attempt timeout 0.3 s) every innocent gets its result; with a cold one (its first attempt
    gets half the 10 s budget, so there is no third) 0 of 23 ran out of their budget in 5 runs of 6 alone, 1-5 with
    other tests beside it (before the sending elsewhere: 2, and 5-6 with other tests)."""
    dep = poisoned_colocated
    client = await Client.connect(dep.nats_url, "qodc", attempt_timeout_ms=attempt_timeout_ms)
    try:
        t0 = time.monotonic()
        qod, results = await _killer_among_innocents(client, 10.0, 4)
        took_s = time.monotonic() - t0
        assert "is taken to be what kills them" in str(qod), qod
        from inferbus.schemas import DeadlineExceeded

        lost = [k for k, r in enumerate(results, 1) if isinstance(r, DeadlineExceeded)]
        assert [r for k, r in enumerate(results, 1) if k not in lost] == [[[k]] for k in range(1, 24) if k not in lost], \
            results  # no wrong answer, no other error
        assert len(lost) <= (0 if attempt_timeout_ms else 11), results
        await _div_serves_again(client)
        n = _sigfpe_deaths(dep, "colocated")
        assert 1 <= n <= 3, dep.log.read_text()[-3000:]
        print(f"colocated burst with a killer (attempt timeout {attempt_timeout_ms} ms): {n} deaths, "
              f"{23 - len(lost)} of 23 innocents answered, in {took_s:.2f} s (4 warm-up calls included)")
    finally:
        await client.close()


async def test_a_lone_colocated_process_learns_the_killer_from_its_node(tmp_path):
    """A fresh-user trial (2026-12-05): ``inferbus up --colocate --workers 1`` has no peer to keep what a crash taught:
    one SDK call with a killer cost 5 deaths in 10 s (every restarted process took its retry afresh) and ended
    DEADLINE_EXCEEDED, the node down meanwhile. The node now keeps the memory too (it outlives its processes): the
    restarted process asks it before taking requests, and refuses the retry. One death; the call ends INTERNAL;
    the same inputs from a raw client with an id in the body only, under a new id, are refused with that id in the
    reply's ``Inferbus-Request-Id``."""
    import msgpack

    models = models_subset(tmp_path / "models", ["digits"])
    _div_model(models / "div")
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="qod1",
                           extra=["--models", str(models), "--colocate"])
    try:
        client = await Client.connect(dep.nats_url, "qod1", attempt_timeout_ms=300)
        try:
            took_s = await _killer_answered(client, lambda: _sigfpe_deaths(dep, "colocated"),
                                            "running this request to div:1 alone", 9.5, dep)
            await _div_serves_again(client)
            inputs = [{"name": k, "datatype": "INT64", "shape": [1, 1], "data": v.ravel().tolist()}
                      for k, v in POISON.items()]
            for k in range(3):
                rid = f"kserve-{k}"
                raw = await client.nc.request("qod1.infer.div", msgpack.packb({"id": rid, "inputs": inputs}),
                                              timeout=5.0)
                assert raw.headers.get("Nats-Service-Error-Code") == "500" and b"what kills them" in raw.data, \
                    (raw.headers, raw.data[:300])
                assert raw.headers.get("Inferbus-Request-Id") == rid, raw.headers
            assert _sigfpe_deaths(dep, "colocated") == 1, dep.log.read_text()[-3000:]
            print(f"lone colocated process: 1 death, the SDK call answered INTERNAL in {took_s:.2f} s")
        finally:
            await client.close()
    finally:
        dep.stop()


async def test_the_ingresses_share_what_a_killer_crash_taught_them(tmp_path):
    """``--ingress 2``: each ingress counted the deaths of its own requests only, so the same killer through the other
    ingress replica started its count afresh (3-4 deaths per killer in a trial). Now an ingress tells its peers what
    a crash changed in its memory (``<p>._deaths``): after the killer's one death, the same bytes sent by a raw client
    (no request id) six times, over both replicas, are each refused at once, and no worker dies again."""

    import nats

    from inferbus.schemas import InferRequest, Internal, encode_request, input_from_numpy

    models = models_subset(tmp_path / "models", ["digits"])
    _div_model(models / "div")
    dep = start_deployment(tmp_path / "dep", workers=2, prefix="qod2", extra=["--models", str(models), "--ingress", "2"])
    try:
        def deaths() -> int:
            return _sigfpe_deaths(dep)

        client = await Client.connect(dep.nats_url, "qod2")
        nc = await nats.connect(dep.nats_url)
        try:
            with pytest.raises(Internal) as ei:
                await client.infer("div", POISON, timeout_s=10.0)
            assert "running this request to div:1 alone" in ei.value.message, ei.value.message
            deadline = time.monotonic() + 5  # the peer has merged the share (a fixed 0.3 s was not always enough)
            while sum(c["deaths_shared_in"] for c in await ingress_counts(nc)) < 1:
                assert time.monotonic() < deadline, await ingress_counts(nc)
                await anyio.sleep(0.05)
            body = encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in POISON.items()]))
            sent = 0
            # at least six, and until both replicas have refused some: the queue group picks at random (all seven to
            # one replica, 1 in 64, failed a clean-clone CI run)
            while sent < 6 or not all(c["query_of_death"] > 0 for c in await ingress_counts(nc)):
                assert sent < 40, await ingress_counts(nc)
                raw = await nc.request("qod2.infer.div", body, timeout=5.0)
                sent += 1
                assert raw.headers.get("Nats-Service-Error-Code") == "500" and b"what kills them" in raw.data, \
                    (raw.headers, raw.data[:300])
            await _div_serves_again(client)
            assert deaths() == 1, dep.log.read_text()[-3000:]
            counts = await ingress_counts(nc)
            assert len(counts) == 2, counts
            assert sum(c["deaths_shared_in"] for c in counts) >= 1, counts
            assert sum(c["query_of_death"] for c in counts) == 1 + sent, counts  # the SDK call's answer, refusals
        finally:
            await nc.close()
            await client.close()
    finally:
        dep.stop()


def test_peers_merge_query_of_death_memories_by_the_most_deaths_and_the_later_expiry():
    """:meth:`Ingress._merge_deaths`: a peer's entry adds what this ingress did not know (a key, more deaths, a
    refusal), never lowers a count or drops a refusal, and an entry past its time here is taken as new."""
    from inferbus.actors import IngressConfig
    from inferbus.actors._ingress import QUERY_OF_DEATH_TTL_S, Ingress
    from inferbus.bus import BusConfig
    from inferbus.schemas._internal import DeathMemory, decode_internal, encode_internal

    from conftest import MODELS

    a, b = (Ingress(IngressConfig(ingress_id=i, bus=BusConfig(prefix="mem"), models_dir=str(MODELS),
                                  models=("digits",))) for i in ("a", "b"))
    body_key = ("body", "digits:1", b"\x01" * 16)
    a._deaths[body_key] = (1, 70.0, "killed by signal 8", None)
    a._deaths[("key", "k1")] = (2, 70.0, "killed by signal 8", "refused: k1")
    a._deaths[("key", "old")] = (1, 5.0, "x", None)  # past its time at 10.0: not shared
    m = decode_internal(encode_internal(DeathMemory("a", a._memory_entries(None, 10.0))))  # as it crosses the bus
    assert [tuple(e[0]) for e in m.entries] == [body_key, ("key", "k1")]
    assert b._merge_deaths(m, 100.0) == 2 and b._deaths_of("digits:1", "k1", b"", 100.0) == (2, "refused: k1")
    assert b._deaths[body_key] == (1, 160.0, "killed by signal 8", None)  # 60 s left, on b's clock
    assert b._merge_deaths(m, 100.0) == 0  # nothing new
    b._deaths[body_key] = (3, 150.0, "later", "refused: body")
    assert b._merge_deaths(m, 101.0) == 0 and b._deaths[body_key] == (3, 150.0, "later", "refused: body")
    big = DeathMemory("a", [(list(body_key), 1, 10 * QUERY_OF_DEATH_TTL_S, "y", None), (["rid"], 0, 5.0, "z", None)])
    b._deaths.clear()
    assert b._merge_deaths(big, 0.0) == 1 and b._deaths[body_key][1] == QUERY_OF_DEATH_TTL_S  # bounded


def test_the_crash_memory_forgets_its_entries_in_time_and_empties():
    """Entries past their time are dropped by each sweep, the oldest first, so that the memory empties once no crash
    is remembered (an entry that no request looked up again stayed for good, and each request's body was hashed
    from the first crash on)."""
    from inferbus.actors import IngressConfig
    from inferbus.actors._ingress import Ingress
    from inferbus.bus import BusConfig

    from conftest import MODELS

    ing = Ingress(IngressConfig(ingress_id="t0", bus=BusConfig(prefix="mem"), models_dir=str(MODELS),
                                models=("digits",)))
    ing._deaths.update({("key", "a"): (1, 10.0, "x", None), ("key", "b"): (2, 20.0, "x", "no"),
                        ("key", "c"): (1, 30.0, "x", None)})
    ing._forget_deaths(15.0)
    assert list(ing._deaths) == [("key", "b"), ("key", "c")]
    assert ing._deaths_of("digits:1", "b", b"", 15.0) == (2, "no")  # a query of death: still refused
    assert ing._deaths_of("digits:1", "c", b"", 15.0) == (1, None)  # 1 death: retried, alone
    ing._forget_deaths(30.0)
    assert not ing._deaths


def test_the_flight_record_says_what_each_slot_runs_and_when_it_does_not_know(tmp_path):
    """The worker's side writes, the node's side reads (:mod:`inferbus.actors._flight`): both slots' pairs, nothing
    once cleared, and None (not known) for a missing file, a file of another size or a run too large for its slot."""
    from inferbus.actors._flight import SLOT_BYTES, THREAD_SLOT, LOOP_SLOT, FlightRecorder, read_flight_record

    path = str(tmp_path / "w.running")
    assert read_flight_record(path) is None
    fr = FlightRecorder(path)
    assert read_flight_record(path) == []
    fr.record(THREAD_SLOT, [("n1-i0", 7), ("n1-i1", 9)])
    fr.record(LOOP_SLOT, [("n1-i0", 8)])
    assert read_flight_record(path) == [("n1-i0", 7), ("n1-i1", 9), ("n1-i0", 8)]
    fr.clear(THREAD_SLOT)
    assert read_flight_record(path) == [("n1-i0", 8)]
    fr.clear(LOOP_SLOT)
    fr.record(THREAD_SLOT, [("x" * 100, k) for k in range(SLOT_BYTES // 100)])  # does not fit: not known
    assert read_flight_record(path) is None
    fr.clear(THREAD_SLOT)
    assert read_flight_record(path) == []
    # a request a colocated ingress handed over in-process: the request itself (that ingress dies with the process)
    fr.record(LOOP_SLOT, (("div:1", "r-1", b"\x81\xa6inputs\x90"),))
    fr.record(THREAD_SLOT, [("n1-i0", 3), ("div:1", "", b"body")])
    assert read_flight_record(path) == [("n1-i0", 3), ("div:1", "", b"body"), ("div:1", "r-1", b"\x81\xa6inputs\x90")]
    fr.clear(THREAD_SLOT)
    fr.clear(LOOP_SLOT)
    fr.note("div:1", "r-2", b"lone")  # the lone in-process request, written alone
    assert read_flight_record(path) == [("div:1", "r-2", b"lone")]
    fr.clear_loop()
    assert read_flight_record(path) == []
    fr.record(THREAD_SLOT, [("n1-i0", "3")])  # an entry of neither shape: not known
    assert read_flight_record(path) is None
    fr.clear(THREAD_SLOT)
    fr.clear(LOOP_SLOT)
    fr.close()
    (tmp_path / "short").write_bytes(b"\0" * 10)
    assert read_flight_record(str(tmp_path / "short")) is None


def test_a_crash_counts_against_the_running_requests_only_and_spares_the_breaker_for_a_query_of_death():
    """:meth:`Ingress._note_deaths` with the node's list of what the dying run held: the queued request at the same
    worker and the other ingress's are not counted; the running one is, and when its second crash makes it a query of
    death the worker's breaker is not charged. With no list, every request the worker held is counted (as before)."""
    from inferbus.actors import IngressConfig
    from inferbus.actors._ingress import Ingress, Pending
    from inferbus.bus import BusConfig

    from conftest import MODELS

    ing = Ingress(IngressConfig(ingress_id="t0", bus=BusConfig(prefix="mem"), models_dir=str(MODELS),
                                models=("digits",)))

    def pend(seq: int, rid: str, worker: str = "w0") -> None:
        ing.pending[seq] = Pending(worker, "_INBOX.x", 99.0, 0.0, None, 0, None, rid, "digits:1", body=rid.encode())

    pend(1, "killer"), pend(2, "queued"), pend(3, "elsewhere", "w1"), pend(4, "killer")  # 4: a retry it joined
    poison, charge = ing._note_deaths("w0", "killed by signal 8", 10.0, [("t0", 1), ("t0", 4), ("other-ingress", 1)])
    assert poison == {} and charge  # one crash, counted once for both copies
    del ing.pending[4]
    assert ing._deaths_of("digits:1", None, b"killer", 10.0)[0] == 1
    assert ing._deaths_of("digits:1", None, b"queued", 10.0) is None
    poison, charge = ing._note_deaths("w0", "killed by signal 8", 11.0, [("t0", 1)])
    assert list(poison) == [1] and not charge  # the request is at fault, not the worker
    poison, charge = ing._note_deaths("w0", "killed by signal 9", 12.0, [])  # killed between runs: nobody's fault
    assert poison == {} and charge and ing._deaths_of("digits:1", None, b"queued", 12.0) is None
    poison, charge = ing._note_deaths("w0", "killed by signal 9", 13.0, None)  # no record: all it held
    assert charge and ing._deaths_of("digits:1", None, b"queued", 13.0) == (1, None)
    assert ing._deaths_of("digits:1", None, b"elsewhere", 13.0) is None
    # a fault signal (SIGFPE) in a run that held one request: that request, at this first death
    poison, charge = ing._note_deaths("w1", "killed by signal 8 (SIGFPE)", 14.0, [("t0", 3)], fault=True)
    assert list(poison) == [3] and not charge and "running this request to digits:1 alone" in poison[3].message
    assert ing._deaths_of("digits:1", None, b"elsewhere", 14.0)[1] is not None
    pend(5, "other")  # a SIGKILL (the OOM killer, an operator) in such a run: one death, retried
    poison, charge = ing._note_deaths("w0", "killed by signal 9 (SIGKILL)", 15.0, [("t0", 5)], fault=False)
    assert poison == {} and charge and ing._deaths_of("digits:1", None, b"other", 15.0) == (1, None)
    # a colocated process's crash: the requests its own (dead) ingress handed over in-process, by request id and
    # body digest; this ingress held none of them, but remembers them for their retries
    from inferbus.actors._crashes import request_digest
    from inferbus.schemas import InferRequest, encode_request, input_from_numpy

    def body(rid: str | None, v: float) -> bytes:
        return encode_request(InferRequest(id=rid, inputs=[input_from_numpy("pixels", np.full((1, 64), v, np.float32))]))

    poison, charge = ing._note_deaths("w2", "killed by signal 8 (SIGFPE)", 16.0, [], fault=True,
                                      running_local=[("digits:1", "", request_digest(b"alone"))])
    assert poison == {} and ing.counts["crash_suspects_heard"] == 1
    assert "running this request to digits:1 alone" in ing._deaths_of("digits:1", None, b"alone", 16.0)[1]
    poison, charge = ing._note_deaths("w2", "killed by signal 8 (SIGFPE)", 17.0, [], fault=True, running_local=[
        ("digits:1", "a", request_digest(body("a", 0.25))), ("digits:1", "b", request_digest(body("b", 0.5)))])
    assert ing._deaths_of("digits:1", None, body("b", 0.5), 17.0) == (1, None)  # a suspect, by its inputs
    assert ing._deaths_of("digits:1", None, body("another id", 0.25), 17.0) == (1, None)  # whatever its body's id
    assert ing._deaths_of("digits:1", None, body("a", 0.75), 17.0) is None  # the id alone is no key: other inputs
    poison, charge = ing._note_deaths("w2", "killed by signal 8 (SIGFPE)", 18.0, [], fault=False, running_local=[
        ("digits:1", "a", request_digest(body(None, 0.25))), ("digits:1", "c", request_digest(b"c"))])
    assert ing._deaths_of("digits:1", None, body("a", 0.25), 18.0)[0] == 2  # its second crash: refused
    assert ing._deaths_of("digits:1", None, body("a", 0.25), 18.0)[1] is not None
