"""The accelerator worker actor: one per device slot, in its own OS process.

Receives requests forwarded by an ingress on its worker-direct subject
(``<p>._w.<worker_id>``), keeps them in a bounded mailbox, runs the model on a
dedicated inference thread (off the event loop), and replies straight to the
client's reply subject. After replying it tells the forwarding ingress which
requests completed (``<p>._done.<ingress>``), off the hot path.

Mailbox and backpressure: ``mailbox_size`` requests at most; one more is shed at
once with RESOURCE_EXHAUSTED. A request whose budget is spent when it is taken
from the mailbox is answered DEADLINE_EXCEEDED and never computed.

Zero-wait batching (DESIGN §4): when several requests for the same model version
and outputs are already queued, they run as one batch (up to the model's
``max_batch_size``) without waiting for more.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import msgspec

from ..accelerators import InferenceError, get_backend
from ..bus import Subjects, connect
from ..bus import headers as H
from ..schemas import (
    DeadlineExceeded, InferbusError, InferResponse, Internal, InvalidArgument, PayloadTooLarge, ResourceExhausted,
    decode_request, encode_error, encode_response, input_to_numpy, is_json, output_from_numpy,
)
from ..schemas._internal import FORWARD_TAG, DoneItem, DoneNotice, LoadReport, encode_internal
from ._common import announce_ready, run_actor, log, serving_gc, set_affinity
from ._config import WorkerConfig
from ._repository import ModelRepository

_EWMA_ALPHA = 0.2


@dataclass(slots=True)
class Job:
    reply: str
    body: bytes
    hdrs: dict
    deadline: float
    t_recv: float
    model_key: str
    seq: int
    ingress: str | None
    want_body: bool
    cache_key: str | None = None


@dataclass(slots=True)
class Outcome:
    job: Job
    hdrs: dict
    body: bytes
    ok: bool
    server_error: bool = False
    service_us: int = 0
    response_msgpack: bytes | None = None
    executed: bool = False
    """The model ran for this request (audit)."""


@dataclass
class _Stats:
    received: int = 0
    completed: int = 0
    errors: int = 0
    shed: int = 0
    expired: int = 0
    in_flight: int = 0
    ewma_service_us: float = 0.0


class Worker:
    """The worker actor. ``run()`` serves until cancelled or SIGTERM (drain)."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.subjects = Subjects(config.bus.prefix)
        self.repo = ModelRepository(config.models_dir, list(config.models) or None)
        self.backend = get_backend(config.backend)
        self.sessions = {}
        self.versions = {}
        self.max_batch: dict[str, int] = {}
        for model in self.repo:
            for mv in model.versions.values():
                sess = self.backend.load(mv.path, precision=config.precision, device_index=config.device_index)
                mb = config.max_batch_size if config.max_batch_size is not None else model.config.max_batch_size
                sess.warmup((1, 2) if mb > 1 else (1,))
                self.sessions[mv.key] = sess
                self.versions[mv.key] = mv
                self.max_batch[mv.key] = mb
        self.device = next(iter(self.sessions.values())).device if self.sessions else None
        self.mailbox: queue.Queue[Job] = queue.Queue(maxsize=config.mailbox_size)
        self.stats = _Stats()
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self.nc = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._outbox: asyncio.Queue | None = None

    # ---- loop side -------------------------------------------------------------------------
    async def _on_request(self, msg) -> None:
        t_recv = time.monotonic()
        hdrs = msg.headers or {}
        reply = msg.reply
        if not reply:
            return
        self.stats.received += 1
        ct = hdrs.get(H.CONTENT_TYPE)
        if hdrs.get(H.MSG_TYPE) != FORWARD_TAG:
            await self._publish_error(reply, InvalidArgument(
                f"worker subjects take messages tagged {H.MSG_TYPE}: {FORWARD_TAG}", field=f"headers.{H.MSG_TYPE}"), ct)
            return
        deadline = H.deadline_from_headers(hdrs, t_recv)
        try:
            seq = int(hdrs.get(H.SEQ, "-1"))
        except ValueError:
            seq = -1
        model_key = f"{hdrs.get(H.MODEL, '')}:{hdrs.get(H.VERSION, '')}"
        job = Job(reply, msg.data, hdrs, deadline, t_recv, model_key, seq, hdrs.get(H.INGRESS),
                  hdrs.get(H.CACHE_KEY) is not None, hdrs.get(H.CACHE_KEY))
        if model_key not in self.sessions:
            await self._finish_now(job, InvalidArgument(f"model {model_key} is not loaded on worker {self.config.worker_id}"), server_error=True)
            return
        if deadline <= t_recv or H.wall_deadline_passed(hdrs):
            self.stats.expired += 1
            await self._finish_now(job, DeadlineExceeded("budget spent before the worker received the request"))
            return
        try:
            self.mailbox.put_nowait(job)
        except queue.Full:
            self.stats.shed += 1
            await self._finish_now(job, ResourceExhausted(
                f"worker {self.config.worker_id} mailbox full ({self.config.mailbox_size})", retry_after_ms=10))
            return
        with self._stats_lock:
            self.stats.in_flight += 1

    async def _publish_error(self, reply: str, err: InferbusError, ct: str | None, request_id: str | None = None) -> None:
        hdrs, body = encode_error(err, ct)
        if request_id:
            hdrs[H.REQUEST_ID] = request_id
        await self.nc.publish(reply, body, headers=hdrs)

    async def _finish_now(self, job: Job, err: InferbusError, server_error: bool = False) -> None:
        hdrs, body = encode_error(err, job.hdrs.get(H.CONTENT_TYPE))
        rid = job.hdrs.get(H.REQUEST_ID)
        if rid:
            hdrs[H.REQUEST_ID] = rid
        await self._publish_outcomes([Outcome(job, hdrs, body, ok=False, server_error=server_error)], count=False)

    async def _publish_outcomes(self, outcomes: list[Outcome], count: bool = True) -> None:
        nc = self.nc
        done: dict[str, list[DoneItem]] = {}
        for o in outcomes:
            try:
                await nc.publish(o.job.reply, o.body, headers=o.hdrs)
            except Exception as exc:  # e.g. payload over max_payload
                err = PayloadTooLarge(f"response of {len(o.body)} bytes exceeds the server's max_payload "
                                      f"({nc.max_payload})") if len(o.body) > nc.max_payload else Internal(str(exc))
                eh, eb = encode_error(err, o.job.hdrs.get(H.CONTENT_TYPE))
                await nc.publish(o.job.reply, eb, headers=eh)
                o.ok, o.response_msgpack = False, None
            if o.job.ingress is not None and o.job.seq >= 0:
                done.setdefault(o.job.ingress, []).append(
                    DoneItem(o.job.seq, o.ok, o.server_error, o.service_us, o.response_msgpack if o.job.want_body else None))
        for ingress, items in done.items():
            await nc.publish(self.subjects.done(ingress),
                             encode_internal(DoneNotice(self.config.worker_id, items)))
        if self.config.audit:
            ids = [o.job.hdrs.get(H.REQUEST_ID, "") for o in outcomes if o.executed]
            if ids:
                await nc.publish(self.subjects.audit, msgspec.msgpack.encode(ids))

    async def _outbox_pump(self) -> None:
        assert self._outbox is not None
        while True:
            outcomes = await self._outbox.get()
            await self._publish_outcomes(outcomes)

    def _report(self) -> LoadReport:
        s = self.stats
        d = self.device
        return LoadReport(
            worker_id=self.config.worker_id, pid=os.getpid(), device_kind=d.kind if d else "cpu",
            device_name=d.name if d else "", backend=self.config.backend, precision=self.config.precision,
            models=sorted(self.sessions), queue_depth=self.mailbox.qsize(), in_flight=s.in_flight,
            capacity=self.config.mailbox_size, ewma_service_us=s.ewma_service_us, completed=s.completed,
            errors=s.errors, region=self.config.region, interval_ms=self.config.report_interval_ms,
        )

    async def _reporter(self) -> None:
        period = self.config.report_interval_ms / 1000.0
        while True:
            await self.nc.publish(self.subjects.load, encode_internal(self._report()))
            await asyncio.sleep(period)

    async def run(self) -> None:
        """Connect, subscribe, announce readiness, serve until cancelled."""
        set_affinity(self.config.cpu_affinity)
        self.loop = asyncio.get_running_loop()
        self._outbox = asyncio.Queue()
        self.nc = await connect(self.config.bus, name=f"worker-{self.config.worker_id}")
        from nats.micro import add_service

        svc = await add_service(self.nc, name="inferbus-worker", version="0.1.0",
                                description="inferbus accelerator worker",
                                metadata={"worker_id": self.config.worker_id, "backend": self.config.backend,
                                          "device": self.device.name if self.device else ""})
        await svc.add_endpoint(name="infer", subject=self.subjects.worker(self.config.worker_id),
                               handler=lambda req: self._on_request(req._msg),
                               queue_group=f"{self.config.bus.prefix}.w.{self.config.worker_id}")
        thread = threading.Thread(target=self._compute_loop, name="inference", daemon=True)
        thread.start()
        tasks = [asyncio.create_task(self._outbox_pump()), asyncio.create_task(self._reporter())]
        await self.nc.flush()
        serving_gc()
        announce_ready()
        try:
            await asyncio.Future()
        finally:
            self._stop.set()
            for t in tasks:
                t.cancel()
            try:
                await svc.stop()
                await self.nc.drain()
            except Exception:
                pass

    # ---- inference thread --------------------------------------------------------------------
    def _compute_loop(self) -> None:
        mailbox = self.mailbox
        while not self._stop.is_set():
            try:
                first = mailbox.get(timeout=0.2)
            except queue.Empty:
                continue
            jobs = [first]
            limit = max(self.max_batch.get(first.model_key, 0), 1)
            # zero-wait: take what is already queued, never wait for more
            while len(jobs) < 256:
                try:
                    jobs.append(mailbox.get_nowait())
                except queue.Empty:
                    break
            if self.config.compute_delay_ms > 0:
                time.sleep(self.config.compute_delay_ms / 1000.0)
            outcomes: list[Outcome] = []
            groups: dict[tuple, list[tuple[Job, object, dict]]] = {}
            for job in jobs:
                try:
                    prepared = self._prepare(job)
                except InferbusError as err:
                    outcomes.append(self._error_outcome(job, err))
                    continue
                if prepared is None:
                    continue
                req, arrays = prepared
                if job.deadline <= time.monotonic() or H.wall_deadline_passed(job.hdrs):
                    self.stats.expired += 1
                    outcomes.append(self._error_outcome(job, DeadlineExceeded("budget spent while queued at the worker")))
                    continue
                outs = tuple(o.name for o in req.outputs) if req.outputs else ()
                groups.setdefault((job.model_key, outs), []).append((job, req, arrays))
            for (model_key, outs), items in groups.items():
                limit = max(self.max_batch.get(model_key, 0), 1)
                for i in range(0, len(items), limit):
                    outcomes.extend(self._run_group(model_key, list(outs) or None, items[i:i + limit]))
            with self._stats_lock:
                self.stats.in_flight -= len(jobs)
            if outcomes:
                self.loop.call_soon_threadsafe(self._outbox.put_nowait, outcomes)

    def _prepare(self, job: Job):
        ct = job.hdrs.get(H.CONTENT_TYPE)
        req = decode_request(job.body, ct)
        mv = self.versions[job.model_key]
        arrays = {}
        for i, t in enumerate(req.inputs):
            arrays[t.name] = input_to_numpy(t, field=f"inputs[{i}]")
        for info in mv.inputs:
            if info.name not in arrays:
                raise InvalidArgument(f"missing input {info.name!r}", field="inputs")
        return req, arrays

    def _error_outcome(self, job: Job, err: InferbusError, server_error: bool = False) -> Outcome:
        if server_error:
            self.stats.errors += 1
        hdrs, body = encode_error(err, job.hdrs.get(H.CONTENT_TYPE))
        rid = job.hdrs.get(H.REQUEST_ID)
        if rid:
            hdrs[H.REQUEST_ID] = rid
        return Outcome(job, hdrs, body, ok=False, server_error=server_error)

    def _run_group(self, model_key: str, outs: list[str] | None, items) -> list[Outcome]:
        sess = self.sessions[model_key]
        t0 = time.monotonic()
        results: list[dict[str, np.ndarray]] | None = None
        if len(items) > 1:
            try:
                feeds = {name: np.concatenate([a[name] for _, _, a in items], axis=0) for name in items[0][2]}
                merged = sess.infer(feeds, outs)
                sizes = [next(iter(a.values())).shape[0] for _, _, a in items]
                bounds = np.cumsum(sizes)[:-1]
                results = [dict() for _ in items]
                for name, arr in merged.items():
                    for r, part in zip(results, np.split(arr, bounds, axis=0)):
                        r[name] = part
            except (InferenceError, ValueError):
                results = None  # fall back to one by one (e.g. shapes that do not stack)
        outcomes = []
        if results is None:
            results = []
            for job, req, arrays in items:
                try:
                    results.append(sess.infer(arrays, outs))
                except InferenceError as exc:
                    results.append(exc)
        t1 = time.monotonic()
        compute_us = int((t1 - t0) * 1e6)
        per_us = compute_us / len(items)
        s = self.stats
        s.ewma_service_us = per_us if s.ewma_service_us == 0 else (1 - _EWMA_ALPHA) * s.ewma_service_us + _EWMA_ALPHA * per_us
        mv = self.versions[model_key]
        for (job, req, arrays), res in zip(items, results):
            if isinstance(res, Exception):
                failed = self._error_outcome(job, Internal(f"inference failed: {res}"), server_error=True)
                failed.executed = True
                outcomes.append(failed)
                continue
            outcomes.append(self._encode(job, req, mv, res, t0, compute_us, len(items)))
            s.completed += 1
        return outcomes

    def _encode(self, job: Job, req, mv, res: dict[str, np.ndarray], t0: float, compute_us: int, batch: int) -> Outcome:
        ct = job.hdrs.get(H.CONTENT_TYPE)
        json_ct = is_json(ct)
        raw = (not json_ct) and (req.inputs[0].raw is not None if req.inputs else True)
        t_enc = time.monotonic()
        outputs = [output_from_numpy(name, arr, raw=raw) for name, arr in res.items()]
        timings = _parse_timings(job.hdrs.get("Inferbus-Timings"))
        timings["queue"] = int((t0 - job.t_recv) * 1e6)
        timings["compute"] = compute_us
        params = {
            "worker_id": self.config.worker_id, "device": self.device.name if self.device else "",
            "backend": self.config.backend, "precision": self.config.precision, "cache_hit": False,
            "region": self.config.region, "term": int(job.hdrs.get("Inferbus-Term", "0") or 0),
            "batch_size": batch, "timings_us": timings,
        }
        resp = InferResponse(model_name=mv.name, model_version=mv.version, outputs=outputs, id=req.id, parameters=params)
        timings["encode"] = int((time.monotonic() - t_enc) * 1e6)
        timings["worker_total"] = int((time.monotonic() - job.t_recv) * 1e6)
        body = encode_response(resp, ct)
        hdrs = {H.CONTENT_TYPE: "application/json" if json_ct else "application/msgpack"}
        rid = job.hdrs.get(H.REQUEST_ID)
        if rid:
            hdrs[H.REQUEST_ID] = rid
        cached = None
        if job.want_body:
            cached = body if not json_ct else encode_response(resp, None)
        return Outcome(job, hdrs, body, ok=True, service_us=compute_us, response_msgpack=cached, executed=True)


def _parse_timings(value: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    if value:
        for part in value.split(","):
            k, _, v = part.partition("=")
            try:
                out[k] = int(v)
            except ValueError:
                pass
    return out


def main(config_json: str) -> None:
    """Process entry: ``python -m inferbus.actors worker '<WorkerConfig JSON>'``."""
    cfg = WorkerConfig.from_json(config_json)
    run_actor(Worker(cfg).run)
