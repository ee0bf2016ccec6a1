"""Version pinning (docs/models.md, "Pinned versions"): a served model version is the bytes it was first loaded from.

A user trial found that a worker restarted by its supervisor loaded whatever was on disk under a served version: with
the version's ``model.onnx`` overwritten while serving, two different models answered under one version (the other
workers still held the old one), silently; and a served version whose folder was deleted stayed announced, every
request UNAVAILABLE while health said ready. Now a restarted worker checks each version's files against the digest
pinned at start and does not serve a version whose files changed or are gone: its other versions serve on, the other
workers keep answering that version from the pinned bytes, and once no worker serves it, requests get INTERNAL at once
naming the reason, health is not ready and ``inferbus models`` says why. ``inferbus models load`` re-pins.

Real processes only: ``inferbus up`` (embedded nats-server, 2 workers, 1 ingress, no cache) on a copy of digits with a
third version (a copy of version 2); workers killed with SIGKILL, restarted by the node's supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import MODELS, ROOT, start_deployment
from conftest import uvloop_backend as anyio_backend  # noqa: F401 (process-heavy tests: one loop)
from test_reliability_lib import digits_version_refs, reference
from inferbus._limits import MAX_INLINE_COMPUTE_US
from inferbus.actors._pinning import version_files
from inferbus.client import Client
from inferbus.schemas import Internal

pytestmark = [pytest.mark.anyio]

PREFIX = "pin"


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    """(deployment, models folder): digits versions 1, 2 and 3 (3 = a copy of 2), 2 workers."""
    root = tmp_path_factory.mktemp("pinning")
    models = root / "models"
    shutil.copytree(MODELS / "digits", models / "digits")
    shutil.copytree(MODELS / "digits" / "2", models / "digits" / "3")
    d = start_deployment(root / "dep", workers=2, prefix=PREFIX, extra=["--models", str(models), "--no-cache"])
    yield d, models
    d.stop()


@pytest.fixture(scope="module")
def refs():
    return digits_version_refs()


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferbus.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"})


def _outputs_of(res, refs, i: int) -> str:
    """Which model's outputs (the files of digits "1" or "2") answered input ``i``."""
    _, by = refs
    for files in ("1", "2"):
        if np.allclose(res.outputs["logits"], by[files][i]["logits"], rtol=1e-4, atol=1e-5):
            return files
    return "neither"


async def _kill_and_wait_restart(client, wid: str, timeout_s: float = 60.0) -> None:
    """SIGKILL worker ``wid`` (its pid from health, once the ingress has heard from it: on a loaded box a node can be
    ready on one worker's reports before the other's first) and wait until it reports again from a new process."""
    deadline = time.monotonic() + timeout_s
    while (old := (await client.health(timeout_s=2.0)).parameters["workers"].get(wid, {}).get("pid")) is None:
        assert time.monotonic() < deadline, f"{wid} never reported"
        await asyncio.sleep(0.1)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while True:
        assert time.monotonic() < deadline, f"{wid} not back within {timeout_s} s"
        await asyncio.sleep(0.2)
        w = (await client.health(timeout_s=2.0)).parameters["workers"].get(wid, {})
        if w.get("pid") not in (None, old) and w.get("health") == "ok" and (w.get("report_age_ms") or 1e9) < 1000:
            return


@pytest.mark.timeout(300)
async def test_a_restarted_worker_does_not_serve_changed_or_deleted_files_under_a_pinned_version(pinned, refs):
    dep, models = pinned
    url = ["--nats-url", dep.nats_url, "--prefix", PREFIX]
    inputs, _ = refs
    pinned_2 = version_files(models / "digits" / "2").digest
    async with await Client.connect(dep.nats_url, PREFIX) as client:
        for v in ("1", "2", "3"):
            res = await client.infer_result("digits", inputs[0], version=v, timeout_s=5.0)
            assert _outputs_of(res, refs, 0) == {"1": "1", "2": "2", "3": "2"}[v]
        # while serving: version 2's model file overwritten with another valid model (version 1's), version 3 deleted
        shutil.copy(MODELS / "digits" / "1" / "model.onnx", models / "digits" / "2" / "model.onnx")
        shutil.rmtree(models / "digits" / "3")
        now_2 = version_files(models / "digits" / "2").digest
        assert now_2 != pinned_2

        # one worker crashes and is restarted: it serves version 1, not 2 or 3; the other serves all three as pinned
        await _kill_and_wait_restart(client, "n1-w0")
        served_by = {"1": set(), "2": set(), "3": set()}
        for n in range(30):  # 8 at once, so that the router uses both workers
            asked = [(v, (n + j) % len(inputs)) for j, v in enumerate(("1", "2", "3", "1", "2", "3", "1", "1"))]
            answers = await asyncio.gather(*[client.infer_result("digits", inputs[i], version=v, timeout_s=5.0)
                                             for v, i in asked])
            for (v, i), res in zip(asked, answers):
                served_by[v].add(res.parameters["worker_id"])
                # never the changed bytes under the old version (it answered version 1's outputs as version 2)
                assert _outputs_of(res, refs, i) == {"1": "1", "2": "2", "3": "2"}[v], (v, res.parameters)
        deadline = time.monotonic() + 20
        while served_by["1"] != {"n1-w0", "n1-w1"}:  # on a loaded box the router may have kept to one worker so far
            assert time.monotonic() < deadline, served_by
            answers = await asyncio.gather(*[client.infer_result("digits", inputs[i], timeout_s=5.0) for i in range(8)])
            for i, res in enumerate(answers):
                served_by["1"].add(res.parameters["worker_id"])
                assert _outputs_of(res, refs, i) == "1", res.parameters
        deadline = time.monotonic() + 10
        while True:
            h = await client.health(timeout_s=2.0)
            bad = h.parameters.get("model_versions_not_served", {})
            if set(bad) == {"digits:2", "digits:3"}:
                break
            assert time.monotonic() < deadline, h.parameters
            await asyncio.sleep(0.1)
        assert h.ready, h.parameters  # n1-w1 still serves both from the pinned bytes
        assert await client.model_ready("digits", 2) and await client.model_ready("digits", "3")
        assert bad["digits:2"]["ready"] and set(bad["digits:2"]["workers"]) == {"n1-w0"}, bad
        assert f"digest mismatch: expected {pinned_2} got {now_2}" in bad["digits:2"]["workers"]["n1-w0"], bad
        assert "files missing" in bad["digits:3"]["workers"]["n1-w0"], bad
        assert served_by["1"] == {"n1-w0", "n1-w1"} and served_by["2"] == served_by["3"] == {"n1-w1"}, served_by

        # the other worker restarts too: no worker holds the pinned files; typed error at once, not ready, listed
        await _kill_and_wait_restart(client, "n1-w1")
        for v, said in (("2", f"digest mismatch: expected {pinned_2} got {now_2}"), ("3", "files missing")):
            t0 = time.monotonic()
            with pytest.raises(Internal) as err:
                await client.infer("digits", inputs[0], version=v, timeout_s=10.0)
            assert time.monotonic() - t0 < 2.0, "answered after a wait, not at once"
            assert f"model version digits:{v} is not served" in str(err.value) and said in str(err.value), err.value
        for i in range(4):  # version 1 (the default) serves on, on both
            res = await client.infer_result("digits", inputs[i], timeout_s=5.0)
            assert res.model_version == "1" and _outputs_of(res, refs, i) == "1"
        h = await client.health(timeout_s=2.0)
        assert not h.ready, h.parameters
        bad = h.parameters["model_versions_not_served"]
        assert not bad["digits:2"]["ready"] and set(bad["digits:2"]["workers"]) == {"n1-w0", "n1-w1"}, bad
        # OIP model ready says the same per version (the default version serves on)
        assert [await client.model_ready("digits", v) for v in (None, 1, 2, 3)] == [True, True, False, False]
        hp = await asyncio.to_thread(_cli, "health", *url)
        assert json.loads(hp.stdout)["ready"] is False, (hp.stdout, hp.stderr)
        p = await asyncio.to_thread(_cli, "models", *url)
        assert p.returncode == 0, p.stderr
        assert "not served" in p.stdout, p.stdout
        assert (f"digits version 2 NOT READY (no live worker serves it): digest mismatch: expected {pinned_2} got "
                f"{now_2} (n1-w0, n1-w1)") in p.stdout, p.stdout
        assert (f"digits version 3 NOT READY (no live worker serves it): files missing: "
                f"{models / 'digits' / '3' / 'model.onnx'} (n1-w0, n1-w1)") in p.stdout, p.stdout
        p = await asyncio.to_thread(_cli, "models", *url, "--json")
        listed = {m["name"]: m for m in json.loads(p.stdout)["models"]}
        assert set(listed["digits"]["parameters"]["versions_not_served"]) == {"2", "3"}, listed["digits"]

        # the explicit load re-pins version 2 to its new files (Triton's load of a loaded model reloads it)
        p = await asyncio.to_thread(_cli, "models", "load", "digits", "--version", "2", *url, "--json")
        assert p.returncode == 0, (p.stdout, p.stderr)
        r = json.loads(p.stdout)
        assert r["changed"] and r["workers"] == {"n1-w0": "loaded", "n1-w1": "loaded"}, r
        for i in range(4):
            res = await client.infer_result("digits", inputs[i], version="2", timeout_s=5.0)
            assert _outputs_of(res, refs, i) == "1"  # the new files, knowingly
        p = await asyncio.to_thread(_cli, "models", "load", "digits", "--version", "2", *url, "--json")
        assert p.returncode == 0 and json.loads(p.stdout)["changed"] is False, p.stdout  # pinned: nothing to do
        # the deleted version is unloaded; then every served version is ready again
        p = await asyncio.to_thread(_cli, "models", "unload", "digits", "--version", "3", *url, "--json")
        assert p.returncode == 0, (p.stdout, p.stderr)
        deadline = time.monotonic() + 5
        while not (h := await client.health(timeout_s=2.0)).ready or "model_versions_not_served" in h.parameters:
            assert time.monotonic() < deadline, h.parameters
            await asyncio.sleep(0.1)

        # a worker restarted after the re-pin serves version 2 from the new files (the state it fetches pins them)
        await _kill_and_wait_restart(client, "n1-w0")
        deadline = time.monotonic() + 20
        seen = set()
        while seen != {"n1-w0", "n1-w1"}:  # 8 at once, so that the router uses both workers
            assert time.monotonic() < deadline, seen
            answers = await asyncio.gather(*[client.infer_result("digits", inputs[1], version="2", timeout_s=5.0)
                                             for _ in range(8)])
            for res in answers:
                assert _outputs_of(res, refs, 1) == "1"
                seen.add(res.parameters["worker_id"])


@pytest.mark.timeout(180)
async def test_a_repinned_version_never_answers_from_the_old_files_cached(tmp_path, refs):
    """A user trial: after ``models load`` re-pinned a version to new files, both ingresses' L1 caches (and the raw
    index) kept answering the old files' results as hits, under the same version, for the model's ``cache_ttl_ms``.
    Cache keys now carry the pin: with L1 and the shared L2 warm with the old answers, every answer after the
    re-pin is the new files', and the new answers are cached again."""
    models = tmp_path / "models"
    shutil.copytree(MODELS / "digits", models / "digits")
    cfg = json.loads((models / "digits" / "config.json").read_text())
    cfg["cache_ttl_ms"] = 60_000
    (models / "digits" / "config.json").write_text(json.dumps(cfg))
    dep = start_deployment(tmp_path / "dep", workers=2, prefix=PREFIX, extra=["--models", str(models), "--ingress", "2",
                                                                             "--l2-lookup"])
    inputs, _ = refs
    try:
        async with await Client.connect(dep.nats_url, PREFIX) as client:
            async def ask_all(rounds: int) -> list:
                out = []
                for _ in range(rounds):  # each round every input once, at once (spread over both ingresses)
                    res = await asyncio.gather(*[client.infer_result("digits", x, version="2", timeout_s=5.0)
                                                 for x in inputs])
                    out += list(enumerate(res))
                return out

            before = await ask_all(6)  # both ingresses see each input: L1 on both, L2 filled
            assert all(_outputs_of(r, refs, i) == "2" for i, r in before)
            assert sum(bool(r.parameters.get("cache_hit")) for _, r in before) > len(inputs), "no hits before"
            shutil.copy(MODELS / "digits" / "1" / "model.onnx", models / "digits" / "2" / "model.onnx")
            p = await asyncio.to_thread(_cli, "models", "load", "digits", "--version", "2", "--nats-url", dep.nats_url,
                                        "--prefix", PREFIX, "--json")
            assert p.returncode == 0 and json.loads(p.stdout)["changed"], (p.stdout, p.stderr)
            await asyncio.sleep(1.5)  # the other ingress has applied the broadcast state (ms; generous for a busy box)
            after = await ask_all(6)
            stale = [(i, r.parameters.get("cache_hit"), r.parameters.get("cache_level")) for i, r in after
                     if _outputs_of(r, refs, i) != "1"]
            assert not stale, stale  # (input, hit, level) answered from the old files
            assert sum(bool(r.parameters.get("cache_hit")) for _, r in after) > len(inputs), "no hits after"
    finally:
        dep.stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("colocate", [False, True], ids=["separate", "colocated"])
async def test_answers_computed_by_the_old_files_during_a_repin_are_not_cached_under_the_new_pin(tmp_path, colocate):
    """A fresh-user trial: under load, ``models load`` re-pinning a version left 11-111 answers of the OLD files in the
    caches under the NEW pin (6 of 6 runs), served as hits for the model's whole ``cache_ttl_ms``: an ingress keys by
    the new pin as soon as it applies the new state, while the workers answer from the old session until their reload
    is done, and those answers filled L1 and L2 under the new key. A worker now gives no fill for a version it is
    re-pinning, nor for a request keyed by another pin than its session's: asked again after the load, every input
    sent around it is answered by the new files."""
    import onnxruntime as ort

    models = tmp_path / "models"
    shutil.copytree(MODELS / "digits", models / "digits")
    cfg = json.loads((models / "digits" / "config.json").read_text())
    cfg["cache_ttl_ms"] = 60_000
    (models / "digits" / "config.json").write_text(json.dumps(cfg))
    extra = ["--models", str(models), "--l2-lookup"] + (["--colocate"] if colocate else ["--ingress", "2"])
    dep = start_deployment(tmp_path / "dep", workers=2, prefix=PREFIX, extra=extra)
    one_thread = ort.SessionOptions()  # the reference on one core: the other tests' processes share the box
    one_thread.intra_op_num_threads = 1
    new_files = ort.InferenceSession(str(MODELS / "digits" / "1" / "model.onnx"), one_thread)
    rng = np.random.default_rng(7)
    sent: list[tuple[float, np.ndarray]] = []
    stop = False
    try:
        async with await Client.connect(dep.nats_url, PREFIX) as client:
            async def load() -> None:  # fresh inputs, as fast as answered
                while not stop:
                    x = rng.random((1, 64), dtype=np.float32)
                    await client.infer_result("digits", {"pixels": x}, version="2", timeout_s=5.0)
                    sent.append((time.monotonic(), x))

            tasks = [asyncio.create_task(load()) for _ in range(8)]
            await asyncio.sleep(1.0)
            shutil.copy(MODELS / "digits" / "1" / "model.onnx", models / "digits" / "2" / "model.onnx")
            t_load = time.monotonic()
            p = await asyncio.to_thread(_cli, "models", "load", "digits", "--version", "2", "--nats-url", dep.nats_url,
                                        "--prefix", PREFIX, "--json")
            await asyncio.sleep(0.3)
            stop = True
            await asyncio.gather(*tasks)
            assert p.returncode == 0 and json.loads(p.stdout)["changed"], (p.stdout, p.stderr)
            await asyncio.sleep(1.0)  # every ingress applied the new state
            around = [x for t, x in sent if t >= t_load - 0.5]
            assert len(around) > 50, len(around)
            stale = []
            in_flight = asyncio.Semaphore(16)  # 3,000-4,000 inputs: one at a time took 6 s of the test (10 in CI)

            async def check(x) -> None:
                async with in_flight:
                    r = await client.infer_result("digits", {"pixels": x}, version="2", timeout_s=5.0)
                want = new_files.run(["logits"], {"pixels": x})[0]
                if not np.allclose(r.outputs["logits"], want, rtol=1e-4, atol=1e-5):
                    stale.append((r.parameters.get("cache_hit"), r.parameters.get("cache_level")))

            await asyncio.gather(*(check(x) for x in around))
            assert not stale, f"{len(stale)} of {len(around)} answered by the old files: {stale[:10]}"
    finally:
        stop = True
        dep.stop()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("colocate", [False, True], ids=["separate", "colocated"])
async def test_a_request_id_sent_again_after_a_repin_is_computed_by_the_new_files(tmp_path, refs, colocate):
    """A fresh-user trial (2026-12-06): a request id sent again with the same body after ``models load`` re-pinned
    its version to new files was answered from the worker's dedupe store (``Inferbus-Dedup: hit``) with what the OLD
    files computed, 3 of 3 times (2 of 3 colocated), for the store's 30 s, where a fresh id got the new files'
    answer. The dedupe key now carries the files the worker serves the version from. No result cache here, so
    only the dedupe store could answer it."""
    models = tmp_path / "models"
    shutil.copytree(MODELS / "digits", models / "digits")
    extra = ["--models", str(models), "--no-cache"] + (["--colocate"] if colocate else [])
    dep = start_deployment(tmp_path / "dep", workers=2, prefix=PREFIX, extra=extra)
    inputs, _ = refs
    try:
        async with await Client.connect(dep.nats_url, PREFIX) as client:
            for i, x in enumerate(inputs):
                res = await client.infer_result("digits", x, version="1", request_id=f"txn-{i}", timeout_s=5.0)
                assert _outputs_of(res, refs, i) == "1"
            again = await client.infer_result("digits", inputs[0], version="1", request_id="txn-0", timeout_s=5.0)
            assert _outputs_of(again, refs, 0) == "1"  # (the store answers a repeat before the re-pin)
            shutil.copy(MODELS / "digits" / "2" / "model.onnx", models / "digits" / "1" / "model.onnx")
            p = await asyncio.to_thread(_cli, "models", "load", "digits", "--version", "1", "--nats-url", dep.nats_url,
                                        "--prefix", PREFIX, "--json")
            assert p.returncode == 0 and json.loads(p.stdout)["changed"], (p.stdout, p.stderr)
            await asyncio.sleep(1.0)  # every actor applied the new state
            stale = []
            for i, x in enumerate(inputs):  # the same ids and bodies, before any fresh request
                res = await client.infer_result("digits", x, version="1", request_id=f"txn-{i}", timeout_s=5.0)
                if _outputs_of(res, refs, i) != "2":
                    stale.append((i, res.parameters.get("worker_id"), res.parameters.get("cache_hit")))
            assert not stale, f"{len(stale)} of {len(inputs)} ids answered by the old files: {stale}"
    finally:
        dep.stop()


def _int32_identity_onnx() -> bytes:
    """An ONNX model ``pixels`` INT32 [-1, 64] → ``logits`` (Identity): the same input name as digits, another
    datatype."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Identity", ["pixels"], ["logits"])], "int32_identity",
                          [helper.make_tensor_value_info("pixels", TensorProto.INT32, [None, 64])],
                          [helper.make_tensor_value_info("logits", TensorProto.INT32, [None, 64])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.timeout(180)
async def test_a_repinned_version_with_another_input_datatype_refuses_bodies_of_a_learned_layout(tmp_path):
    """A user trial: the ingress's request layouts (bodies of a learned length taken by slicing, no validation) were
    kept after ``models load`` re-pinned a version to files taking INT32 instead of FP32. A FP32 body of the learned
    length then reached the model: INTERNAL ("Unexpected input data type"), counted a server error of the worker,
    whose breaker opened after ~200 such requests. Now a model-state change drops the model's layouts: the same body
    gets INVALID_ARGUMENT naming the datatype, the worker's breaker stays closed, and INT32 bodies are served."""
    import msgpack
    import nats

    from inferbus.schemas import ErrorCode, decode_error

    models = tmp_path / "models"
    (models / "m" / "1").mkdir(parents=True)
    (models / "m" / "config.json").write_text("{}")  # metadata from the ONNX file itself
    shutil.copy(MODELS / "digits" / "1" / "model.onnx", models / "m" / "1" / "model.onnx")
    dep = start_deployment(tmp_path / "dep", workers=1, prefix=PREFIX,
                           extra=["--models", str(models), "--colocate", "--no-cache"])
    rng = np.random.default_rng(7)

    def body(x: np.ndarray) -> bytes:  # one id, one shape: every body of a datatype has the same length
        return msgpack.packb({"id": "L", "inputs": [{"name": "pixels", "datatype": "FP32" if x.dtype == np.float32
                                                     else "INT32", "shape": [1, 64], "raw": x.tobytes()}]})

    try:
        nc = await nats.connect(dep.nats_url)
        try:
            subject = f"{PREFIX}.infer.m.1"
            for _ in range(4):  # learned, then taken by the layout
                m = await nc.request(subject, body(rng.random((1, 64), dtype=np.float32)), timeout=5)
                assert decode_error(m.headers, m.data) is None, m.data
            (models / "m" / "1" / "model.onnx").write_bytes(_int32_identity_onnx())
            p = await asyncio.to_thread(_cli, "models", "load", "m", "--version", "1", "--nats-url", dep.nats_url,
                                        "--prefix", PREFIX, "--json")
            assert p.returncode == 0 and json.loads(p.stdout)["changed"], (p.stdout, p.stderr)
            for _ in range(20):
                m = await nc.request(subject, body(rng.random((1, 64), dtype=np.float32)), timeout=5)
                err = decode_error(m.headers, m.data)
                assert err is not None and err.code == ErrorCode.INVALID_ARGUMENT and "INT32" in err.message, \
                    (m.headers, m.data)
            x = rng.integers(-1000, 1000, (1, 64), dtype=np.int32)
            m = await nc.request(subject, body(x), timeout=5)
            assert decode_error(m.headers, m.data) is None, m.data
            out = msgpack.unpackb(m.data)["outputs"][0]
            assert out["datatype"] == "INT32" and np.array_equal(np.frombuffer(out["raw"], np.int32), x.ravel())
        finally:
            await nc.close()
        async with await Client.connect(dep.nats_url, PREFIX) as client:
            workers = (await client.health(timeout_s=5.0)).parameters["workers"]
            assert workers and all(w.get("breaker") == "closed" for w in workers.values()), workers
    finally:
        dep.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("run_to_completion", [True, False], ids=["run-now", "queued"])
async def test_a_colocated_worker_on_new_files_before_its_ingress_answers_a_misfit_as_a_client_error(
        nats_server, tmp_path, run_to_completion):
    """A user trial re-pinned a version (FP32 → INT32 files) under load with ``--colocate``: the worker took the new
    files a moment before its ingress took the new metadata, and requests the ingress had checked against the old
    metadata reached the new session: answered INTERNAL, counted against the worker, its breaker opened. That moment
    is made to last here: the worker's own model management loads the new files in place (what a re-pin does first);
    the ingress has not applied it. Each FP32 request is now INVALID_ARGUMENT naming the datatype, with no server
    error at the worker and its breaker closed, on the run-to-completion and the queued local path."""
    import msgpack
    import nats

    from inferbus.actors import IngressConfig, WorkerConfig
    from inferbus.actors._breaker import BreakerState
    from inferbus.actors._colocated import Colocated, ColocatedConfig
    from inferbus.bus import BusConfig
    from inferbus.schemas import ErrorCode, decode_error

    models = tmp_path / "models"
    (models / "m" / "1").mkdir(parents=True)
    (models / "m" / "config.json").write_text("{}")
    shutil.copy(MODELS / "digits" / "1" / "model.onnx", models / "m" / "1" / "model.onnx")
    bus = BusConfig(servers=(nats_server.url,), prefix="mis")
    col = Colocated(ColocatedConfig(
        IngressConfig(ingress_id="mis-i", bus=bus, models_dir=str(models), models=("m",),
                      run_to_completion=run_to_completion),
        WorkerConfig(worker_id="mis-w", bus=bus, models_dir=str(models), models=("m",),
                     inline_max_compute_us=MAX_INLINE_COMPUTE_US)))
    task = asyncio.create_task(col.run())
    nc = await nats.connect(nats_server.url)
    try:
        deadline = time.monotonic() + 60
        while col.ingress._infer_sub is None or col.ingress.router.pick("m:1") is None:  # (serving, routable)
            assert not task.done() and time.monotonic() < deadline, task
            await asyncio.sleep(0.05)
        rng = np.random.default_rng(3)

        def fp32() -> bytes:
            return msgpack.packb({"id": "L", "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                                         "raw": rng.random((1, 64), dtype=np.float32).tobytes()}]})

        for _ in range(4):
            m = await nc.request("mis.infer.m.1", fp32(), timeout=5)
            assert decode_error(m.headers, m.data) is None, m.data
        (models / "m" / "1" / "model.onnx").write_bytes(_int32_identity_onnx())
        await col.worker.model_ctl._load("m", "m:1", None, replace=True)
        assert col.worker._specs["m:1"]["pixels"].datatype == "INT32"
        assert col.ingress._inputs["m:1"]["pixels"].datatype == "FP32"  # the ingress has not applied the change
        for _ in range(10):
            m = await nc.request("mis.infer.m.1", fp32(), timeout=5)
            err = decode_error(m.headers, m.data)
            assert err is not None and err.code == ErrorCode.INVALID_ARGUMENT and "INT32" in err.message, \
                (m.headers, m.data)
        assert col.worker.stats.errors == 0
        assert col.ingress.router.workers["mis-w"].breaker.state == BreakerState.CLOSED
    finally:
        await nc.close()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


@pytest.mark.timeout(180)
async def test_a_version_unloaded_and_loaded_again_from_new_files_is_checked_against_them_on_every_ingress(tmp_path):
    """A user trial: ``models unload m --version 1``, new files for version 1 (INT32 instead of FP32), ``models load m
    --version 1``: the ingress that took the load read the new files' metadata, but the other ingress kept the
    scan it had from before the unload, for good, and refused valid INT32 requests (about half of them, as the
    queue group spread them). Now a version that the model's state serves again is read again on every ingress."""
    import msgpack
    import nats

    from inferbus.schemas import ErrorCode, decode_error

    models = tmp_path / "models"
    for v in ("1", "2"):
        (models / "m" / v).mkdir(parents=True)
        shutil.copy(MODELS / "digits" / v / "model.onnx", models / "m" / v / "model.onnx")
    (models / "m" / "config.json").write_text(json.dumps({"default_version": 2}))
    dep = start_deployment(tmp_path / "dep", workers=1, prefix=PREFIX,
                           extra=["--models", str(models), "--ingress", "2", "--no-cache"])
    rng = np.random.default_rng(11)

    def body(dtype) -> bytes:
        x = rng.integers(-9, 9, (1, 64)).astype(dtype)
        return msgpack.packb({"inputs": [{"name": "pixels", "datatype": "FP32" if dtype == np.float32 else "INT32",
                                          "shape": [1, 64], "raw": x.tobytes()}]})

    try:
        for args in (("unload", "m", "--version", "1"), None, ("load", "m", "--version", "1")):
            if args is None:
                (models / "m" / "1" / "model.onnx").write_bytes(_int32_identity_onnx())
                continue
            p = await asyncio.to_thread(_cli, "models", *args, "--nats-url", dep.nats_url, "--prefix", PREFIX)
            assert p.returncode == 0, (args, p.stdout, p.stderr)
        await asyncio.sleep(1.5)  # the other ingress has applied the broadcast state
        nc = await nats.connect(dep.nats_url)
        try:
            got = [await nc.request(f"{PREFIX}.infer.m.1", body(np.int32), timeout=5) for _ in range(30)]
            errs = [decode_error(m.headers, m.data) for m in got]
            assert not [e for e in errs if e is not None], [e for e in errs if e is not None][:3]
            for _ in range(10):
                m = await nc.request(f"{PREFIX}.infer.m.1", body(np.float32), timeout=5)
                err = decode_error(m.headers, m.data)
                assert err is not None and err.code == ErrorCode.INVALID_ARGUMENT and "INT32" in err.message, err
        finally:
            await nc.close()
    finally:
        dep.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("colocate", [False, True], ids=["ingress", "colocated"])
async def test_an_ingress_restarted_next_to_unreadable_model_folders_serves_what_it_can(tmp_path, colocate):
    """Folders that cannot be read appear while the node serves: a version that is no ONNX (never loaded), a new model
    whose config is no JSON, and a served model's config edited into garbage. The ingress (or the colocated process)
    is then killed: it starts again, serves every model it can read and leaves out the one it cannot, naming it in
    its log; the node runs on. Before, it read the whole repository strictly, refused to start (exit 2) on every
    restart, and the node's restart intensity stopped the whole node, NATS included (a fresh-user trial, 6 of 6).
    The served model whose config.json was edited into garbage is served on, with the config the node started with
    (an edit reaches the actors only through ``models load``, which refuses that one)."""
    models = tmp_path / "models"
    for name in ("digits", "fraud"):
        shutil.copytree(MODELS / name, models / name)
    extra = ["--models", str(models), "--no-cache"] + (["--colocate"] if colocate else [])
    dep = await asyncio.to_thread(start_deployment, tmp_path / "dep", workers=1, prefix="pinbad", extra=extra)
    try:
        client = await Client.connect(dep.nats_url, "pinbad")
        try:
            x = np.load(MODELS / "digits" / "data" / "test.npz")["X"][:1].astype(np.float32)
            await client.infer("digits", {"pixels": x})
            deadline = time.monotonic() + 30  # `up` has printed its model lines (read from the folders) and serves
            while b"serving; Ctrl-C to stop" not in dep.log.read_bytes():
                assert time.monotonic() < deadline and dep.proc.poll() is None, dep.log.read_text()[-3000:]
                await asyncio.sleep(0.05)
            (models / "digits" / "4").mkdir()
            (models / "digits" / "4" / "model.onnx").write_bytes(b"junk, not ONNX")
            (models / "zz" / "1").mkdir(parents=True)
            shutil.copy(models / "fraud" / "1" / "model.onnx", models / "zz" / "1" / "model.onnx")
            (models / "zz" / "config.json").write_text("{oops")
            (models / "fraud" / "config.json").write_text('{"max_batch_size": "x"}')
            old = (await client.health(timeout_s=5.0)).parameters["pid"]
            os.kill(old, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while True:  # the same node answers again, from a new ingress process
                assert dep.proc.poll() is None, dep.log.read_text()[-3000:]
                with contextlib.suppress(Exception):
                    h = await client.health(timeout_s=1.0)
                    if h.parameters["pid"] != old and "digits:1" in h.parameters["models_ready"]:
                        break
                assert time.monotonic() < deadline, dep.log.read_text()[-3000:]
                await asyncio.sleep(0.2)
            out = await client.infer("digits", {"pixels": x}, timeout_s=5)
            np.testing.assert_allclose(out["logits"], reference("digits", {"pixels": x})["logits"], rtol=1e-5, atol=1e-5)
            assert set(h.parameters["models_unreadable"]) == {"zz"}, h.parameters["models_unreadable"]
            assert {m.name for m in (await client.models(timeout_s=5.0)).models} == {"digits", "fraud"}
            # fraud is served with the config the node started with, by every actor, restarted or not: ready
            assert (await client.model("fraud", timeout_s=5.0)).parameters["max_batch_size"] != "x"
            deadline = time.monotonic() + 10
            while not (h := await client.health(timeout_s=5.0)).ready:
                assert time.monotonic() < deadline, h.parameters
                await asyncio.sleep(0.2)
            assert "fraud:1" in h.parameters["models_ready"], h.parameters
            await asyncio.sleep(2.0)  # (a restart loop would have stopped the node by now)
            assert dep.proc.poll() is None and (await client.health(timeout_s=5.0)).ready
        finally:
            await client.close()
        runs = "\n".join(p.read_text() for p in dep.run_dir.glob("*.log"))
        assert "not serving model zz: its folder cannot be read" in runs, runs[-3000:]
        assert "restarted too often" not in runs
    finally:
        dep.stop()
