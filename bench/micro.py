"""Micro-benchmarks behind the proposals in docs/performance.md ("Profile and next optimizations").

    python -m bench.micro [--json bench/results/micro.json]

Each measures one cost of the hot path in isolation, in this process, against a
real nats-server where the bus is involved:

CPU costs are thread CPU time (immune to other processes on a shared box), the
least of several repetitions; latencies are wall time.

* ``publish_us``: nats-py ``publish()`` per message (no syscall: the flusher
  writes once at the end) with 0, 1, the SDK's 2 and the ingress's forward
  header set (10 headers), with and without subject validation;
  and through :func:`inferbus.bus.publish_raw` with the header block encoded once;
* ``header_parse_us``: nats-py's parse of a received message's headers, same sets;
* ``handoff_us``: one request's trip loop → inference thread → loop
  (``queue.Queue`` + ``call_soon_threadsafe``, the worker's design) against
  running the model inline on the loop, at concurrency 1;
* ``codec_us``: the ingress's and worker's per-request Python work
  (decode_request, tensor view, cache key, encode_response).

The results go to stdout as JSON, and to ``--json`` too when given. A ``--json``
that cannot be written (its folder missing, not a folder or not writable; the
path a folder) is refused before anything runs: one line ``error: ...`` on
stderr, exit status 2 (a missing folder is not made).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

from inferbus._paths import output_file_problem

ROOT = Path(__file__).resolve().parents[1]

FWD_HEADERS = {
    "Inferbus-Msg": "inferbus.v1.forward", "Inferbus-Seq": "123456", "Inferbus-Ingress": "n1-i0",
    "Inferbus-Model": "digits", "Inferbus-Version": "1", "Inferbus-Timeout-Ms": "998.123",
    "Inferbus-Deadline-Unix-Ms": "1795000000123.456",
    "Inferbus-Timings": "decode=12,validate=9,route=7,ingress_total=40",
    "Inferbus-Request-Id": "5f0c4bd1a3a64b8e9f3a2d7c1e0b9a88", "Inferbus-Cache-Key": "0123456789abcdef0123456789abcdef",
}
CLIENT_HEADERS = {"Inferbus-Request-Id": "5f0c4bd1a3a64b8e9f3a2d7c1e0b9a88", "Inferbus-Timeout-Ms": "1000.000"}


def _per_op(fn, n: int, reps: int = 5) -> float:
    """Least over ``reps`` of the mean thread-CPU µs per call of ``fn`` over ``n`` calls.

    Thread CPU time (not wall time) so that other processes on a shared box do not
    count; the least of several repetitions because interference only adds."""
    out = []
    for _ in range(reps):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        out.append((time.thread_time() - t0) * 1e6 / n)
    return round(min(out), 2)


async def _per_op_async(fn, n: int, reps: int = 7, between=None) -> float:
    out = []
    for _ in range(reps):
        t0 = time.thread_time()
        for _ in range(n):
            await fn()
        out.append((time.thread_time() - t0) * 1e6 / n)
        if between is not None:
            await between()
    return round(min(out), 2)


async def bus_costs(url: str) -> dict:
    import nats

    from inferbus.bus import header_block, publish_raw

    body = b"x" * 330
    res: dict = {"publish_us": {}, "header_parse_us": {}}
    for skip in (False, True):
        nc = await nats.connect(url, skip_subject_validation=skip, pending_size=1 << 30)
        for name, hdrs in (("none", None), ("1 header", {"Content-Type": "application/msgpack"}),
                           ("client (2)", CLIENT_HEADERS), ("forward (10)", FWD_HEADERS)):
            async def pub():
                await nc.publish("bench.sink.x", body, reply="_INBOX.abc.123", headers=hdrs)

            await _per_op_async(pub, 2000, 1, nc.flush)
            res["publish_us"][f"{name}{', no subject check' if skip else ''}"] = await _per_op_async(pub, 5000,
                                                                                                     between=nc.flush)
            if not skip:
                block = header_block(hdrs) if hdrs else None

                async def pub_raw():
                    await publish_raw(nc, "bench.sink.x", body, reply="_INBOX.abc.123", headers=block)

                res["publish_us"][f"{name}, publish_raw (block encoded once)"] = await _per_op_async(
                    pub_raw, 5000, between=nc.flush)
        if not skip:
            for name, hdrs in (("1 header", {"Content-Type": "application/msgpack"}), ("client (2)", CLIENT_HEADERS),
                               ("forward (10)", FWD_HEADERS)):
                raw = b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in hdrs.items()) + b"\r\n"

                async def parse():
                    await nc._process_headers(raw)

                res["header_parse_us"][name] = await _per_op_async(parse, 20000)
        await nc.close()
    return res


async def handoff_costs(model_path: Path, feeds: list[dict], n: int = 3000) -> dict:
    from inferbus.accelerators import OnnxRuntimeBackend

    sess = OnnxRuntimeBackend().load(model_path)
    loop = asyncio.get_running_loop()
    q: queue.Queue = queue.Queue(maxsize=1024)
    stop = threading.Event()

    def compute():
        while not stop.is_set():
            try:
                fut, f = q.get(timeout=0.2)
            except queue.Empty:
                continue
            out = sess.infer(f)
            loop.call_soon_threadsafe(fut.set_result, out)

    th = threading.Thread(target=compute, daemon=True)
    th.start()

    def lat(samples):
        s = sorted(samples)
        return {"p50_us": round(s[len(s) // 2], 1), "p99_us": round(s[int(len(s) * 0.99)], 1)}

    thread_rt, inline_rt = [], []
    for i in range(n):
        f = feeds[i % len(feeds)]
        t0 = time.perf_counter()
        fut = loop.create_future()
        q.put_nowait((fut, f))
        await fut
        thread_rt.append((time.perf_counter() - t0) * 1e6)
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        sess.infer(f)
        inline_rt.append((time.perf_counter() - t0) * 1e6)
        await asyncio.sleep(0)
    stop.set()
    th.join()
    return {"thread_queue_roundtrip": lat(thread_rt), "inline_on_loop": lat(inline_rt)}


def codec_costs(model_path: Path, feeds: list[dict]) -> dict:
    from inferbus.accelerators import OnnxRuntimeBackend
    from inferbus.actors._cache import cache_key
    from inferbus.schemas import (
        InferRequest, InferResponse, decode_request, decode_response, encode_request, encode_response,
        input_from_numpy, input_to_numpy, output_from_numpy,
    )

    sess = OnnxRuntimeBackend().load(model_path)
    f = feeds[0]
    body = encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in f.items()]))
    req = decode_request(body)
    arrays = [input_to_numpy(t, field="inputs[0]") for t in req.inputs]
    out = sess.infer(f)
    params = {"worker_id": "n1-w0", "device": "cpu0", "backend": "onnxruntime", "precision": "fp32",
              "cache_hit": False, "region": "", "term": 0, "batch_size": 1,
              "timings_us": {"decode": 12, "validate": 9, "route": 7, "ingress_total": 40, "queue": 50,
                             "compute": 35, "encode": 10, "worker_total": 120}}
    resp = InferResponse(model_name="digits", model_version="1",
                         outputs=[output_from_numpy(k, v, raw=True) for k, v in out.items()], parameters=params)
    resp_body = encode_response(resp)
    return {
        "decode_request": _per_op(lambda: decode_request(body), 20000),
        "input_to_numpy": _per_op(lambda: input_to_numpy(req.inputs[0], field="inputs[0]"), 20000),
        "cache_key": _per_op(lambda: cache_key("digits", "1", req.inputs, arrays, None, True, None), 20000),
        "model_infer": _per_op(lambda: sess.infer(f), 3000),
        "outputs_from_numpy": _per_op(lambda: [output_from_numpy(k, v, raw=True) for k, v in out.items()], 20000),
        "encode_response": _per_op(lambda: encode_response(resp), 20000),
        "decode_response": _per_op(lambda: decode_response(resp_body), 20000),
        "request_bytes": len(body), "response_bytes": len(resp_body),
    }


async def run() -> dict:
    from inferbus.actors import ModelRepository
    from inferbus.bus import EmbeddedNats
    from inferbus.loadgen import Workload

    repo = ModelRepository(str(ROOT / "models"), ["digits"])
    work = Workload(repo, "digits", "1", pool=64)
    path = work.mv.path
    out = {"codec_us": codec_costs(path, work.inputs)}
    out["handoff_us"] = await handoff_costs(path, work.inputs)
    nats = EmbeddedNats(jetstream=False)
    nats.start()
    try:
        out.update(await bus_costs(nats.url))
    finally:
        nats.stop()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.micro", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path,
                   help="write the results here too (its folder must exist; checked before anything runs)")
    a = p.parse_args(argv)
    if a.json is not None and (problem := output_file_problem(a.json, "micro.json")):
        print(f"error: --json {a.json}: {problem}", file=sys.stderr)  # before any run: its results are not lost
        return 2
    import uvloop

    res = uvloop.run(run())
    print(json.dumps(res, indent=1))
    if a.json:
        try:
            a.json.write_text(json.dumps(res, indent=1))
        except OSError as exc:  # checked before the run; changed since (removed, full): one line, not a traceback
            print(f"error: --json {a.json}: cannot write it: {exc.strerror or exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
