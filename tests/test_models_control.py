"""Model management at run time (docs/models.md): load, unload and default model versions on a running
deployment, through the CLI and through NATS; writes gated by region role; the model-swap drill, short.

Real processes only: ``inferbus up`` (embedded nats-server + Valkey, 2 workers, 2 ingress replicas, so a
write taken by one ingress must reach the other through the broadcast serving state).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import msgspec
import numpy as np
import pytest

from chaos.load import Driver
from chaos.node_drills import DrillOptions, model_swap
from conftest import MODELS, ROOT, start_deployment, two_nodes
from conftest import uvloop_backend as anyio_backend  # noqa: F401 (process-heavy tests: one loop)
from test_reliability_lib import digits_version_refs, reference
from inferbus.actors import Node, NodeConfig
from inferbus.bus import Subjects
from inferbus.client import Client
from inferbus.model_admin import model_control
from inferbus.schemas import DeadlineExceeded, Internal, InvalidArgument, NotFound, Unavailable, decode_error
from inferbus.schemas._region import PRIMARY, STANDBY, RegionHeartbeat, encode_region

pytestmark = [pytest.mark.anyio]

PREFIX = "mm"
mp = msgspec.msgpack.encode


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    d = start_deployment(tmp_path_factory.mktemp("models-control"), workers=2, prefix=PREFIX,
                         extra=["--ingress", "2", "--no-cache"])
    yield d
    d.stop()


def cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "inferbus.cli", "models", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def refs():
    return digits_version_refs()


def _check(res, i, refs) -> None:
    inputs, by_version = refs
    want = by_version[res.model_version][i]
    np.testing.assert_allclose(res.outputs["logits"], want["logits"], rtol=1e-4, atol=1e-5)


async def _wait_default(client, version: str, refs, timeout_s: float = 10.0) -> None:
    """Until both ingress replicas answer unversioned requests from ``version`` (the broadcast arrived)."""
    inputs, _ = refs
    deadline = time.monotonic() + timeout_s
    seen = 0
    while seen < 8:  # 8 answers in a row from the new default: both queue-group members have it
        assert time.monotonic() < deadline, f"default {version} not served everywhere within {timeout_s}s"
        res = await client.infer_result("digits", inputs[0], timeout_s=2.0)
        seen = seen + 1 if res.model_version == version else 0


def test_cli_load_unload_default(dep, refs):
    url = ["--nats-url", dep.nats_url, "--prefix", PREFIX]
    # the group's options given before the subcommand reach it (the write lands on this deployment)
    p = cli(*url, "default", "digits", "2")
    assert p.returncode == 0, p.stderr
    assert "default 2" in p.stdout and "revision" in p.stdout  # answered by this deployment (port, prefix mm)
    p = cli("unload", "digits", "1", *url, "--json")  # the version as the second argument, as `default` takes it
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    # the same keys whether or not the write changed anything (the wire omits defaults; the CLI does not)
    assert set(r) == {"model", "op", "versions", "default_version", "revision", "version", "workers", "elapsed_ms",
                      "changed"} and r["changed"] is True, r
    assert r["versions"] == ["2"] and r["default_version"] == "2"
    assert sorted(r["workers"]) == ["n1-w0", "n1-w1"] and set(r["workers"].values()) == {"drained"}
    # `inferbus bench` against the running deployment measures the served default (2), not the one on disk (1)
    bench = [sys.executable, "-m", "inferbus.cli", "bench", "digits", *url, "--concurrency", "2", "--duration", "0.5",
             "--json"]
    b = subprocess.run(bench, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    steps = json.loads(b.stdout)
    assert steps and all(r["ok"] > 0 and not r["errors"] and r["wrong"] == 0 for r in steps), steps
    # an unloaded version: refused before any step (it ran every step, each request NOT_FOUND, then exit 1)
    b = subprocess.run(bench + ["--version", "1"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert b.returncode == 2 and "Traceback" not in b.stderr, b.stdout[-2000:] + b.stderr
    err = json.loads(b.stdout)["error"]  # (--json: the wire's error object)
    assert err["code"] == "NOT_FOUND" and "no version '1'" in err["message"], err
    p = cli(*url)  # the listing shows what is served now
    assert p.returncode == 0, p.stderr
    row = next(line for line in p.stdout.splitlines() if " digits " in f" {line} ")
    assert " 2 " in row and "1,2" not in row
    p = cli("unload", "digits", "--version", "7", *url)  # not served (unloading the last version, 2, would
    assert p.returncode == 2 and "NOT_FOUND" in p.stderr and "Traceback" not in p.stderr  # withdraw digits)
    p = cli("load", "nosuchmodel", *url)
    assert p.returncode == 2 and "NOT_FOUND" in p.stderr
    p = cli("load", "digits", "01", *url)  # as the SDK says of a version with a leading zero (a fresh-user trial)
    assert p.returncode == 2 and "INVALID_ARGUMENT" in p.stderr and "leading zero: write it '1'" in p.stderr, p.stderr
    # with --json a refused write is the wire's error object on stdout (a script parses every outcome)
    p = cli("unload", "digits", "--version", "02", *url, "--json")
    err = json.loads(p.stdout)["error"]
    assert p.returncode == 2 and err["code"] == "INVALID_ARGUMENT" and "leading zero" in err["message"], p.stdout
    p = cli("unload", "nosuchmodel", "--version", "01", *url)  # the model first: no version of it is right
    assert p.returncode == 2 and "NOT_FOUND" in p.stderr and "nosuchmodel" in p.stderr, p.stderr
    p = cli("load", "nosuchmodel", *url, "--json")
    assert p.returncode == 2 and json.loads(p.stdout)["error"]["code"] == "NOT_FOUND", p.stdout
    p = cli("load", "digits", "--nats-url", "nats://127.0.0.1:1", "--json")  # nothing listens on port 1
    assert p.returncode == 3 and json.loads(p.stdout)["error"]["code"] == "UNAVAILABLE", (p.stdout, p.stderr)
    assert "cannot reach NATS" in p.stderr
    p = cli("load", "digits", "--version", "1", *url, "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["versions"] == ["1", "2"] and set(r["workers"].values()) == {"loaded"}, r
    p = cli("default", "digits", "1", *url)
    assert p.returncode == 0, p.stderr
    p = cli("default", "digits", "--version", "1", *url)  # idempotent; --version, as `load` and `unload` take it
    assert p.returncode == 0 and "nothing to do" in p.stdout
    p = cli("default", "digits", "1", *url, "--json")
    r = json.loads(p.stdout)
    assert p.returncode == 0 and r["changed"] is False and r["workers"] == {} and "elapsed_ms" in r, r


def test_bench_on_a_model_whose_local_config_is_broken_is_one_error_line(dep, tmp_path):
    """``bench`` reads the model's inputs from its own ``--models``: a config there that is not JSON was a traceback,
    exit 1 (a fresh-user trial), while the deployment served the model; now one line, exit 2, as ``up`` says it."""
    (tmp_path / "digits" / "1").mkdir(parents=True)
    (tmp_path / "digits" / "config.json").write_text("{not json")
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", "bench", "digits", "--nats-url", dep.nats_url,
                        "--prefix", PREFIX, "--models", str(tmp_path), "--duration", "0.5", "--concurrency", "1"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.startswith(f"error: bench: the model repository cannot be served: {tmp_path / 'digits'}"), p.stderr
    assert len(p.stderr.splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr


@pytest.mark.timeout(120)
async def test_nats_control_not_found_after_unload_and_bad_input(dep, refs):
    inputs, _ = refs
    async with await Client.connect(dep.nats_url, PREFIX) as client:
        s = Subjects(PREFIX)
        # a plain NATS request with a JSON body works like the CLI (nats req by hand)
        msg = await client.nc.request(s.model_control("digits", "load"), b'{"version": "9"}', timeout=10,
                                      headers={"Content-Type": "application/json"})
        err = decode_error(msg.headers, msg.data)
        assert isinstance(err, NotFound) and err.field == "version"
        for subject, body, kind in [(s.model_control("digits", "bogus"), b"", NotFound),
                                    (s.model_control("nosuch", "unload"), mp({"version": "1"}), NotFound),
                                    (s.model_control("digits", "unload"), b"\xc1junk", InvalidArgument),
                                    (s.model_control("digits", "default"), mp({"version": "x/.."}), InvalidArgument),
                                    # a Unicode digit is no version folder name (str.isdigit() alone takes it)
                                    (s.model_control("digits", "load"), mp({"version": "\u0661"}), InvalidArgument),
                                    (s.model_control("digits", "unload"), mp({}), InvalidArgument)]:
            msg = await client.nc.request(subject, body, timeout=10)
            assert isinstance(decode_error(msg.headers, msg.data), kind), (subject, body, msg.data)
        for bad in ("../etc", "dig.its", "", "a b", "*"):  # refused before sending, not a misleading UNAVAILABLE
            t0 = time.monotonic()
            with pytest.raises(InvalidArgument) as ei:
                await model_control(client, "load", bad, timeout_s=5)
            assert ei.value.field == "model" and time.monotonic() - t0 < 0.5, (bad, ei.value)
        r = await model_control(client, "unload", "digits", "2", timeout_s=30)
        assert r.versions == ["1"] and r.default_version == "1" and r.changed
        # every ingress refuses the unloaded version at once with NOT_FOUND (no timeout, no retry)
        for _ in range(6):
            t0 = time.monotonic()
            with pytest.raises(NotFound):
                await client.infer("digits", inputs[0], version="2", timeout_s=5.0)
            assert time.monotonic() - t0 < 4.0  # well inside the 5 s budget: refused, not timed out
        assert (await client.model("digits")).versions == ["1"]
        res = await client.infer_result("digits", inputs[1], version="1", timeout_s=5.0)
        _check(res, 1, refs)
        r = await model_control(client, "load", "digits", timeout_s=60)  # every version on disk not served
        assert r.versions == ["1", "2"] and set(r.workers.values()) == {"loaded"}
        for i in range(4):
            res = await client.infer_result("digits", inputs[i], version="2", timeout_s=5.0)
            assert res.model_version == "2"
            _check(res, i, refs)
        assert (await client.model("digits")).versions == ["1", "2"]


async def test_version_metadata_an_integer_version_and_a_lower_case_content_type_of_a_query(dep):
    """A fresh-user trial, as a KServe client: ``<p>.models.digits.1`` (OIP's per-version metadata) was "unknown
    model operation '1'"; ``{"version": 2}`` on a write was INVALID_ARGUMENT though config.json takes 2; and the
    metadata and health queries answered MessagePack to a JSON client whose header was spelled ``content-type``."""
    async with await Client.connect(dep.nats_url, PREFIX) as client:
        s = Subjects(PREFIX)
        default = (await client.model("digits")).parameters["default_version"]
        for v in ("1", 2):  # the version second, as Triton's get_model_metadata(name, version) takes it
            md = await client.model("digits", v)
            assert md.parameters["version"] == str(v) and md.parameters["default_version"] == default, md.parameters
            assert md.versions == ["1", "2"] and md.inputs[0].name == "pixels", md
        with pytest.raises(NotFound) as ei:
            await client.model("digits", version="9", timeout_s=5)
        assert ei.value.field == "model_version" and ei.value.message == "model 'digits' has no version '9'; " \
            "versions: 1, 2", ei.value  # (it said versions: ['1', '2'], a Python list's repr)
        for bad in ("load", "1.2", -1, True):  # never sent: "load" would be a write
            with pytest.raises(InvalidArgument):
                await client.model("digits", version=bad)
        for subject in (s.model("digits") + ".1", s.model("digits"), s.models, s.health):
            msg = await client.nc.request(subject, b"", timeout=5, headers={"content-type": "application/json"})
            assert msg.headers.get("Content-Type") == "application/json", (subject, msg.headers)
            assert isinstance(json.loads(msg.data), dict), subject
        # and a model-management request's (a later trial: an unknown operation's error came back as MessagePack;
        # a write's JSON body was read as MessagePack)
        for subject, body, code in ((s.model("digits") + ".1.foo", b"", "NOT_FOUND"),
                                    (s.model_control("digits", "load") + ".x", b"", "NOT_FOUND"),
                                    (s.model_control("digits", "default"), b'{"version": "01"}', "INVALID_ARGUMENT")):
            msg = await client.nc.request(subject, body, timeout=5, headers={"CONTENT-TYPE": "application/json"})
            assert msg.headers.get("Content-Type") == "application/json", (subject, msg.headers)
            assert json.loads(msg.data)["error"]["code"] == code, (subject, msg.data)
        # a write's version as an integer, as config.json's default_version takes it
        msg = await client.nc.request(s.model_control("digits", "default"), json.dumps({"version": int(default)}).encode(),
                                      timeout=10, headers={"Content-Type": "application/json"})
        assert decode_error(msg.headers, msg.data) is None, msg.data
        r = json.loads(msg.data)
        assert r["default_version"] == default and not r["changed"], r
        msg = await client.nc.request(s.model_control("digits", "default"), b'{"version": -1}', timeout=10,
                                      headers={"Content-Type": "application/json"})
        err = decode_error(msg.headers, msg.data)
        assert isinstance(err, InvalidArgument) and err.field == "version", err
        # 25 digits: over 2**63 - 1, the largest version a folder may be (it was "version must be a number", then
        # NOT_FOUND "no version of 25 digits"), as a read, the SDK and the HTTP gateway say it
        msg = await client.nc.request(s.model_control("digits", "default"), mp({"version": "9" * 25}), timeout=10)
        err = decode_error(msg.headers, msg.data)
        assert isinstance(err, InvalidArgument) and err.field == "version", err
        assert "over the largest version, 9223372036854775807" in err.message, err


@pytest.mark.timeout(120)
async def test_default_swap_under_light_load_every_answer_matches_its_version(dep, refs):
    inputs, by_version = refs
    async with await Client.connect(dep.nats_url, PREFIX) as client:
        driver = Driver(client, "digits", inputs, by_version["1"], rate_qps=40, timeout_s=2.0,
                        references_by_version=by_version)
        load = asyncio.create_task(driver.run(4.0))
        await asyncio.sleep(1.0)
        r = await model_control(client, "default", "digits", "2", timeout_s=10)
        assert r.default_version == "2"
        await asyncio.sleep(1.5)
        r = await model_control(client, "default", "digits", "1", timeout_s=10)
        assert r.default_version == "1"
        await load
        f = driver.figures("swap")
        print(f.to_dict())
        assert f.requests >= 100
        assert f.failed == 0 and f.wrong == 0, f.errors
        assert f.extra["answers_by_version"].get("2", 0) > 0 and f.extra["answers_by_version"].get("1", 0) > 0
        await _wait_default(client, "1", refs)


@pytest.mark.timeout(240)
async def test_two_contradicting_writes_at_once_exactly_one_succeeds_and_it_is_what_is_served(dep):
    """``default 1`` and ``unload --version 1`` sent at once by two clients (the queue group hands them to either
    ingress replica): in any order only one can apply, and before, when the two ingresses each took one, both
    answered OK and one of them had no effect (a fresh-user trial: 9 of 30 trials). Now the write that lost
    answers UNAVAILABLE (or, when the two were serialized, the second is refused by the state the first left),
    and the state served afterwards is the one the successful write announced."""
    from inferbus.actors._models import fetch_states

    a = await Client.connect(dep.nats_url, PREFIX)
    b = await Client.connect(dep.nats_url, PREFIX)
    try:
        seen = []
        for trial in range(10):
            await model_control(a, "load", "digits", timeout_s=30)  # versions 1 and 2 served
            await model_control(a, "default", "digits", "2", timeout_s=10)
            await asyncio.sleep(0.3)  # both replicas hold that state
            r_def, r_unl = await asyncio.gather(model_control(a, "default", "digits", "1", timeout_s=10),
                                                model_control(b, "unload", "digits", "1", timeout_s=30),
                                                return_exceptions=True)
            for r in (r_def, r_unl):
                assert not isinstance(r, BaseException) or isinstance(r, (Unavailable, InvalidArgument, NotFound)), r
            ok_def, ok_unl = not isinstance(r_def, BaseException), not isinstance(r_unl, BaseException)
            seen.append((ok_def, ok_unl, type(r_def).__name__, type(r_unl).__name__))
            assert ok_def != ok_unl, (trial, r_def, r_unl)
            await asyncio.sleep(0.3)
            states = [s for s in await fetch_states(a.nc, Subjects(PREFIX)) if s.model == "digits"]
            assert states, "no ingress answered the state request"
            st = states[0]
            if ok_def:
                assert st.default_version == "1" and "1" in st.versions, (trial, st)
            else:
                assert st.versions == ["2"] and st.default_version == "2", (trial, st)
        print("outcomes (default ok, unload ok, types):", seen)
    finally:
        await a.close()
        await b.close()


@pytest.mark.timeout(120)
async def test_a_write_with_no_answer_in_time_says_it_may_have_been_applied(nats_server):
    """A model write whose answer does not come within its budget: DEADLINE_EXCEEDED that says the write may still
    have been applied (the ingress got it; a fresh-user trial saw an unload applied after the CLI said only
    "no answer within 1 ms"). A real nats-server, and a subscriber on the write's subject that never answers."""
    client = await Client.connect(nats_server.url, "slow")
    try:
        sub = await client.nc.subscribe(Subjects("slow").model_control("digits", "unload"))  # takes it, answers never
        await client.nc.flush()
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded) as ei:
            await model_control(client, "unload", "digits", "2", timeout_s=0.3)
        assert 0.25 < time.monotonic() - t0 < 5
        assert "the unload may still have been applied" in ei.value.message and "inferbus models" in ei.value.message
        assert (await sub.next_msg(timeout=1)).subject == "slow.models.digits.unload"
        # the write's second attempt is unread: draining it would wait nats-py's drain timeout (30 s) at close
        await sub.unsubscribe()
    finally:
        await client.close()


async def test_writes_refused_on_a_standby_region(nats_server, tmp_path, refs):
    """The gate with real actors and a real NATS: the region managers' heartbeats are published by the test
    (the same messages a manager sends), region B standby, A primary."""
    cfg = NodeConfig(models_dir=str(MODELS), models=("digits",), workers=1, ingress=1, nats_url=nats_server.url,
                     no_cache=True, prefix="gate", region="B", run_dir=str(tmp_path / "run"))
    async with Node(cfg) as node:
        await node.wait_ready(60)
        client = await Client.connect(nats_server.url, "gate")
        try:
            # no region manager heard: a single node, writes accepted
            r = await model_control(client, "load", "digits", "1", timeout_s=10)
            assert not r.changed
            role = {"B": (STANDBY, False)}
            stop = asyncio.Event()

            async def managers():
                seq = 0
                while not stop.is_set():
                    seq += 1
                    for region, (rl, writes) in [("A", (PRIMARY, True)), ("B", role["B"])]:
                        hb = RegionHeartbeat(region=region, role=rl, term=0, lease_rev=7, seq=seq,
                                             manager_id=f"{region}-test", lease_holder="A", model_writes=writes)
                        await client.nc.publish(Subjects("gate").region_heartbeat(region), encode_region(hb))
                    await asyncio.sleep(0.05)

            hb_task = asyncio.create_task(managers())
            try:
                deadline = time.monotonic() + 10
                while True:
                    try:
                        await model_control(client, "default", "digits", "2", timeout_s=5)
                    except Unavailable as exc:
                        err = exc
                        break
                    assert time.monotonic() < deadline, "writes still accepted on a standby region"
                    await asyncio.sleep(0.05)
                assert "primary region (A)" in err.message and "region B" in err.message, err.message
                with pytest.raises(Unavailable):
                    await model_control(client, "unload", "digits", "2", timeout_s=5)
                # reads still work, and nothing changed
                assert (await client.model("digits")).versions == ["1", "2"]
                # B promoted: its manager announces model_writes, the same write is accepted
                role["B"] = (PRIMARY, True)
                deadline = time.monotonic() + 10
                while True:
                    try:
                        r = await model_control(client, "load", "digits", "2", timeout_s=5)
                        break
                    except Unavailable:
                        assert time.monotonic() < deadline, "writes still refused after promotion"
                        await asyncio.sleep(0.05)
                assert r.versions == ["1", "2"] and not r.changed
            finally:
                stop.set()
                await hb_task
        finally:
            await client.close()


async def test_a_write_refused_by_another_regions_ingress_that_answered_the_roll_call_first_goes_through_the_queue_group(
        nats_server, tmp_path):
    """A model write first asks ``<p>.ingresses`` and goes to the ingress that answers first, on its own subject; across
    gateways the first can be a standby region's ingress (7 of 40 probes in a trial, docs/regions.md), which refuses
    the write (UNAVAILABLE, field ``region``). Before the roll call a write went through the queue group, which a
    server hands to its own cluster's members first; a refusal from the roll call's pick must send it there again,
    not fail. Here the other region's ingress is the test's own subscriber; it refuses as a standby ingress does, and is
    no member of the queue group. The node's ingress is SIGSTOPped for the roll call (0.4 s), so that the refusing one
    answers it first, as the other region's did in the trial (a busy box otherwise lets either answer first). A real
    node (no region: writes accepted) and a real nats-server."""
    from inferbus.actors._common import error_message

    cfg = NodeConfig(models_dir=str(MODELS), models=("digits",), workers=1, ingress=1, nats_url=nats_server.url,
                     no_cache=True, prefix="xreg", run_dir=str(tmp_path / "run"))
    async with Node(cfg) as node:
        await node.wait_ready(60)
        client = await Client.connect(nats_server.url, "xreg")
        other = await Client.connect(nats_server.url, "xreg")
        refused = []
        try:
            async def roll_call(msg):
                await other.nc.publish(msg.reply, b"b-i0")

            async def write(msg):
                refused.append(msg.subject)
                eh, eb = error_message(Unavailable(
                    "model-management writes are accepted only in the primary region (A); this ingress is in region "
                    "B (region B is standby); send the request to the primary region", field="region",
                    retry_after_ms=1000))
                await other.nc.publish(msg.reply, eb, headers=eh)

            await other.nc.subscribe("xreg.ingresses", cb=roll_call)
            await other.nc.subscribe("xreg.ingresses.b-i0.models.>", cb=write)
            await other.nc.flush()
            pid = (await client.health(timeout_s=5)).parameters["pid"]
            loop = asyncio.get_running_loop()
            for i in range(2):
                os.kill(pid, signal.SIGSTOP)
                resume = loop.call_later(0.4, os.kill, pid, signal.SIGCONT)
                try:
                    r = await model_control(client, "load", "digits", "1", timeout_s=10)
                finally:
                    resume.cancel()
                    os.kill(pid, signal.SIGCONT)
                assert r.versions == ["1", "2"] and not r.changed, r
                assert refused == ["xreg.ingresses.b-i0.models.digits.load"] * (i + 1), refused
        finally:
            await other.close()
            await client.close()


async def test_a_write_whose_only_ingress_hung_and_was_dropped_meanwhile_names_it(nats_server):
    """The ingress is hung when the write starts (subscribed, silent: the roll call hears nothing, the write's first
    attempt through the queue group waits half the budget) and is dropped by the server before the retry (no
    responders): the UNAVAILABLE names it, with its pid, from its node's tree (a fresh-user trial: "no ingress is
    serving" after 31 s, naming no one). The hung ingress and its node's tree are played by the test on a real
    nats-server; its drop is the test ending its subscriptions once the first attempt has reached it."""
    client = await Client.connect(nats_server.url, "hungdrop")
    peer = await Client.connect(nats_server.url, "hungdrop")
    try:
        tree = {"node_id": "z1", "supervisors": [{"children": [
            {"id": "ingress:0", "actors": ["z1-i0"], "pid": 4242, "status": "running"}]}]}

        async def node_tree(msg):
            await peer.nc.publish(msg.reply, json.dumps(tree).encode())

        got = asyncio.Event()

        async def write(msg):  # taken, never answered
            got.set()

        await peer.nc.subscribe("hungdrop.nodes", cb=node_tree)
        async def silent(msg):  # hung: hears the roll call, says nothing
            pass

        hung = [await peer.nc.subscribe("hungdrop.ingresses", cb=silent),
                await peer.nc.subscribe("hungdrop.models.>", queue="ingress", cb=write)]
        await peer.nc.flush()

        async def drop():
            await got.wait()
            for sub in hung:
                await sub.unsubscribe()
            await peer.nc.flush()

        dropper = asyncio.create_task(drop())
        with pytest.raises(Unavailable) as ei:
            await model_control(client, "load", "digits", "1", timeout_s=2)
        await dropper
        msg = ei.value.message
        assert "no ingress is serving" in msg and "ingress z1-i0 (pid 4242, node z1)" in msg, msg
    finally:
        await peer.close()
        await client.close()


def test_a_node_in_no_region_forgets_a_region_manager_gone_for_a_minute(tmp_path):
    """A fresh-user trial ran `inferbus region manager A` beside a plain `inferbus up` for 25 s: ten minutes later
    the node still refused every model write (UNAVAILABLE, primary "none known now") until restarted. An
    ingress in no region now forgets a manager silent for REGION_HB_FORGET_S; one in a region never does."""
    from inferbus.actors import IngressConfig
    from inferbus.actors._ingress import Ingress
    from inferbus.actors._models import REGION_HB_FORGET_S
    from inferbus.bus import BusConfig

    models = str(MODELS)
    hb = RegionHeartbeat(region="A", role=PRIMARY, term=1, lease_rev=1, seq=1, manager_id="A-m", lease_holder="A",
                         model_writes=True)
    for region, accepted_later in (("", True), ("B", False)):
        ing = Ingress(IngressConfig(ingress_id="i-gate", bus=BusConfig(servers=("nats://127.0.0.1:1",)),
                                    models_dir=models, region=region))
        gate = ing.model_ctl
        assert gate.write_refusal(now=100.0) is None  # nothing heard: a single node
        gate.region_hb["A"] = (100.0, hb)
        assert isinstance(gate.write_refusal(now=101.0), Unavailable)  # a manager of another region is live
        assert isinstance(gate.write_refusal(now=100.0 + REGION_HB_FORGET_S / 2), Unavailable)
        later = gate.write_refusal(now=101.0 + REGION_HB_FORGET_S)
        assert (later is None) is accepted_later, (region, later)


@pytest.mark.timeout(150)
async def test_model_swap_drill_short():
    f = await model_swap(DrillOptions(duration_s=6.0, rate_qps=40.0, timeout_s=1.0, workers=2,
                                      models_dir=str(MODELS), health_timeout_s=1.0))
    print(f.to_dict())
    assert f.requests > 0 and f.failed == 0 and f.wrong == 0 and f.duplicates == 0
    assert f.extra["executions_audited"] >= f.ok
    by = f.extra["answers_by_version"]
    assert by.get("1", 0) > 0 and by.get("2", 0) > 0  # both versions served, each answer checked
    assert f.detection_ms is not None and f.recovery_ms is not None


def test_models_control_reply_is_plain_msgpack():
    """The reply struct round-trips through plain msgpack (any client can read it)."""
    from inferbus.schemas import ModelControlReply

    r = ModelControlReply("digits", "default", ["1", "2"], "2", 3, version="2", workers={"w0": "loaded"})
    d = msgspec.msgpack.decode(msgspec.msgpack.encode(r))
    assert d["default_version"] == "2" and d["workers"] == {"w0": "loaded"} and d["revision"] == 3


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A deployment (1 worker, 1 ingress) serving a model repository of its own (a copy of digits), which the
    tests change on disk: (deployment, models folder)."""
    root = tmp_path_factory.mktemp("models-own")
    models = root / "models"
    shutil.copytree(MODELS / "digits", models / "digits")
    d = start_deployment(root / "dep", workers=1, prefix="mmc", extra=["--models", str(models), "--no-cache"])
    yield d, models
    d.stop()


def _listing(url: list[str]) -> dict[str, dict[str, str]]:
    """``inferbus models`` as {name: {column: cell}} (rich's table, one line per row at 200 columns)."""
    p = cli(*url)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    rows = [[c.strip() for c in line.replace("┃", "│").split("│")[1:-1]] for line in p.stdout.splitlines()
            if line[:1] in ("│", "┃")]  # the header's rule is heavy
    header, *body = rows
    return {r[0]: dict(zip(header, r)) for r in body}


@pytest.mark.timeout(180)
def test_load_of_a_malformed_model_config_is_invalid_argument_naming_it_and_serving_goes_on(own):
    """``models load`` of a model whose config.json is malformed (or not JSON), or one of whose model.onnx is no
    model: INVALID_ARGUMENT naming the file, the model and the field (or version), nothing changes; a broken
    version does not block loading another by name (it used to be INTERNAL with a TypeError or AttributeError, a load every worker
    failed, or a model served with every request INTERNAL); fixed on disk, the same load works."""
    dep, models = own
    url = ["--nats-url", dep.nats_url, "--prefix", "mmc"]
    broken = models / "broken"
    for v in ("1", "2"):
        shutil.copytree(MODELS / "digits" / v, broken / v)
    for config, said in [([], "the config must be a JSON object"),
                         ({"name": "broken", "max_batch_size": "x"}, "max_batch_size must be an integer"),
                         ({"name": "broken", "cache_ttl_ms": "abc"}, "cache_ttl_ms must be an integer"),
                         ({"name": "broken", "default_version": "9"}, "default_version '9' is not a version on disk"),
                         ({"name": "broken", "hedge_after_ms": "sometimes"}, "hedge_after_ms"),
                         ("{not json", "the config cannot be read as JSON: Expecting property name")]:
        (broken / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        p = cli("load", "broken", *url)
        assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, (p.stdout, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("INVALID_ARGUMENT: model 'broken' cannot be loaded: "), lines
        assert f"{broken}/config.json: model 'broken': " in lines[0] and said in lines[0], lines[0]
    # a model.onnx that is no model: the same, naming the file and the version (it was NOT_FOUND)
    (broken / "config.json").write_text(json.dumps({"default_version": 1}))
    junk = broken / "2" / "model.onnx"
    junk.write_bytes(b"not an ONNX model")
    p = cli("load", "broken", *url)
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("INVALID_ARGUMENT: model 'broken' cannot be loaded: "), lines
    assert f"{junk}: model 'broken' version 2: " in lines[0], lines[0]
    # a served model's config broken on disk: a load of it is refused the same way, and it is served on
    cfg_path = models / "digits" / "config.json"
    good = cfg_path.read_text()
    cfg_path.write_text(json.dumps({**json.loads(good), "max_batch_size": -1}))
    p = cli("load", "digits", *url)
    assert p.returncode == 2 and "INVALID_ARGUMENT" in p.stderr and "max_batch_size" in p.stderr, p.stderr
    cfg_path.write_text(good)
    assert "digits" in _listing(url) and "broken" not in _listing(url)
    # the broken version 2 does not block loading version 1 by name (it refused every load of the model)
    p = cli("load", "broken", "--version", "1", *url, "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["versions"] == ["1"] and r["default_version"] == "1" and set(r["workers"].values()) == {"loaded"}, r
    p = cli("load", "broken", "--version", "2", *url)
    assert p.returncode == 2 and f"{junk}: model 'broken' version 2: " in p.stderr, p.stderr
    # fixed: the ingress and the worker serve on and load it
    shutil.copy(MODELS / "digits" / "2" / "model.onnx", junk)
    p = cli("load", "broken", *url, "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["versions"] == ["1", "2"] and r["default_version"] == "1" and set(r["workers"].values()) == {"loaded"}


@pytest.mark.timeout(180)
def test_the_listing_shows_each_models_default_version(own):
    """docs/models.md said the plain listing shows each model's default version; it showed only the versions."""
    dep, _ = own
    url = ["--nats-url", dep.nats_url, "--prefix", "mmc"]
    rows = _listing(url)
    assert list(rows["digits"])[:3] == ["name", "versions", "default"], rows
    assert rows["digits"]["versions"] == "1,2" and rows["digits"]["default"] == "1", rows
    p = cli("default", "digits", "2", *url)
    assert p.returncode == 0, p.stderr
    deadline = time.monotonic() + 10
    while _listing(url)["digits"]["default"] != "2":  # the one ingress applied it before answering; the loop
        assert time.monotonic() < deadline         # only guards against a slow broadcast
    assert _listing(url)["digits"]["versions"] == "1,2"
    p = cli(*url, "--json")  # the listing a script reads: the OIP v2 model list
    assert p.returncode == 0, p.stderr
    listed = {m["name"]: m for m in json.loads(p.stdout)["models"]}
    assert listed["digits"]["versions"] == ["1", "2"] and listed["digits"]["parameters"]["default_version"] == "2"
    assert listed["digits"]["inputs"][0]["name"] == "pixels", listed["digits"]
    p = cli("--nats-url", "nats://127.0.0.1:1", "--json")  # a failure is the wire's error object, exit 3
    assert p.returncode == 3 and json.loads(p.stdout)["error"]["code"] == "UNAVAILABLE", (p.stdout, p.stderr)



@pytest.mark.timeout(180)
def test_unloading_a_models_last_version_stops_serving_the_model_and_a_load_serves_it_again(own):
    """A fresh-user trial: a model loaded at run time by mistake could not be removed (its one version was the
    default: INVALID_ARGUMENT, with no other version to make the default) until every node restarted. Unloading a
    model's last version now withdraws the model: NOT_FOUND, not listed; ``load`` serves it again."""
    dep, models = own
    url = ["--nats-url", dep.nats_url, "--prefix", "mmc"]
    shutil.copytree(MODELS / "digits" / "1", models / "solo" / "1")
    shutil.copytree(MODELS / "digits" / "data", models / "solo" / "data")
    cfg = json.loads((MODELS / "digits" / "config.json").read_text())
    (models / "solo" / "config.json").write_text(json.dumps({**cfg, "name": "solo", "default_version": 1}))
    x = np.load(MODELS / "digits" / "data" / "test.npz")["X"][:3].astype(np.float32)
    want = np.asarray(reference("digits", {"pixels": x})["logits"])

    def infer():
        """The answer to ``x`` from solo's default version, or the typed error the SDK raised."""
        async def go():
            import nats
            nc = await nats.connect(dep.nats_url)
            try:
                return await Client(nc, "mmc", retry_unavailable=False).infer_result("solo", {"pixels": x},
                                                                                      timeout_s=5)
            except (NotFound, InvalidArgument) as exc:
                return exc
            finally:
                await nc.close()
        return asyncio.run(go())

    try:
        p = cli("load", "solo", *url)
        assert p.returncode == 0, p.stderr
        np.testing.assert_allclose(infer().outputs["logits"], want, rtol=1e-5, atol=1e-5)
        p = cli("unload", "solo", "1", *url)
        assert p.returncode == 0 and "model solo not served" in p.stdout, (p.stdout, p.stderr)
        assert "solo" not in _listing(url) and "digits" in _listing(url)
        assert isinstance(infer(), NotFound)
        p = cli("unload", "solo", "1", *url)  # nothing left to unload: the model is unknown now
        assert p.returncode == 2 and "NOT_FOUND" in p.stderr, p.stderr
        p = cli("load", "solo", *url)
        assert p.returncode == 0 and "serving versions 1, default 1" in p.stdout, (p.stdout, p.stderr)
        np.testing.assert_allclose(infer().outputs["logits"], want, rtol=1e-5, atol=1e-5)
        # with two versions, the default still cannot go first: the message says both ways out
        shutil.copytree(MODELS / "digits" / "2", models / "solo" / "2")
        assert cli("load", "solo", "2", *url).returncode == 0
        p = cli("unload", "solo", "1", *url)
        assert p.returncode == 2 and "INVALID_ARGUMENT" in p.stderr and "unload the others first" in p.stderr, p.stderr
    finally:
        for v in ("2", "1"):
            cli("unload", "solo", v, *url)
        shutil.rmtree(models / "solo")
    assert "solo" not in _listing(url)

@pytest.fixture(scope="module")
def fails(tmp_path_factory):
    """A deployment (2 workers, 2 ingress replicas: a state written by one must reach the other) serving a model
    repository of its own (a copy of digits), to which the tests add models whose workers' loads fail:
    (deployment, models folder)."""
    root = tmp_path_factory.mktemp("models-fail")
    models = root / "models"
    shutil.copytree(MODELS / "digits", models / "digits")
    d = start_deployment(root / "dep", workers=2, prefix="mmf",
                         extra=["--models", str(models), "--ingress", "2", "--no-cache"])
    yield d, models
    d.stop()


def _unloadable(path) -> None:
    """Write at ``path`` a model.onnx that the repository's checks pass (ONNX Runtime reads it: input ``pixels``
    FP32[-1, 64], as digits) but that no worker can load: it fails the warm-up (a Reshape of every batch of 1 to 64
    rows to [-1, 1000] cannot be done)."""
    import onnx
    from onnx import TensorProto, helper

    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 1000])
    graph = helper.make_graph([helper.make_node("Reshape", ["pixels", "shape"], ["logits"])], "unloadable",
                              [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", 64])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1000])],
                              initializer=[shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _health(url: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferbus.cli", "health", *url], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


async def _every_ingress_ready(client, timeout_s: float = 5.0) -> None:
    """Until 8 health answers in a row say ready (both queue-group members applied the latest state)."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while seen < 8:
        h = await client.health(timeout_s=2.0)
        assert h.ready or time.monotonic() < deadline, f"not ready {timeout_s} s after the write: {h.parameters}"
        seen = seen + 1 if h.ready else 0


def _refused(p: subprocess.CompletedProcess, code: str) -> str:
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, (p.stdout, p.stderr)
    err = json.loads(p.stdout)["error"]
    assert err["code"] == code, err
    return err["message"]


@pytest.mark.timeout(240)
async def test_a_failed_load_leaves_the_serving_state_as_it_was(fails, refs):
    """A fresh-user trial: `models load zz` of a NEW model whose workers all failed to load it was INTERNAL, yet zz
    stayed announced (listed, the node not ready, every request UNAVAILABLE), its only version could not be
    unloaded (the default), and after the files were fixed `models load zz` said "nothing to do". A failed load now
    leaves the serving state as it was: the new model is not served at all; a failed new version of a served model
    is withdrawn and its default serves on; fixed on disk, the same load really loads."""
    dep, models = fails
    url = ["--nats-url", dep.nats_url, "--prefix", "mmf"]
    inputs, by_version = refs
    zz = models / "zz"
    _unloadable(zz / "1" / "model.onnx")  # the ingress reads it; every worker fails to load it
    (zz / "config.json").write_text("{}")
    async with await Client.connect(dep.nats_url, "mmf") as client:
        msg = await asyncio.to_thread(_refused, cli("load", "zz", *url, "--json"), "INTERNAL")
        assert "no worker could load zz:1: " in msg and "not served" in msg, msg
        assert "['" not in msg and "{'" not in msg and "; n1-w1: failed: zz:1: " in msg, msg  # (it was ['zz:1']:
        # {'n1-w0': 'failed: ...', 'n1-w1': ...}, Python reprs)
        rows = await asyncio.to_thread(_listing, url)
        assert "zz" not in rows and rows["digits"]["versions"] == "1,2", rows
        await _every_ingress_ready(client, timeout_s=2.0)
        h = await asyncio.to_thread(_health, url)
        assert h.returncode == 0 and json.loads(h.stdout)["ready"] is True, (h.stdout, h.stderr)
        _check(await client.infer_result("digits", inputs[0], timeout_s=5.0), 0, refs)  # the others answer
        for _ in range(4):  # every ingress: an unknown model, not an UNAVAILABLE retry
            with pytest.raises(NotFound):
                await client.infer("zz", inputs[0], timeout_s=5.0)
        assert "unknown model" in await asyncio.to_thread(
            _refused, cli("unload", "zz", "--version", "1", *url, "--json"), "NOT_FOUND")
        # fixed on disk: the same load loads it for real (it said "nothing to do")
        shutil.copy(MODELS / "digits" / "1" / "model.onnx", zz / "1")
        p = await asyncio.to_thread(cli, "load", "zz", *url, "--json")
        assert p.returncode == 0, (p.stdout, p.stderr)
        r = json.loads(p.stdout)
        assert r["changed"] and r["versions"] == ["1"] and r["default_version"] == "1", r
        assert r["workers"] == {"n1-w0": "loaded", "n1-w1": "loaded"}, r
        await _every_ingress_ready(client)
        for i in range(4):
            res = await client.infer_result("zz", inputs[i], timeout_s=5.0)
            assert res.model_version == "1"
            np.testing.assert_allclose(res.outputs["logits"], by_version["1"][i]["logits"], rtol=1e-4, atol=1e-5)

        # a served model: a new version that no worker can load is withdrawn, the default serves on
        _unloadable(zz / "2" / "model.onnx")
        msg = await asyncio.to_thread(_refused, cli("load", "zz", "--version", "2", *url, "--json"), "INTERNAL")
        assert "no worker could load zz:2: " in msg and "serving versions 1, default 1" in msg, msg
        rows = await asyncio.to_thread(_listing, url)
        assert rows["zz"]["versions"] == "1" and rows["zz"]["default"] == "1", rows
        await _every_ingress_ready(client, timeout_s=2.0)
        for i in range(4):
            assert (await client.infer_result("zz", inputs[i], timeout_s=5.0)).model_version == "1"
            with pytest.raises(NotFound):
                await client.infer("zz", inputs[i], version="2", timeout_s=5.0)
        # the same with every version on disk (no --version): only the one not served is tried, and withdrawn
        await asyncio.to_thread(_refused, cli("load", "zz", *url, "--json"), "INTERNAL")
        assert (await asyncio.to_thread(_listing, url))["zz"]["versions"] == "1"
        shutil.copy(MODELS / "digits" / "2" / "model.onnx", zz / "2")
        p = await asyncio.to_thread(cli, "load", "zz", "--version", "2", *url, "--json")
        assert p.returncode == 0, (p.stdout, p.stderr)
        r = json.loads(p.stdout)
        assert r["changed"] and r["versions"] == ["1", "2"] and r["default_version"] == "1", r
        res = await client.infer_result("zz", inputs[0], version="2", timeout_s=5.0)
        np.testing.assert_allclose(res.outputs["logits"], by_version["2"][0]["logits"], rtol=1e-4, atol=1e-5)
        await _every_ingress_ready(client)


@pytest.mark.timeout(240)
async def test_a_new_model_whose_default_version_fails_is_not_served_at_all(fails, refs):
    """A new model with two versions on disk whose configured default fails on every worker while the other loads:
    the load is INTERNAL and undone as a whole (the model is not served, not served with a default that no worker
    has, which every ingress ignored while the workers applied it)."""
    dep, models = fails
    url = ["--nats-url", dep.nats_url, "--prefix", "mmf"]
    inputs, _ = refs
    yy = models / "yy"
    (yy / "1").mkdir(parents=True)
    shutil.copy(MODELS / "digits" / "1" / "model.onnx", yy / "1")
    _unloadable(yy / "2" / "model.onnx")
    (yy / "config.json").write_text(json.dumps({"default_version": 2}))
    async with await Client.connect(dep.nats_url, "mmf") as client:
        msg = await asyncio.to_thread(_refused, cli("load", "yy", *url, "--json"), "INTERNAL")
        assert "no worker could load yy:2: " in msg, msg
        assert "yy" not in await asyncio.to_thread(_listing, url)
        await _every_ingress_ready(client, timeout_s=2.0)
        with pytest.raises(NotFound):
            await client.infer("yy", inputs[0], version="1", timeout_s=5.0)
        # the version that loads, by name: served, and the default
        p = await asyncio.to_thread(cli, "load", "yy", "--version", "1", *url, "--json")
        assert p.returncode == 0, (p.stdout, p.stderr)
        r = json.loads(p.stdout)
        assert r["versions"] == ["1"] and r["default_version"] == "1", r
        assert (await client.infer_result("yy", inputs[0], timeout_s=5.0)).model_version == "1"
        await _every_ingress_ready(client)


@pytest.mark.timeout(240)
async def test_a_load_whose_budget_ran_out_is_loaded_again_not_nothing_to_do(fails, refs):
    """A load answered DEADLINE_EXCEEDED leaves its version announced while the workers go on loading; when they
    all fail, a second `models load` said "nothing to do" (the version was announced) and the model stayed
    UNAVAILABLE. A version announced but loaded by no live worker is now loaded again: still broken, INTERNAL and
    undone; fixed on disk, served."""
    dep, models = fails
    url = ["--nats-url", dep.nats_url, "--prefix", "mmf"]
    inputs, _ = refs
    ww = models / "ww"
    _unloadable(ww / "1" / "model.onnx")
    (ww / "config.json").write_text("{}")
    async with await Client.connect(dep.nats_url, "mmf") as client:
        with pytest.raises(DeadlineExceeded):  # the ingress announces ww:1 and answers before any worker loaded it
            await model_control(client, "load", "ww", timeout_s=0.001)
        deadline = time.monotonic() + 10
        while "ww" not in await asyncio.to_thread(_listing, url):
            assert time.monotonic() < deadline, "the timed-out load never announced ww"
        msg = await asyncio.to_thread(_refused, cli("load", "ww", *url, "--json"), "INTERNAL")
        assert "no worker could load ww:1: " in msg and "not served" in msg, msg
        assert "ww" not in await asyncio.to_thread(_listing, url)
        await _every_ingress_ready(client, timeout_s=2.0)
        with pytest.raises(DeadlineExceeded):
            await model_control(client, "load", "ww", timeout_s=0.001)
        shutil.copy(MODELS / "digits" / "1" / "model.onnx", ww / "1")  # fixed while (or after) the workers load it
        p = await asyncio.to_thread(cli, "load", "ww", *url, "--json")
        assert p.returncode == 0, (p.stdout, p.stderr)
        r = json.loads(p.stdout)
        assert r["versions"] == ["1"] and r["default_version"] == "1", r
        assert (await client.infer_result("ww", inputs[0], timeout_s=5.0)).model_version == "1"
        await _every_ingress_ready(client)


@pytest.mark.timeout(240)
async def test_two_loads_at_once_through_two_ingresses_never_undo_each_other(fails, refs):
    """A fresh-user trial (2026-12-05, ``--ingress 2``): ``load digits 3`` and ``load digits 4`` at the same moment.
    When the two ingress replicas took one each, the loser saw its version loaded nowhere and undid its load with a
    state of the next revision, which withdrew the winner's version too: 7 of 11 trials had one load answered OK and
    its version not served, 1 of 11 both answered INTERNAL "no worker could load [...]: {all 'loaded'}". Now a load
    that another write replaced answers UNAVAILABLE and undoes nothing, so every load answered OK is served."""
    from inferbus.actors._models import fetch_states

    dep, models = fails
    vv = models / "vv"
    for v in ("1", "3", "4"):
        (vv / v).mkdir(parents=True)
        shutil.copy(MODELS / "digits" / ("2" if v == "4" else "1") / "model.onnx", vv / v)
    (vv / "config.json").write_text(json.dumps({"default_version": 1}))
    inputs, by_version = refs
    a = await Client.connect(dep.nats_url, "mmf")
    b = await Client.connect(dep.nats_url, "mmf")
    outcomes = []
    try:
        await model_control(a, "load", "vv", "1", timeout_s=30)
        for trial in range(8):
            r3, r4 = await asyncio.gather(model_control(a, "load", "vv", "3", timeout_s=30),
                                          model_control(b, "load", "vv", "4", timeout_s=30), return_exceptions=True)
            outcomes.append(tuple(f"UNAVAILABLE ({r.message[:160]})" if isinstance(r, Unavailable) else
                                  type(r).__name__ for r in (r3, r4)))
            for r in (r3, r4):  # loaded, or lost to the other: never INTERNAL, never a timeout
                assert not isinstance(r, BaseException) or isinstance(r, Unavailable), (trial, r)
            ok = {v for v, r in (("3", r3), ("4", r4)) if not isinstance(r, BaseException)}
            assert ok, (trial, r3, r4)  # one of them at least applies
            await asyncio.sleep(0.5)  # both replicas and both workers hold the final state
            states = [s for s in await fetch_states(a.nc, Subjects("mmf")) if s.model == "vv"]
            assert states and all(s == states[0] for s in states), states
            served = set(states[0].versions)
            assert ok <= served, (trial, outcomes[-1], states[0])  # each load answered OK is served
            for v in sorted(ok):  # and computes: the version's own answers
                res = await a.infer_result("vv", inputs[trial], version=v, timeout_s=5.0)
                want = by_version["2" if v == "4" else "1"][trial]["logits"]
                np.testing.assert_allclose(res.outputs["logits"], want, rtol=1e-4, atol=1e-5)
            for v in sorted(served - {"1"}):
                await model_control(a, "unload", "vv", v, timeout_s=30)
        await asyncio.sleep(0.3)
        for _ in range(6):  # an unloaded version leaves the health's latency block of either replica (it stayed)
            latency = (await a.health(timeout_s=5.0)).parameters["latency"]
            assert "vv:3" not in latency and "vv:4" not in latency, latency
        print("outcomes (load 3, load 4):", outcomes)
    finally:
        await a.close()
        await b.close()


@pytest.mark.timeout(240)
async def test_the_same_write_sent_twice_at_once_is_answered_twice(fails, refs):
    """A fresh-user trial (2026-12-05, ``--ingress 2``): the same ``load`` (or ``unload``) sent by two clients at
    once, taken by both ingress replicas: the worker found the winner's state (the same versions as the loser's,
    already applied) in line and kept reporting the loser's writer id, so the winner's ingress waited for its own
    for good: no answer within the budget in 2 of 6 trials (4 of 6 with ``--ingress 3``), and that ingress took no
    other write meanwhile. Now both are answered at once: OK, or UNAVAILABLE naming the winner."""
    dep, models = fails
    uu = models / "uu"
    for v in ("1", "3"):
        (uu / v).mkdir(parents=True)
        shutil.copy(MODELS / "digits" / "1" / "model.onnx", uu / v)
    (uu / "config.json").write_text(json.dumps({"default_version": 1}))
    inputs, by_version = refs
    a = await Client.connect(dep.nats_url, "mmf")
    b = await Client.connect(dep.nats_url, "mmf")
    try:
        await model_control(a, "load", "uu", "1", timeout_s=30)
        for trial in range(8):
            for op in ("load", "unload"):
                t0 = time.monotonic()
                rs = await asyncio.gather(model_control(a, op, "uu", "3", timeout_s=10),
                                          model_control(b, op, "uu", "3", timeout_s=10), return_exceptions=True)
                took_s = time.monotonic() - t0
                assert took_s < 5.0, (trial, op, rs, took_s)  # by the first attempts (the SDK sends again at 5 s)
                for r in rs:  # answered: never the budget waited out (an unload taken after the other: NOT_FOUND)
                    assert not isinstance(r, BaseException) or isinstance(r, Unavailable) or (
                        op == "unload" and isinstance(r, NotFound)), (trial, op, r, took_s)
                assert any(not isinstance(r, BaseException) for r in rs), (trial, op, rs)
                if op == "load":
                    res = await a.infer_result("uu", inputs[trial], version="3", timeout_s=5.0)
                    np.testing.assert_allclose(res.outputs["logits"], by_version["1"][trial]["logits"], rtol=1e-4,
                                               atol=1e-5)
                else:
                    with pytest.raises(NotFound):
                        await a.infer("uu", inputs[trial], version="3", timeout_s=5.0)
    finally:
        await a.close()
        await b.close()


async def test_a_restarted_only_ingress_keeps_the_writes_its_workers_hold(tmp_path, refs):
    """A fresh-user trial (2026-12-02), the default layout (one ingress): ``default digits 2``, then the ingress
    SIGKILLed and restarted by the node: it asked its peers for the states, nobody but itself answered, and it went
    back to the repository's state (default 1) while the worker kept default 2; a later ``unload`` got a revision
    the worker had already applied, was ignored there and still answered "drained". Now the workers answer the
    state request too, every answer within a short window counts (newest per model), and the ingress numbers its
    writes above what its workers report."""
    import os
    import signal

    d = start_deployment(tmp_path / "one", workers=1, prefix="one", extra=["--no-cache"])
    try:
        inputs, _ = refs
        async with await Client.connect(d.nats_url, "one") as client:
            r = await model_control(client, "default", "digits", "2", timeout_s=10)
            assert r.default_version == "2"
            assert (await client.infer_result("digits", inputs[0], timeout_s=5.0)).model_version == "2"
            old = (await client.health(timeout_s=2.0)).parameters["pid"]
            os.kill(old, signal.SIGKILL)
            await _restarted(client, old, lambda ready: bool(ready), 60)  # the node's supervisor restarts it
            # the write stands: the listing and unversioned requests say version 2
            res = await client.infer_result("digits", inputs[0], timeout_s=5.0)
            assert res.model_version == "2"
            listing = {m.name: m for m in (await client.models(timeout_s=2.0)).models}
            assert listing["digits"].parameters["default_version"] == "2", listing["digits"]
            # and a later write is applied on the worker, not only answered
            r = await model_control(client, "unload", "digits", "1", timeout_s=30)
            assert r.versions == ["2"] and r.revision >= 2, r
            deadline = time.monotonic() + 10
            while "digits:1" in (await client.health(timeout_s=2.0)).parameters["models_ready"]:
                assert time.monotonic() < deadline, "the worker never dropped digits:1"
                await asyncio.sleep(0.1)
            with pytest.raises(NotFound):
                await client.infer("digits", inputs[0], version="1", timeout_s=5.0)
    finally:
        d.stop()


async def _restarted(client, old_pid: int, ready_ok, timeout_s: float) -> None:
    """Wait until an ingress other than ``old_pid`` answers health with ``ready_ok(models_ready)`` true."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert time.monotonic() < deadline, "the actors were not restarted"
        await asyncio.sleep(0.2)
        try:
            h = await client.health(timeout_s=1.0)
        except Exception:
            continue
        if h.parameters["pid"] != old_pid and ready_ok(h.parameters.get("models_ready") or {}):
            return


async def kill_one_ingress(client, ready_key: str) -> None:
    """SIGKILL the ingress that answers a health ask; return once its restart is ready (``ready_key`` among its ready
    model versions) and two ingress pids answer again (its replica's and the restarted one's)."""
    import os
    import signal

    old = (await client.health(timeout_s=2.0)).parameters["pid"]
    os.kill(old, signal.SIGKILL)
    await _restarted(client, old, lambda ready: ready_key in ready, 60)
    deadline = time.monotonic() + 30
    while len(set([(await client.health(timeout_s=2.0)).parameters["pid"] for _ in range(10)]) - {old}) < 2:
        assert time.monotonic() < deadline, "the restarted ingress never answered"
        await asyncio.sleep(0.2)


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_writes_survive_every_actor_dying_at_once(tmp_path, refs):
    """A fresh-user trial (2026-12-02) SIGKILLed the ingress and the workers together: the node restarted them and
    they served the repository's versions and default again (``default 2`` and ``unload 1`` undone), since the
    states lived only in the actors. Now the node process keeps a copy (``StateKeeper``) and answers the restarted
    actors' state request: the writes stand."""
    import os
    import signal

    d = start_deployment(tmp_path / "all", workers=2, prefix="all", extra=["--no-cache"])
    try:
        inputs, _ = refs
        async with await Client.connect(d.nats_url, "all") as client:
            r = await model_control(client, "default", "digits", "2", timeout_s=10)
            assert r.default_version == "2"
            r = await model_control(client, "unload", "digits", "1", timeout_s=30)
            assert r.versions == ["2"], r
            actors = []
            for entry in os.listdir("/proc"):
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        cmd = f.read()
                except (OSError, ValueError):
                    continue
                if ppid == d.proc.pid and b"inferbus.actors" in cmd:
                    actors.append(int(entry))
            assert len(actors) >= 3, actors  # the ingress, two workers (and the aggregator)
            old_ingress = (await client.health(timeout_s=2.0)).parameters["pid"]
            assert old_ingress in actors
            for pid in actors:  # all at once
                os.kill(pid, signal.SIGKILL)
            await _restarted(client, old_ingress, lambda ready: "digits:2" in ready, 90)  # the node restarts them
            # the writes stand: unversioned requests get version 2, version 1 is not served, the listing says so
            deadline = time.monotonic() + 30
            while True:
                try:
                    res = await client.infer_result("digits", inputs[0], timeout_s=5.0)
                    break
                except Unavailable:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            assert res.model_version == "2"
            with pytest.raises(NotFound):
                await client.infer("digits", inputs[0], version="1", timeout_s=5.0)
            listing = {m.name: m for m in (await client.models(timeout_s=2.0)).models}
            assert listing["digits"].parameters["default_version"] == "2", listing["digits"]
            assert listing["digits"].versions == ["2"], listing["digits"]
    finally:
        d.stop()


@pytest.mark.anyio
@pytest.mark.timeout(300)
async def test_a_config_change_is_applied_by_load_on_every_actor_and_an_actor_restarted_before_it_keeps_the_old(
        tmp_path, refs):
    """A fresh-user trial: ``cache_ttl_ms`` edited in config.json could not be applied at run time (``models load``
    answered ``changed: false``, the answers stayed cached), and an ingress restarted after the edit read it from disk
    while its peer kept the old one: about half the repeats missed, and the model's metadata said 0 or 60000 by
    whichever ingress answered. Now an actor restarted by its node serves the config the node started with, and
    ``models load`` reads config.json again and carries a change to every actor (``changed: true``, ``config
    applied``), restarted ones included."""
    models = tmp_path / "models"
    shutil.copytree(MODELS / "digits", models / "digits")
    cfg_path = models / "digits" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["cache_ttl_ms"] = 60_000
    cfg_path.write_text(json.dumps(cfg))
    d = start_deployment(tmp_path / "dep", workers=2, prefix="cfg",
                         extra=["--models", str(models), "--ingress", "2"])
    inputs, _ = refs

    async def both_say(client, ttl_ms: int) -> None:
        """Every ingress's metadata of digits says ``ttl_ms`` (20 asks spread over the queue group)."""
        seen = {(await client.model("digits", timeout_s=2.0)).parameters["cache_ttl_ms"] for _ in range(20)}
        assert seen == {ttl_ms}, seen

    async def hits(client, i: int, n: int = 20) -> int:
        return sum([bool((await client.infer_result("digits", inputs[i], timeout_s=5.0)).parameters.get("cache_hit"))
                    for _ in range(n)])

    try:
        async with await Client.connect(d.nats_url, "cfg") as client:
            await both_say(client, 60_000)
            cfg_path.write_text(json.dumps({**cfg, "cache_ttl_ms": 0, "hedge_after_ms": "p95"}))
            assert "hedge_after_ms" not in (await client.model("digits", timeout_s=2.0)).parameters
            await kill_one_ingress(client, "digits:1")  # restarted after the edit: it serves what its peer serves
            await both_say(client, 60_000)
            await hits(client, 0, 24)  # both ingresses (the queue group picks) hold it in L1 (2**-23 that one does not)
            assert await hits(client, 0) == 20
            p = await asyncio.to_thread(cli, "load", "digits", "--nats-url", d.nats_url, "--prefix", "cfg", "--json")
            assert p.returncode == 0, p.stderr
            r = json.loads(p.stdout)
            assert r["changed"] and set(r["workers"].values()) == {"config applied"}, r
            await asyncio.sleep(0.5)  # the other ingress applied the broadcast state
            await both_say(client, 0)
            assert (await client.model("digits", timeout_s=2.0)).parameters["hedge_after_ms"] == "p95"
            listing = await asyncio.to_thread(_listing, ["--nats-url", d.nats_url, "--prefix", "cfg"])
            assert listing["digits"]["hedge after"] == "p95", listing
            assert await hits(client, 1) == 0
            await kill_one_ingress(client, "digits:1")  # restarted after the load: the state carries the new config
            await both_say(client, 0)
            assert await hits(client, 2) == 0
            # nothing changed since: nothing to do
            p = await asyncio.to_thread(cli, "load", "digits", "--nats-url", d.nats_url, "--prefix", "cfg", "--json")
            assert p.returncode == 0 and not json.loads(p.stdout)["changed"], (p.stdout, p.stderr)
    finally:
        d.stop()


@pytest.mark.anyio
@pytest.mark.timeout(300)
async def test_an_ingress_without_a_served_version_on_its_disk_follows_the_writes_and_says_unavailable(tmp_path):
    """A fresh-user trial: two nodes on one NATS with their own model folders, a version (digits 3) only in the
    first's. The second node's ingress ignored every later state of the model (its versions not all on its disk):
    after ``default digits 2`` was answered done, it kept answering requests naming no version with version 1
    (30 of 60), and a write it took was built on its stale state and undid writes already answered done (``unload``
    reset the default to 1 and dropped version 3). Now it applies the state: unversioned requests get the written
    default from every ingress, version 3 gets UNAVAILABLE from that ingress (so the SDK's retry reaches the other),
    health says why, and a write it takes keeps what was written."""
    s1, s2 = tmp_path / "s1", tmp_path / "s2"
    for s in (s1, s2):
        shutil.copytree(MODELS / "digits", s / "digits")
    with two_nodes(tmp_path, "skew", ["--models", str(s1), "--no-cache"], ["--models", str(s2), "--no-cache"]) \
            as (d1, _):
        shutil.copytree(MODELS / "digits" / "2", s1 / "digits" / "3")
        async with await Client.connect(d1.nats_url, "skew") as client:
            deadline = time.monotonic() + 60
            while True:  # the ingress of n2 has no version 3 on its disk: NOT_FOUND there, retried until n1 takes it
                try:
                    r = await model_control(client, "load", "digits", "3", timeout_s=30)
                    break
                except NotFound:
                    assert time.monotonic() < deadline
            assert r.versions == ["1", "2", "3"], r
            r = await model_control(client, "default", "digits", "2", timeout_s=30)
            assert r.default_version == "2", r
            await asyncio.sleep(0.5)  # both ingresses applied the state
            x = {"pixels": np.zeros((1, 64), np.float32)}
            got = [(await client.infer_result("digits", x, timeout_s=5.0)).model_version for _ in range(40)]
            assert set(got) == {"2"}, got
            # version 3: answered (by n1's ingress, after an UNAVAILABLE from n2's if it took the first attempt)
            for _ in range(10):
                assert (await client.infer_result("digits", x, version="3", timeout_s=5.0)).model_version == "3"
            healths = {}
            for _ in range(60):
                h = await client.health(timeout_s=2.0)
                healths[h.parameters["ingress_id"]] = h
                if len(healths) == 2:
                    break
            h2 = healths["n2-i0"]
            assert "digits:3" in h2.parameters["versions_not_here"] and not h2.ready, h2.parameters
            assert "digits:3" not in h2.parameters["models_ready"]
            assert "versions_not_here" not in healths["n1-i0"].parameters
            # a write whichever ingress takes it builds on the written state: default 2 and version 3 stay
            for _ in range(4):
                r = await model_control(client, "unload", "digits", "1", timeout_s=30) if "1" in r.versions else \
                    await model_control(client, "load", "digits", "1", timeout_s=30)
                assert r.default_version == "2" and "3" in r.versions, r


@pytest.mark.anyio
@pytest.mark.timeout(300)
async def test_a_version_in_one_nodes_folder_only_from_the_start_is_served_and_a_load_makes_it_consistent(tmp_path):
    """The same two nodes, the version (digits 3) in the first node's folder from the start, before any write (a
    fresh-user trial): the second node's ingress answered its requests NOT_FOUND (40-60 %, not retried by the SDK);
    ``load digits 3`` said "nothing to do" (its workers had never tried it), and ``default digits 3`` said
    "retry once its load finished" for ever. Now the second ingress answers UNAVAILABLE (retried: every request is
    answered, by version 3), a load reaches the second node's worker too (which reports why it cannot load it), and
    ``default 3`` then says that a retry cannot help (INTERNAL, naming the worker and the reason)."""
    s1, s2 = tmp_path / "s1", tmp_path / "s2"
    for s in (s1, s2):
        shutil.copytree(MODELS / "digits", s / "digits")
    shutil.copytree(MODELS / "digits" / "2", s1 / "digits" / "3")
    with two_nodes(tmp_path, "skew0", ["--models", str(s1), "--no-cache"], ["--models", str(s2), "--no-cache"]) \
            as (d1, _):
        async with await Client.connect(d1.nats_url, "skew0") as client:
            x = {"pixels": np.zeros((1, 64), np.float32)}
            got = [(await client.infer_result("digits", x, version="3", timeout_s=5.0)).model_version
                   for _ in range(20)]
            assert set(got) == {"3"}, got
            deadline = time.monotonic() + 60
            while True:  # n2's ingress has no version 3 on its disk: NOT_FOUND there, retried until n1 takes it
                try:
                    r = await model_control(client, "load", "digits", "3", timeout_s=30)
                    break
                except NotFound:
                    assert time.monotonic() < deadline
            assert r.changed and r.workers["n1-w0"] == "loaded" and r.workers["n2-w0"].startswith("failed"), r
            with pytest.raises(Internal) as ei:
                await model_control(client, "default", "digits", "3", timeout_s=30)
            assert "n2-w0" in ei.value.message and "a retry cannot help" in ei.value.message, ei.value.message


@pytest.mark.timeout(120)
async def test_a_version_policy_chooses_what_a_deployment_serves_and_a_load_naming_a_version_adds_it(tmp_path):
    """A fresh-user trial: config.json's ``{"specific": {"versions": [1]}}`` beside versions 1 and 2 was not read,
    and an unversioned request got version 2's answer where Triton serves version 1 only. Now the node pins, the
    ingresses list and the workers load what the policy serves; a load without a version keeps to it, and one that
    names a version outside it loads that version (the operator's explicit ask)."""
    models = tmp_path / "models"
    for v in ("1", "2", "3"):
        (models / "m" / v).mkdir(parents=True)
        shutil.copy(MODELS / "digits" / "1" / "model.onnx", models / "m" / v / "model.onnx")
    (models / "m" / "config.json").write_text(json.dumps({"max_batch_size": 8, "version_policy":
                                                          {"specific": {"versions": [1, 2]}}}))
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="vp", extra=["--models", str(models), "--no-cache"])
    try:
        async with await Client.connect(dep.nats_url, "vp") as client:
            md = await client.model("m")
            assert md.versions == ["1", "2"] and md.parameters["default_version"] == "2", md
            x = {"pixels": np.zeros((1, 64), np.float32)}
            assert (await client.infer_result("m", x)).model_version == "2"
            with pytest.raises(NotFound):
                await client.infer("m", x, version="3")
            r = await model_control(client, "load", "m", timeout_s=30)
            assert r.versions == ["1", "2"] and not r.changed, r
            r = await model_control(client, "load", "m", "3", timeout_s=30)
            assert r.versions == ["1", "2", "3"] and r.changed and set(r.workers.values()) == {"loaded"}, r
            assert (await client.infer_result("m", x, version="3")).model_version == "3"
        # `bench` reads that version's inputs from the folder whose policy leaves it out (it said "not in the model
        # repository")
        b = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "inferbus.cli", "bench", "m", "--version", "3", "--nats-url", dep.nats_url,
            "--prefix", "vp", "--models", str(models), "--concurrency", "1", "--duration", "0.3", "--json"],
            capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
        assert all(r["ok"] > 0 and r["wrong"] == 0 for r in json.loads(b.stdout)), b.stdout
    finally:
        dep.stop()


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_a_restarted_ingress_serves_what_the_node_started_with_not_a_version_staged_on_disk_since(tmp_path):
    """A fresh-user trial staged a version folder (``4/``) without loading it, then an ingress was SIGKILLed: the
    node restarted it, and it read the folder again and served 1-4 with 4 as its default, which no worker had loaded
    (UNAVAILABLE for every unversioned request it took), while its peer served 1-3. A restarted ingress now starts
    from the versions the node pinned at its start, as a restarted worker does."""
    models = tmp_path / "models"
    shutil.copytree(MODELS / "digits", models / "digits")
    cfg_path = models / "digits" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("default_version", None)  # the highest: what a staged folder would change
    cfg_path.write_text(json.dumps(cfg))
    d = start_deployment(tmp_path / "dep", workers=1, prefix="stg", extra=["--models", str(models), "--ingress", "2",
                                                                          "--no-cache"])
    try:
        async with await Client.connect(d.nats_url, "stg") as client:
            shutil.copytree(models / "digits" / "2", models / "digits" / "3")  # staged, not loaded
            await kill_one_ingress(client, "digits:2")
            seen = set()
            for _ in range(20):  # both ingresses, as the queue group spreads the asks
                md = await client.model("digits", timeout_s=2.0)
                seen.add((tuple(md.versions), md.parameters["default_version"]))
            assert seen == {(("1", "2"), "2")}, seen
            for i in range(20):
                res = await client.infer_result("digits", {"pixels": np.full((1, 64), i, np.float32)}, timeout_s=5.0)
                assert res.model_version == "2"
    finally:
        d.stop()


@pytest.mark.anyio
async def test_a_write_sent_long_before_an_ingress_takes_it_is_refused_not_applied(dep):
    """A fresh-user trial: ``default 2`` sent while one of 2 ingresses was SIGSTOPped; the copies that ingress held
    were applied when it thawed, 9 s later, over an operator's ``default 1`` already answered done (the state went
    back to 2). A write whose attempt was sent more than 2 s before an ingress takes it (``Inferbus-Deadline-Unix-Ms``
    − ``Inferbus-Timeout-Ms``, as the SDK and the CLI send them) is now refused UNAVAILABLE, nothing applied. Here the
    send time is set 10 s back rather than freezing an ingress."""
    import nats as nats_mod

    nc = await nats_mod.connect(dep.nats_url)
    try:
        s = Subjects(PREFIX)
        subject = s.model_control("digits", "default")

        async def write(version: str, sent_ago_s: float):
            now_ms = time.time() * 1000.0
            hdrs = {"Content-Type": "application/json", "Inferbus-Timeout-Ms": "60000",
                    "Inferbus-Deadline-Unix-Ms": f"{now_ms - sent_ago_s * 1000.0 + 60000:.0f}"}
            msg = await nc.request(subject, json.dumps({"version": version}).encode(), timeout=30, headers=hdrs)
            return decode_error(msg.headers, msg.data), msg

        # (earlier tests of this module unload versions: serve both again)
        msg = await nc.request(s.model_control("digits", "load"), b"{}", timeout=60,
                               headers={"Content-Type": "application/json"})
        assert decode_error(msg.headers, msg.data) is None, msg.data
        err, _ = await write("1", 0.0)  # sent now: applied (the default is 1 after it)
        assert err is None, err
        err, _ = await write("2", 10.0)  # held 10 s somewhere: refused
        assert isinstance(err, Unavailable) and "was sent 10." in err.message and "not applied" in err.message, err
        meta = await nc.request(s.model("digits"), b"", timeout=10, headers={"Content-Type": "application/json"})
        assert json.loads(meta.data)["parameters"]["default_version"] == "1"
        err, _ = await write("2", 0.0)  # its retry, sent afresh: applied
        assert err is None, err
        meta = await nc.request(s.model("digits"), b"", timeout=10, headers={"Content-Type": "application/json"})
        assert json.loads(meta.data)["parameters"]["default_version"] == "2"
    finally:
        await nc.close()


@pytest.mark.parametrize("deadline, timeout", [("inf", "60000"), ("1_700_000_000_000", "60000"), ("x", "1"),
                                               ("١٠٠٠", "1"), (None, "60000"), ("1700000000000", None)])
def test_a_write_whose_send_time_headers_are_not_numbers_is_not_judged_stale(deadline, timeout):
    """The send time of a write is read with the same number syntax as every other header
    (:func:`inferbus.bus._headers.header_number`): a malformed or infinite value, or a missing one, leaves the write
    unjudged (None) rather than refused; only a well-formed pair gives how long ago it was sent."""
    from inferbus.actors._models import _waited_ms
    from inferbus.bus import headers as H

    hdrs = {k: v for k, v in ((H.DEADLINE_UNIX_MS, deadline), (H.TIMEOUT_MS, timeout)) if v is not None}
    assert _waited_ms(hdrs) is None
    now_ms = time.time() * 1000.0
    waited = _waited_ms({H.DEADLINE_UNIX_MS: f"{now_ms + 1000:.0f}", H.TIMEOUT_MS: "4000"})
    assert 2900 < waited < 3100
