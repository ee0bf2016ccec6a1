"""The ingress (request) actor: the public entry point, one queue group of replicas.

For each request on ``<p>.infer.<model>[.<version>]`` it, in order:
decodes (msgpack, or JSON with ``Content-Type: application/json``), validates
against the model's metadata, applies the time budget, looks up the L1 then L2
cache, asks its in-process router for the least-loaded live worker and forwards
the *original* body to that worker with the client's reply subject, so the worker
answers the client directly (3 one-way hops on a miss, 2 on a hit; DESIGN §4).

Every failure is a typed error reply sent at once: unknown model → NOT_FOUND;
bad body or tensor → INVALID_ARGUMENT naming the field; no live worker →
UNAVAILABLE; spent budget → DEADLINE_EXCEEDED; too many outstanding requests or
too large a body → RESOURCE_EXHAUSTED / PAYLOAD_TOO_LARGE. No request kills the
actor: an unexpected exception becomes INTERNAL for that request alone.

In-flight accounting: each forwarded request is kept in a pending table until
the worker's completion notice arrives; when the node reports the worker's
process dead, every pending request it held is answered UNAVAILABLE at once; an
entry older than its deadline plus ``_PENDING_GRACE_S`` is dropped so counts
return to zero even when a worker loses requests.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass

import msgspec

from ..bus import Subjects, connect
from ..bus import headers as H
from ..schemas import (
    DeadlineExceeded, Health, InferbusError, Internal, InvalidArgument, ModelList, ModelMetadata, NotFound,
    PayloadTooLarge, ResourceExhausted, TensorMetadata, Unavailable, decode_request, decode_response, encode,
    encode_error, encode_response, input_to_numpy, is_json,
)
from ..schemas._internal import (
    FORWARD_TAG, CacheFill, DoneNotice, InternalDecodeError, LoadReport, ProcessEvent, decode_internal,
    encode_internal,
)
from ._cache import L1Cache, cache_key
from ._common import announce_ready, run_actor, log, serving_gc, set_affinity
from ._fencing import Fencing
from ._config import IngressConfig
from ._repository import Model, ModelRepository
from ._router import Router

_PENDING_GRACE_S = 1.0
_SWEEP_PERIOD_S = 0.05


@dataclass(slots=True)
class Pending:
    worker_id: str
    reply: str
    deadline: float
    t_fwd: float
    cache_key: str | None
    ttl_ms: int
    content_type: str | None
    request_id: str | None


def model_metadata(model: Model) -> ModelMetadata:
    """OIP v2 model metadata of the default version (-1 for variable dimensions)."""
    mv = model.version(None)
    return ModelMetadata(
        name=model.name, versions=sorted(model.versions, key=int), platform=model.config.platform,
        inputs=[TensorMetadata(t.name, t.datatype, list(t.shape)) for t in mv.inputs],
        outputs=[TensorMetadata(t.name, t.datatype, list(t.shape)) for t in mv.outputs],
    )


class Ingress:
    """The ingress actor; ``run()`` serves until cancelled."""

    def __init__(self, config: IngressConfig) -> None:
        self.config = config
        self.subjects = Subjects(config.bus.prefix)
        self.repo = ModelRepository(config.models_dir, list(config.models) or None)
        self.router = Router(health_timeout_s=config.health_timeout_s)
        self.l1 = L1Cache(config.l1_entries)
        self.fencing = Fencing(self.subjects)
        """Fencing term from the primary region manager's heartbeats, stamped on forwarded requests."""
        self.router.region = config.region
        self.pending: dict[int, Pending] = {}
        self._seq = itertools.count(1)
        self.nc = None
        self.redis = None
        self.counts = {"requests": 0, "ok_forwarded": 0, "errors": 0, "l1_hits": 0, "l2_hits": 0}
        self._meta_cache = {m.name: encode(model_metadata(m)) for m in self.repo}
        self._inputs = {}
        for m in self.repo:
            for v, mv in m.versions.items():
                self._inputs[mv.key] = {t.name: t for t in mv.inputs}
        self._outputs = {mv.key: {t.name for t in mv.outputs} for m in self.repo for mv in m.versions.values()}

    # ---- hot path -----------------------------------------------------------------------------
    async def _on_infer(self, msg) -> None:
        t0 = time.monotonic()
        reply = msg.reply
        if not reply:
            return
        hdrs = msg.headers or {}
        ct = hdrs.get(H.CONTENT_TYPE)
        self.counts["requests"] += 1
        rid = hdrs.get(H.REQUEST_ID)
        try:
            await self._handle(msg, hdrs, ct, t0)
        except InferbusError as err:
            self.counts["errors"] += 1
            await self._error(reply, err, ct, rid)
        except Exception as exc:  # never let a request kill the actor
            self.counts["errors"] += 1
            log(f"ingress {self.config.ingress_id}: internal error: {exc!r}")
            await self._error(reply, Internal(f"ingress failed: {type(exc).__name__}: {exc}"), ct, rid)

    async def _error(self, reply: str, err: InferbusError, ct: str | None, rid: str | None) -> None:
        eh, eb = encode_error(err, ct)
        if rid:
            eh[H.REQUEST_ID] = rid
        await self.nc.publish(reply, eb, headers=eh)

    async def _handle(self, msg, hdrs: dict, ct: str | None, t0: float) -> None:
        deadline = H.deadline_from_headers(hdrs, t0, self.config.default_timeout_ms)
        if deadline <= t0:
            raise DeadlineExceeded("the request's budget (Inferbus-Timeout-Ms) was already spent on arrival")
        model_name, version = self.subjects.parse_infer(msg.subject)
        model = self.repo.get(model_name)
        if model is None:
            raise NotFound(f"unknown model {model_name!r}", field="model")
        mv = model.version(version)
        if mv is None:
            raise NotFound(f"model {model_name!r} has no version {version!r}; versions: {sorted(model.versions)}",
                           field="model_version")
        body = msg.data
        req = decode_request(body, ct)
        t_dec = time.monotonic()
        spec = self._inputs[mv.key]
        arrays = []
        seen = set()
        for i, t in enumerate(req.inputs):
            info = spec.get(t.name)
            if info is None:
                raise InvalidArgument(f"unexpected input {t.name!r}; model {model_name} takes {sorted(spec)}",
                                      field=f"inputs[{i}].name")
            if t.name in seen:
                raise InvalidArgument(f"input {t.name!r} given twice", field=f"inputs[{i}].name")
            seen.add(t.name)
            if t.datatype != info.datatype:
                raise InvalidArgument(f"input {t.name!r} must be {info.datatype}, got {t.datatype}",
                                      field=f"inputs[{i}].datatype")
            if len(t.shape) != len(info.shape) or any(d >= 0 and d != s for d, s in zip(info.shape, t.shape)):
                raise InvalidArgument(f"input {t.name!r} shape {list(t.shape)} does not fit {list(info.shape)}",
                                      field=f"inputs[{i}].shape")
            arrays.append(input_to_numpy(t, field=f"inputs[{i}]"))
        if len(seen) != len(spec):
            missing = sorted(set(spec) - seen)
            raise InvalidArgument(f"missing input(s) {missing}", field="inputs")
        out_names = None
        if req.outputs:
            outs = self._outputs[mv.key]
            out_names = []
            for j, o in enumerate(req.outputs):
                if o.name not in outs:
                    raise InvalidArgument(f"unknown output {o.name!r}; model has {sorted(outs)}",
                                          field=f"outputs[{j}].name")
                out_names.append(o.name)
        t_val = time.monotonic()
        ttl_ms = model.config.cache_ttl_ms
        key = None
        if ttl_ms > 0:
            raw_form = (not is_json(ct)) and (req.inputs[0].raw is not None if req.inputs else True)
            key = cache_key(mv.name, mv.version, req.inputs, arrays, out_names, raw_form, req.parameters)
            cached = self.l1.get(key, t_val)
            if cached is not None:
                self.counts["l1_hits"] += 1
                await self._reply_cached(msg.reply, cached, req.id, ct, hdrs, "l1", t0)
                return
            if self.redis is not None:
                asyncio.create_task(self._l2_then_forward(msg, hdrs, ct, t0, t_dec, t_val, deadline, mv, key,
                                                          ttl_ms, req.id))
                return
        await self._forward(msg, hdrs, ct, t0, t_dec, t_val, deadline, mv, key, ttl_ms)

    async def _l2_then_forward(self, msg, hdrs, ct, t0, t_dec, t_val, deadline, mv, key, ttl_ms, req_id) -> None:
        try:
            try:
                cached = await asyncio.wait_for(self.redis.get(f"{self.subjects.prefix}:{key}"), self.config.l2_timeout_ms / 1000.0)
            except Exception:
                cached = None
            if cached is not None:
                self.counts["l2_hits"] += 1
                self.l1.put(key, cached, ttl_ms)
                await self._reply_cached(msg.reply, cached, req_id, ct, hdrs, "l2", t0)
                return
            await self._forward(msg, hdrs, ct, t0, t_dec, t_val, deadline, mv, key, ttl_ms)
        except InferbusError as err:
            await self._error(msg.reply, err, ct, hdrs.get(H.REQUEST_ID))
        except Exception as exc:
            await self._error(msg.reply, Internal(f"ingress failed: {exc!r}"), ct, hdrs.get(H.REQUEST_ID))

    async def _reply_cached(self, reply: str, cached: bytes, req_id, ct, hdrs, level: str, t0: float) -> None:
        resp = decode_response(cached)
        resp.id = req_id
        params = dict(resp.parameters or {})
        params["cache_hit"] = True
        params["cache_level"] = level
        if self.fencing.term:
            params["term"] = self.fencing.term
        params["timings_us"] = {"total": int((time.monotonic() - t0) * 1e6), "queue": 0, "compute": 0}
        resp.parameters = params
        out_h = {H.CONTENT_TYPE: "application/json" if is_json(ct) else "application/msgpack"}
        rid = hdrs.get(H.REQUEST_ID)
        if rid:
            out_h[H.REQUEST_ID] = rid
        await self.nc.publish(reply, encode_response(resp, ct), headers=out_h)

    async def _forward(self, msg, hdrs, ct, t0, t_dec, t_val, deadline, mv, key, ttl_ms) -> None:
        if len(self.pending) >= self.config.max_pending:
            raise ResourceExhausted(f"ingress {self.config.ingress_id} has {len(self.pending)} requests outstanding",
                                    retry_after_ms=10)
        now = time.monotonic()
        w = self.router.pick(mv.key, now)
        if w is None:
            raise Unavailable(f"no live worker has {mv.key} loaded", field="model")
        seq = next(self._seq)
        fwd = {
            H.MSG_TYPE: FORWARD_TAG, H.SEQ: str(seq), H.INGRESS: self.config.ingress_id,
            H.MODEL: mv.name, H.VERSION: mv.version, H.TIMEOUT_MS: H.format_ms(H.remaining_ms(deadline, now)),
            H.DEADLINE_UNIX_MS: f"{(time.time() + (deadline - now)) * 1000.0:.1f}",
            "Inferbus-Timings": f"decode={int((t_dec - t0) * 1e6)},validate={int((t_val - t_dec) * 1e6)},"
                                f"route={int((now - t_val) * 1e6)},ingress_total={int((now - t0) * 1e6)}",
        }
        if ct:
            fwd[H.CONTENT_TYPE] = ct
        for name in (H.REQUEST_ID, H.TRACEPARENT, H.TRACESTATE):
            v = hdrs.get(name)
            if v:
                fwd[name] = v
        if key is not None:
            fwd[H.CACHE_KEY] = key
        self.fencing.stamp(fwd)
        self.pending[seq] = Pending(w.worker_id, msg.reply, deadline, now, key, ttl_ms, ct, hdrs.get(H.REQUEST_ID))
        self.router.on_sent(w)
        await self.nc.publish(self.subjects.worker(w.worker_id), msg.data, reply=msg.reply, headers=fwd)
        self.counts["ok_forwarded"] += 1

    # ---- control path -------------------------------------------------------------------------
    async def _on_done(self, msg) -> None:
        try:
            notice = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if not isinstance(notice, DoneNotice):
            return
        now = time.monotonic()
        for item in notice.items:
            p = self.pending.pop(item.seq, None)
            if p is None:
                continue
            self.router.on_done(p.worker_id, (now - p.t_fwd) * 1e6, item.server_error)
            if item.ok and item.response is not None and p.cache_key is not None:
                self.l1.put(p.cache_key, item.response, p.ttl_ms, now)
                if self.config.redis_url:
                    await self.nc.publish(self.subjects.cache_fill,
                                          encode_internal(CacheFill(p.cache_key, p.ttl_ms, item.response)))

    async def _on_load(self, msg) -> None:
        try:
            r = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if isinstance(r, LoadReport):
            self.router.on_report(r)

    async def _on_event(self, msg) -> None:
        try:
            ev = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if isinstance(ev, ProcessEvent) and ev.kind == "down" and ev.worker_id:
            self.router.on_down(ev.worker_id, ev.pid)
            await self._fail_pending(ev.worker_id, Unavailable(
                f"worker {ev.worker_id} died ({ev.reason}) holding this request; safe to retry"))

    async def _fail_pending(self, worker_id: str, err: InferbusError) -> None:
        victims = [s for s, p in self.pending.items() if p.worker_id == worker_id]
        for s in victims:
            p = self.pending.pop(s)
            await self._error(p.reply, err, p.content_type, p.request_id)

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_PERIOD_S)
            now = time.monotonic()
            stale = [s for s, p in self.pending.items() if p.deadline + _PENDING_GRACE_S < now]
            for s in stale:
                p = self.pending.pop(s)
                self.router.on_done(p.worker_id, (now - p.t_fwd) * 1e6, server_error=True)
            # a worker that stopped reporting (hung, partitioned) is failed like a dead one
            for w in list(self.router.workers.values()):
                if w.alive and w.last_report and now - w.last_report > self.config.health_timeout_s:
                    await self._fail_pending(w.worker_id, Unavailable(f"worker {w.worker_id} stopped reporting"))

    async def _on_models(self, msg) -> None:
        subj = msg.subject
        ct = (msg.headers or {}).get(H.CONTENT_TYPE)
        if subj == self.subjects.models:
            body = encode(ModelList(models=[model_metadata(m) for m in self.repo]), ct)
        else:
            name = subj[len(self.subjects.models) + 1:]
            model = self.repo.get(name)
            if model is None:
                await self._error(msg.reply, NotFound(f"unknown model {name!r}", field="model"), ct, None)
                return
            body = encode(model_metadata(model), ct)
        await self.nc.publish(msg.reply, body)

    def health(self) -> Health:
        ready_models = self.router.ready_models()
        wanted = {m.version(None).key for m in self.repo}
        return Health(live=True, ready=wanted <= ready_models, parameters={
            "ingress_id": self.config.ingress_id, "models_ready": sorted(ready_models),
            "workers_live": sum(1 for w in self.router.workers.values() if self.router.live(w, time.monotonic())),
            "pending": len(self.pending), "l1_entries": len(self.l1),
        })

    async def _on_health(self, msg) -> None:
        ct = (msg.headers or {}).get(H.CONTENT_TYPE)
        await self.nc.publish(msg.reply, encode(self.health(), ct))

    async def run(self) -> None:
        """Connect, subscribe (internal subjects first, public last), announce readiness, serve."""
        set_affinity(self.config.cpu_affinity)
        self.nc = await connect(self.config.bus, name=f"ingress-{self.config.ingress_id}")
        if self.config.redis_url and self.config.l2_lookup:
            import redis.asyncio as aioredis

            self.redis = aioredis.from_url(self.config.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5,
                                           max_connections=64)
        s = self.subjects
        await self.nc.subscribe(s.load, cb=self._on_load)
        await self.nc.subscribe(s.events, cb=self._on_event)
        await self.nc.subscribe(s.done(self.config.ingress_id), cb=self._on_done)
        await self.fencing.start(self.nc)
        from nats.micro import add_service

        svc = await add_service(self.nc, name="inferbus-ingress", version="0.1.0",
                                description="inferbus ingress (request actor + router)",
                                metadata={"ingress_id": self.config.ingress_id})
        q = s.ingress_queue
        await svc.add_endpoint(name="infer", subject=s.infer_all, queue_group=q,
                               handler=lambda req: self._on_infer(req._msg))
        await svc.add_endpoint(name="models", subject=s.models, queue_group=q, handler=lambda r: self._on_models(r._msg))
        await svc.add_endpoint(name="model", subject=s.models_all, queue_group=q, handler=lambda r: self._on_models(r._msg))
        await svc.add_endpoint(name="health", subject=s.health, queue_group=q, handler=lambda r: self._on_health(r._msg))
        sweeper = asyncio.create_task(self._sweeper())
        await self.nc.flush()
        serving_gc()
        announce_ready()
        try:
            await asyncio.Future()
        finally:
            sweeper.cancel()
            try:
                await svc.stop()
                await self.nc.drain()
            except Exception:
                pass


def main(config_json: str) -> None:
    """Process entry: ``python -m inferbus.actors ingress '<IngressConfig JSON>'``."""
    cfg = IngressConfig.from_json(config_json)
    run_actor(Ingress(cfg).run)
