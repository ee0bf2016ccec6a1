"""A hung ingress (SIGSTOP: its process alive, its socket open) among two, against the embedded nats-server.

Seen by a fresh-user trial: with NATS's default server PINGs (every 2 minutes), the stopped ingress stayed in the
queue group and took half of the requests for as long as it was stopped; the SDK's retries landed on it again half
of the time, and ~10 % of requests failed for the whole hang. The embedded server now PINGs a silent connection
every second and closes it after two unanswered PINGs, so the queue group stops handing the hung ingress requests
within seconds, and it comes back by itself (nats-py reconnects) when the process resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import nats
import numpy as np
import pytest

from inferbus.client import Client
from inferbus.schemas import (
    DeadlineExceeded, InferRequest, InvalidArgument, NotFound, Unavailable, decode_error, decode_response,
    encode_request, input_from_numpy, output_to_numpy,
)

from conftest import start_deployment
from conftest import uvloop_backend as anyio_backend  # noqa: F401 (process-heavy tests: one loop)
from test_reliability_lib import models_subset

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    root = tmp_path_factory.mktemp("hang")
    models = models_subset(root / "models", ["typed"])
    d = start_deployment(root / "dep", workers=1, prefix="hng", extra=["--models", str(models), "--no-cache",
                                                                        "--ingress", "2"])
    yield d
    d.stop()


def typed(i: int) -> dict:
    return {"a": np.array([[i]], np.int32), "b": np.ones((1, 4), np.float16)}


async def ingress_pids(client: Client, n: int = 2, timeout_s: float = 15.0) -> set[int]:
    """The pids of the ingresses answering health (the queue group picks one per request)."""
    pids: set[int] = set()
    t0 = time.monotonic()
    while len(pids) < n:
        assert time.monotonic() - t0 < timeout_s, f"only ingresses {pids} answered"
        try:
            pids.add((await client.health(timeout_s=0.5)).parameters["pid"])
        except (DeadlineExceeded, Unavailable):
            pass
    return pids


async def test_a_hung_ingress_stops_taking_requests_within_seconds_and_serves_again_when_resumed(dep):
    client = await Client.connect(dep.nats_url, "hng", adaptive_attempt_timeout=False)
    victim = None
    try:
        victim = sorted(await ingress_pids(client))[0]
        os.kill(victim, signal.SIGSTOP)
        t0 = time.monotonic()
        streak, failed, i = 0, 0, 0
        while streak < 40:  # 40 answered in a row, each within 0.3 s: none of them went to the hung one
            assert time.monotonic() - t0 < 20, f"the hung ingress still takes requests ({failed} failed)"
            i += 1
            try:
                out = await client.infer("typed", typed(i), timeout_s=0.3)
                assert out["a_times_2"][0, 0] == 2 * i
                streak += 1
            except (DeadlineExceeded, Unavailable):
                streak, failed = 0, failed + 1
        cut_s = time.monotonic() - t0
        print(f"hung ingress out of the queue group after {cut_s:.1f} s ({failed} of {i} requests failed)")
        assert cut_s < 12, cut_s
        for j in range(100):  # and it stays out while hung
            out = await client.infer("typed", typed(1000 + j), timeout_s=1.0)
            assert out["a_times_2"][0, 0] == 2 * (1000 + j)
    finally:
        if victim is not None:
            os.kill(victim, signal.SIGCONT)
    assert victim in await ingress_pids(client, 2, timeout_s=20)  # resumed: it reconnected and answers again
    await client.close()


async def all_ingress_ids(nc, prefix: str, wait_s: float = 0.5) -> set[str]:
    """Every answer to ``<p>.ingresses`` within ``wait_s`` (each serving ingress answers its id)."""
    inbox = nc.new_inbox()
    ids: set[str] = set()

    async def got(msg):
        ids.add(msg.data.decode())

    sub = await nc.subscribe(inbox, cb=got)
    await nc.publish(f"{prefix}.ingresses", b"", reply=inbox)
    await asyncio.sleep(wait_s)
    await sub.unsubscribe()
    return ids


async def test_health_of_one_ingress_by_its_id_from_the_sdk_and_the_cli(dep):
    """``Client.health(ingress=ID)`` and ``inferbus health --ingress ID`` ask that ingress alone (a fresh-user trial:
    with two nodes on one NATS, ``inferbus health`` flipped between the nodes' views, and no option picked one); an
    id no ingress has is UNAVAILABLE within the budget, exit 1, naming it; one that is no subject token is refused
    before sending."""
    client = await Client.connect(dep.nats_url, "hng")
    try:
        await ingress_pids(client)
        ids = sorted(await all_ingress_ids(client.nc, "hng"))
        assert len(ids) == 2, ids
        for iid in ids:
            for _ in range(4):  # the queue group would pick either; the subject picks this one each time
                h = await client.health(timeout_s=2.0, ingress=iid)
                assert h.parameters["ingress_id"] == iid, (iid, h.parameters["ingress_id"])
            p = subprocess.run([sys.executable, "-m", "inferbus.cli", "health", "--nats-url", dep.nats_url, "--prefix",
                                "hng", "--ingress", iid, "--timeout-s", "5"], capture_output=True, text=True,
                               timeout=60)
            assert p.returncode == 0 and json.loads(p.stdout)["parameters"]["ingress_id"] == iid, p
        assert await client.ingress_ids() == ids
        # it said "no ingress is serving" while two were (a fresh-user trial); and it retried the bus's "no responders"
        # for the whole budget (17 attempts in 1 s): a known answer now, one attempt, whatever the budget
        with pytest.raises(Unavailable) as ei:
            await client.health(timeout_s=30.0, ingress="nosuch")
        assert ei.value.field == "ingress" and ei.value.message == (
            f"no responders on hng.ingresses.nosuch.health: no ingress with id 'nosuch' is serving; the ingresses "
            f"that answer under prefix 'hng': {', '.join(ids)}"), ei.value.message
        with pytest.raises(InvalidArgument) as ei:
            await client.health(ingress="a.b")
        assert ei.value.field == "ingress"
        p = subprocess.run([sys.executable, "-m", "inferbus.cli", "health", "--nats-url", dep.nats_url, "--prefix", "hng",
                            "--ingress", "nosuch", "--timeout-s", "30"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and p.stderr == (
            f"UNAVAILABLE: ingress 'nosuch': no responders on hng.ingresses.nosuch.health: no ingress with id 'nosuch' "
            f"is serving; the ingresses that answer under prefix 'hng': {', '.join(ids)}\n"), p
    finally:
        await client.close()


async def test_each_ingress_answers_its_id_and_serves_a_request_sent_to_it_alone(dep):
    client = await Client.connect(dep.nats_url, "hng")
    try:
        await ingress_pids(client)  # both serve (the other test of this module resumed its victim)
        ids = await all_ingress_ids(client.nc, "hng")
        assert len(ids) == 2, ids
        for iid in sorted(ids):
            for i in range(3):
                body = encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in typed(i).items()]))
                msg = await client.nc.request(f"hng.ingresses.{iid}.infer.typed", body, timeout=2.0)
                assert decode_error(msg.headers, msg.data) is None
                out = {t.name: output_to_numpy(t) for t in decode_response(msg.data, None).outputs}
                assert out["a_times_2"][0, 0] == 2 * i
            # the same typed errors as on <p>.infer: an unknown model, a version that is not a number
            msg = await client.nc.request(f"hng.ingresses.{iid}.infer.nosuch", body, timeout=2.0)
            assert isinstance(decode_error(msg.headers, msg.data), NotFound)
            msg = await client.nc.request(f"hng.ingresses.{iid}.infer.typed.x", body, timeout=2.0)
            err = decode_error(msg.headers, msg.data)
            assert isinstance(err, InvalidArgument) and err.field == "model_version", err
            # no model named: INVALID_ARGUMENT saying where to send it, as <p>.infer does (was "no responders")
            msg = await client.nc.request(f"hng.ingresses.{iid}.infer", body, timeout=2.0)
            err = decode_error(msg.headers, msg.data)
            assert isinstance(err, InvalidArgument) and err.field == "model", err
            assert f"hng.ingresses.{iid}.infer.<model>[.<version>]" in err.message, err.message
        with pytest.raises(nats.errors.NoRespondersError):  # no ingress of that id
            await client.nc.request("hng.ingresses.nosuch.infer.typed", body, timeout=2.0)
        # counted in $SRV.STATS on an endpoint of their own (the trial: errors counted on infer, requests nowhere)
        inbox, stats = client.nc.new_inbox(), []

        async def got(msg):
            stats.append(json.loads(msg.data))

        sub = await client.nc.subscribe(inbox, cb=got)
        await client.nc.publish("$SRV.STATS.inferbus-ingress", b"", reply=inbox)
        await asyncio.sleep(0.5)
        await sub.unsubscribe()
        at = {st["metadata"]["ingress_id"]: next(e for e in st["endpoints"] if e["name"] == "infer_at")
              for st in stats if st.get("metadata", {}).get("ingress_id") in ids}
        assert set(at) == ids, stats
        assert all(e["num_requests"] >= 5 and e["num_errors"] >= 2 for e in at.values()), at
    finally:
        await client.close()


async def test_a_retry_after_an_attempt_timeout_goes_to_an_ingress_that_answers_not_back_to_the_hung_one(dep):
    """One of 2 ingresses SIGSTOPped; 80 requests at once, each with a 1.5 s budget and 150 ms attempts, before
    the server drops the hung one (4-6 s): the ones the queue group hands it time out their attempt, and their
    retries go to the ingress that answered the probe. Through the queue group, a request's 4 attempts all landed
    on the hung one 1 time in 16 (about 5 of 80 failed)."""
    client = await Client.connect(dep.nats_url, "hng", attempt_timeout_ms=150)
    victim = None
    try:
        victim = sorted(await ingress_pids(client))[0]
        await client.infer("typed", typed(0), timeout_s=2.0)
        os.kill(victim, signal.SIGSTOP)
        t0 = time.monotonic()
        outs = await asyncio.gather(*(client.infer("typed", typed(i), timeout_s=1.5) for i in range(80)),
                                    return_exceptions=True)
        took_s = time.monotonic() - t0
        failed = [(i, o) for i, o in enumerate(outs) if isinstance(o, BaseException)]
        assert not failed, f"{len(failed)} of 80 failed, e.g. {failed[:3]}"
        assert all(o["a_times_2"][0, 0] == 2 * i for i, o in enumerate(outs))
        assert took_s < 4.0, took_s  # (all within the window in which the queue group still hands it requests)
        assert client.attempt_timeouts > 0  # the queue group handed some to the hung ingress
        # (each timed-out attempt asked the probe; on a loaded box an answer may miss its 100 ms, and that retry goes
        # through the queue group)
        assert 0 < client.retries_at_ingress <= client.attempt_timeouts, (client.retries_at_ingress,
                                                                          client.attempt_timeouts)
    finally:
        if victim is not None:
            os.kill(victim, signal.SIGCONT)
    await ingress_pids(client, 2, timeout_s=20)
    await client.close()


async def test_an_ingress_stopped_with_requests_waiting_on_its_own_subject_answers_every_one(dep):
    """A fresh-user trial: 3,000 requests sent to ``<p>.ingresses.<id>.infer.digits`` and a SIGTERM to that ingress
    0.1-0.3 s later: 2,988 got no reply at all (the stop unsubscribed that subscription and dropped its backlog),
    where the same flood on ``<p>.infer.digits`` was answered whole (drained, then refused UNAVAILABLE). The stop now
    drains and refuses both alike: each of 600 requests gets a reply, the result or UNAVAILABLE."""
    client = await Client.connect(dep.nats_url, "hng")
    nc = client.nc
    try:
        await ingress_pids(client)
        ids = await all_ingress_ids(nc, "hng")
        victim_id = sorted(ids)[0]
        pid = None
        for _ in range(50):  # the pid of that ingress: health answers name both (the queue group picks one)
            h = await client.health(timeout_s=1.0)
            if h.parameters.get("ingress_id") == victim_id:
                pid = h.parameters["pid"]
                break
        assert pid is not None, "health never came from " + victim_id
        inbox = nc.new_inbox()
        replies: dict[str, object] = {}

        async def got(msg):
            replies[msg.subject] = decode_error(msg.headers, msg.data) or "ok"

        sub = await nc.subscribe(inbox + ".*", cb=got)
        n = 600
        for i in range(n):
            body = encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in typed(i).items()]))
            await nc.publish(f"hng.ingresses.{victim_id}.infer.typed", body, reply=f"{inbox}.{i}",
                             headers={"Inferbus-Timeout-Ms": "8000"})
        await nc.flush()
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while len(replies) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await sub.unsubscribe()
        kinds = {}
        for r in replies.values():
            k = r if r == "ok" else type(r).__name__
            kinds[k] = kinds.get(k, 0) + 1
        assert len(replies) == n, f"{n - len(replies)} of {n} got no reply; replies: {kinds}"
        assert set(kinds) <= {"ok", "Unavailable"}, kinds
    finally:
        await ingress_pids(client, 2, timeout_s=30)  # (the node restarted it)
        await client.close()


async def test_reads_retried_after_an_attempt_timeout_go_to_an_ingress_that_answers_too(dep):
    """A fresh-user trial: with one of 2 ingresses SIGSTOPped, inference retries went to the ingress that answered the
    probe (0 of 120 failed) while the reads still retried through the queue group: ``health()`` 6 of 40,
    ``model_ready()`` 12 of 40, ``models()`` 9 of 40 failed with 1 s budgets. Now they are sent to one ingress too."""
    client = await Client.connect(dep.nats_url, "hng", attempt_timeout_ms=150)
    victim = None
    try:
        victim = sorted(await ingress_pids(client))[0]
        os.kill(victim, signal.SIGSTOP)
        t0 = time.monotonic()
        calls = []
        for _ in range(20):
            calls += [client.health(timeout_s=1.5), client.model_ready("typed", timeout_s=1.5),
                      client.models(timeout_s=1.5), client.model("typed", timeout_s=1.5),
                      client.server_metadata(timeout_s=1.5)]
        outs = await asyncio.gather(*calls, return_exceptions=True)
        took_s = time.monotonic() - t0
        failed = [o for o in outs if isinstance(o, BaseException)]
        assert not failed, f"{len(failed)} of {len(outs)} failed, e.g. {failed[:3]}"
        assert took_s < 4.0, took_s
        assert client.attempt_timeouts > 0 and 0 < client.retries_at_ingress <= client.attempt_timeouts
    finally:
        if victim is not None:
            os.kill(victim, signal.SIGCONT)
    await ingress_pids(client, 2, timeout_s=20)
    await client.close()


@pytest.mark.parametrize("layout", [["--ingress", "2"], ["--colocate"]], ids=["ingresses", "colocated"])
async def test_a_frozen_ingress_does_not_run_the_attempts_its_clients_gave_up_on(tmp_path, layout):
    """A fresh-user trial (2026-12-06): one of two ingresses SIGSTOPped for 1-2 s under SDK load (100 requests/s, a
    5 s budget, two workers, the audit on): 19-69 requests ran on both workers. The SDK's attempt timed out (about
    0.25 s) and its retry went to the other ingress, which ran it; the thawed ingress then read the first copies
    waiting in its socket and ran them too. The SDK now says when it stops waiting for an attempt
    (``Inferbus-Attempt-Deadline-Unix-Ms``), and an ingress does not run an attempt past it: its retry is
    elsewhere; one taken within the clock-skew allowance of that deadline asks the peers where its retry went, as
    a retry does. Every answer is right and none is lost; a few duplicates are allowed, at the edge of the thaw. The same with two colocated processes (``--colocate``), one of them frozen
    (its ingress and its worker): the trial found 64-72 run twice."""
    import msgspec
    from collections import defaultdict

    models = models_subset(tmp_path / "models", ["typed"])
    dep2 = await asyncio.to_thread(start_deployment, tmp_path / "dep", workers=2, prefix="frz",
                                   extra=["--models", str(models), "--no-cache", *layout, "--audit"])
    victim = None
    try:
        client = await Client.connect(dep2.nats_url, "frz")
        ran_on: dict[str, list[str]] = defaultdict(list)

        async def on_audit(msg):
            for rid in msgspec.msgpack.decode(msg.data):
                ran_on[rid].append((msg.headers or {}).get("Inferbus-Worker-Id", "?"))

        await client.nc.subscribe("frz._audit", cb=on_audit)
        await client.nc.flush()
        pids = await ingress_pids(client)
        for i in range(40):  # the adaptive attempt timeout (RFC 6298) needs 16 answers; before them it is half the budget
            await client.infer("typed", typed(i), timeout_s=5.0)
        wrong, failed = [], []

        async def one(i: int) -> None:
            try:
                out = await client.infer("typed", typed(i), timeout_s=5.0, request_id=f"frz-{i}")
                if out["a_times_2"][0, 0] != 2 * i:
                    wrong.append(i)
            except Exception as exc:  # noqa: BLE001 - counted, the assertion names them
                failed.append((i, repr(exc)))

        victim = sorted(pids)[0]
        tasks = []
        t0 = time.monotonic()
        for i in range(400):  # 100 requests/s for 4 s; the freeze from 1.0 s to 2.5 s
            await asyncio.sleep(max(0.0, t0 + i * 0.01 - time.monotonic()))
            if i == 100:
                os.kill(victim, signal.SIGSTOP)
            if i == 250:
                os.kill(victim, signal.SIGCONT)
                victim = None
            tasks.append(asyncio.create_task(one(1000 + i)))
        await asyncio.gather(*tasks)
        await asyncio.sleep(1.0)  # the last audit batches
        dups = {rid: ws for rid, ws in ran_on.items() if rid.startswith("frz-") and len(ws) > 1}
        print(f"\nfrozen ingress: {len(tasks)} requests, {len(failed)} failed, {len(wrong)} wrong, "
              f"{len(dups)} ran twice: {dict(list(dups.items())[:5])}")
        assert not wrong and not failed, (wrong, failed[:5])
        assert sum(1 for i in range(400) if f"frz-{1000 + i}" in ran_on) == 400  # every one ran (audited)
        # (before: 36 in this test. Left: a request whose attempt was still live at the thaw, taken by the thawed
        # ingress and answered after its client's retry had gone elsewhere while that ingress was too busy draining to
        # answer its peers' query; 0-2 in runs on the 2-core box)
        assert len(dups) <= 5, dups
        await client.close()
    finally:
        if victim is not None:
            os.kill(victim, signal.SIGCONT)
        await asyncio.to_thread(dep2.stop)


# ------------------------------------------------------------------ model-management writes at a hung ingress


@contextlib.asynccontextmanager
async def frozen(client: Client, n: int):
    """The first ``n`` of the 2 ingresses (by pid) SIGSTOPped for the block, which gets their pids; then resumed,
    and the block's exit waits until both answer again (the next test needs them)."""
    victims = sorted(await ingress_pids(client))[:n]
    for pid in victims:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield victims
    finally:
        for pid in victims:
            os.kill(pid, signal.SIGCONT)
    await ingress_pids(client, 2, timeout_s=20)


async def test_a_model_write_with_one_of_two_ingresses_hung_is_answered_at_once_by_the_live_one(dep):
    """A fresh-user trial: ``inferbus models default`` with one of 2 ingresses SIGSTOPped took half its budget (3.5 s
    of a 6 s one) whenever the queue group handed the write to the hung one: its first attempt's timeout, then the
    retry at the ingress that answered the probe. A write now asks ``<p>.ingresses`` first and goes to the ingress
    that answers: 8 writes (6 s budgets) within the window in which the queue group still hands the hung one requests
    (4-6 s) are each answered within 1 s, and so is the CLI's (its start-up aside). Through the queue group all 8
    avoided the hung one 1 time in 256."""
    from inferbus.model_admin import model_control

    client = await Client.connect(dep.nats_url, "hng")
    async with frozen(client, 1):
        took = []
        for _ in range(8):
            t0 = time.monotonic()
            reply = await model_control(client, "default", "typed", "1", timeout_s=6.0)
            took.append(time.monotonic() - t0)
            assert reply.default_version == "1"
        assert max(took) < 1.0, took
        t0 = time.monotonic()
        cli = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "inferbus.cli", "models", "default", "typed", "1", "--timeout-s",
                             "6", "--nats-url", dep.nats_url, "--prefix", "hng"],
            capture_output=True, text=True, timeout=30)
        cli_s = time.monotonic() - t0
        assert cli.returncode == 0 and "default typed version 1" in cli.stdout, cli
        assert cli_s < 3.0, (cli_s, cli.stdout)  # (half the budget is 3 s; a start-up of the CLI is ~0.5-1 s)
    await client.close()


async def test_a_model_write_with_every_ingress_hung_names_each_one(dep):
    """Both ingresses SIGSTOPped: nothing can answer, so the write takes its budget (1.5 s), and its error names
    each ingress that its node lists but that did not answer the roll call, with its pid (it said only "no answer
    within 1500 ms (2 attempts: 2 timed out ...)")."""
    from inferbus.model_admin import model_control

    client = await Client.connect(dep.nats_url, "hng")
    async with frozen(client, 2) as victims:
        t0 = time.monotonic()
        with pytest.raises((DeadlineExceeded, Unavailable)) as ei:  # (Unavailable: the server dropped both first)
            await model_control(client, "default", "typed", "1", timeout_s=1.5)
        took_s = time.monotonic() - t0
        msg = ei.value.message
        assert all(f"(pid {pid}, node " in msg for pid in victims), msg
        assert "did not answer hng.ingresses: hung" in msg, msg
        assert 1.4 < took_s < 2.5 or isinstance(ei.value, Unavailable), (took_s, msg)
    await client.close()


async def test_a_write_sent_to_an_ingress_that_is_gone_or_silent_fails_over_to_a_live_one(dep):
    """The failover a write keeps, with the ingress it was sent to (``at_ingress``, the roll call's first answer)
    played by the test on the real server: one nobody subscribes any more ("no responders": gone between the roll
    call and the write) is replaced by the queue group at once, even by the model-management client that retries no
    UNAVAILABLE; one that takes the write and never answers (a process that died holding it) costs the first
    attempt's timeout, half the budget, then the retry goes to the ingress that answers ``<p>.ingresses``. And with
    no ingress at all on a prefix the write is UNAVAILABLE at once."""
    from inferbus.bus import Subjects
    from inferbus.model_admin import model_control
    from inferbus.schemas import ModelControlReply, ModelControlRequest, decode, encode

    client = await Client.connect(dep.nats_url, "hng")
    try:
        await ingress_pids(client)
        strict = Client(client.nc, "hng", retry_unavailable=False)
        subject = Subjects("hng").model_control("typed", "default")
        body = encode(ModelControlRequest(version="1"))
        t0 = time.monotonic()
        resp, ct = await strict.request(subject, body, timeout_s=4.0, at_ingress="ghost")
        assert decode(resp, ModelControlReply, ct).default_version == "1"
        assert time.monotonic() - t0 < 1.0
        held = await client.nc.subscribe(Subjects("hng").at_ingress(subject, "zombie"))  # takes it, answers never
        t0 = time.monotonic()
        resp, ct = await strict.request(subject, body, timeout_s=2.0, at_ingress="zombie")
        took_s = time.monotonic() - t0
        assert decode(resp, ModelControlReply, ct).default_version == "1"
        assert 0.9 < took_s < 1.6, took_s  # the attempt timeout (1 s), then a live ingress at once
        assert (await held.next_msg(timeout=1)).subject.startswith("hng.ingresses.zombie.")
        await held.unsubscribe()
        t0 = time.monotonic()
        with pytest.raises(Unavailable, match="no ingress is serving"):
            await model_control(Client(client.nc, "nobody"), "default", "typed", "1", timeout_s=6.0)
        assert time.monotonic() - t0 < 1.0
    finally:
        await client.close()
