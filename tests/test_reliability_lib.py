"""Helpers shared by the reliability, bad-input and fuzz tests (no tests here).

Everything talks to real processes: ``inferbus up`` deployments (conftest), load
reports read off the bus, faults set through the workers' control subject
(``FaultSet``, honoured only by workers started with ``--fault-injection``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import msgpack
import numpy as np
import onnxruntime as ort

from inferbus.schemas._internal import FaultSet, LoadReport, decode_internal, encode_internal

from conftest import MODELS


def models_subset(dest: Path, names: list[str], overrides: dict[str, dict] | None = None) -> Path:
    """A model repository holding copies of ``names`` from models/, with config.json keys overridden."""
    dest.mkdir(parents=True, exist_ok=True)
    for n in names:
        shutil.copytree(MODELS / n, dest / n, dirs_exist_ok=True)
        if overrides and n in overrides:
            cfg_path = dest / n / "config.json"
            cfg = json.loads(cfg_path.read_text())
            cfg.update(overrides[n])
            cfg_path.write_text(json.dumps(cfg))
    return dest


def write_onnx_model(folder: Path, graph, config: dict) -> None:
    """A model folder made from an ONNX ``graph`` (opset 17, IR 8, checked): ``1/model.onnx`` and a ``config.json``
    holding ``config`` (name, platform onnxruntime_onnx and default version 1 unless given)."""
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (folder / "config.json").write_text(json.dumps({
        "name": folder.name, "platform": "onnxruntime_onnx", "default_version": 1, **config}))


_SESSIONS: dict[str, ort.InferenceSession] = {}


def reference(model: str, feeds: dict, version: str = "1") -> dict[str, np.ndarray]:
    """The model's answer computed in this process with ONNX Runtime (one thread, like the workers)."""
    key = f"{model}/{version}"
    sess = _SESSIONS.get(key)
    if sess is None:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = _SESSIONS[key] = ort.InferenceSession(str(MODELS / model / version / "model.onnx"), so,
                                                     providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


class Reports:
    """The latest LoadReport of every worker of a deployment, kept current by a subscription."""

    def __init__(self) -> None:
        self.latest: dict[str, LoadReport] = {}
        self.pids: dict[str, set[int]] = {}
        self._changed = asyncio.Event()
        self._sub = None

    @classmethod
    async def start(cls, nc, prefix: str) -> "Reports":
        self = cls()

        async def cb(msg):
            try:
                r = decode_internal(msg.data)
            except Exception:
                return
            if isinstance(r, LoadReport):
                self.latest[r.worker_id] = r
                self.pids.setdefault(r.worker_id, set()).add(r.pid)
                self._changed.set()

        self._sub = await nc.subscribe(f"{prefix}._load", cb=cb)
        return self

    async def wait(self, predicate, timeout_s: float = 10.0, what: str = "condition") -> None:
        """Wait until ``predicate(latest)`` holds (re-checked on every report)."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self.latest):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; reports: "
                                     f"{ {k: (v.in_flight, v.queue_depth, v.error_rate) for k, v in self.latest.items()} }")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))
            except asyncio.TimeoutError:
                pass

    def computed(self) -> int:
        return sum(r.computed for r in self.latest.values())

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()


async def set_fault(nc, prefix: str, worker_id: str, **fault) -> None:
    """Set a worker's injected faults (``FaultSet`` fields; no arguments clears them); waits for the ack."""
    msg = await nc.request(f"{prefix}._ctl.{worker_id}", encode_internal(FaultSet(**fault)), timeout=5)
    assert msg.data == b"ok", msg.data


async def ingress_counts(nc) -> list[dict]:
    """``counts`` of every ingress replica, from ``$SRV.STATS`` (each instance answers; 0.5 s after the last)."""
    from nats.errors import TimeoutError as NatsTimeout

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish("$SRV.STATS.inferbus-ingress", b"", reply=inbox)
    out = []
    try:
        while True:
            stats = json.loads((await sub.next_msg(timeout=0.5)).data)
            out += [(e.get("data") or {}).get("counts", {}) for e in stats.get("endpoints", [])
                    if e.get("name") == "infer"]
    except NatsTimeout:
        pass
    finally:
        await sub.unsubscribe()
    return out


async def check_worker_error_counts_on_infer_at(nc, prefix: str, model: str, body: dict, code: str) -> None:
    """Send ``body`` (a request the worker answers with the error ``code`` itself) to ``model`` on
    ``<prefix>.ingresses.<id>.infer.<model>``, as an SDK retry at one ingress is sent, and check with real
    ``$SRV.STATS`` requests that the error counts on that ingress's ``infer_at`` endpoint, which took the request, as
    an error answered by the worker, and not on ``infer``."""
    from inferbus.schemas import decode_error

    first = json.loads((await nc.request("$SRV.STATS.inferbus-ingress", b"", timeout=5)).data)
    iid, svc_id = first["metadata"]["ingress_id"], first["id"]

    async def endpoints() -> dict:  # this one ingress's ($SRV.STATS.<name>.<service id>)
        msg = await nc.request(f"$SRV.STATS.inferbus-ingress.{svc_id}", b"", timeout=5)
        return {e["name"]: e for e in json.loads(msg.data)["endpoints"]}

    before = await endpoints()
    msg = await nc.request(f"{prefix}.ingresses.{iid}.infer.{model}", msgpack.packb(body, use_bin_type=True),
                           timeout=5)
    err = decode_error(msg.headers, msg.data)
    assert err is not None and err.code.value == code, (err, msg.data[:200])
    after = before
    for _ in range(250):  # counted when the worker's completion reaches the ingress, after the reply
        after = await endpoints()
        if any(after[e]["num_errors"] > before[e]["num_errors"] for e in ("infer", "infer_at")):
            break
        await asyncio.sleep(0.02)
    assert after["infer_at"]["num_requests"] - before["infer_at"]["num_requests"] == 1, after["infer_at"]
    assert after["infer_at"]["num_errors"] - before["infer_at"]["num_errors"] == 1, (before, after)
    assert "answered by worker" in after["infer_at"]["last_error"], after["infer_at"]
    assert after["infer"]["num_errors"] == before["infer"]["num_errors"], (before["infer"], after["infer"])


async def health_params(client) -> dict:
    return (await client.health(timeout_s=2)).parameters


async def wait_health(client, predicate, timeout_s: float = 10.0, what: str = "health condition") -> dict:
    """Poll the ingress's health reply until ``predicate(parameters)`` holds; returns the parameters."""
    deadline = time.monotonic() + timeout_s
    params = {}
    while time.monotonic() < deadline:
        params = await health_params(client)
        if predicate(params):
            return params
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}: {json.dumps(params, default=str)[:2000]}")


def digits_version_refs(pool: int = 8) -> tuple[list[dict], dict[str, list[dict]]]:
    """``(inputs, {"1": outputs, "2": outputs})``: ``pool`` digits inputs and each version's in-process answers to
    them (the ``refs`` fixture of the model-management tests)."""
    from inferbus.actors import ModelRepository
    from inferbus.loadgen import Workload

    repo = ModelRepository(MODELS, ["digits"])
    w1 = Workload(repo, "digits", "1", pool=pool)
    w2 = Workload(repo, "digits", "2", pool=pool)
    return w1.inputs, {"1": w1.reference, "2": w2.reference}
