#!/usr/bin/env python
"""Issue 4 measurements on a GPU host, one process, results as JSON (docs/performance.md "GPU worker (H200)").

Sections (each independent: one failing records its traceback and the rest still run):

* ``env``        versions and the GPU.
* ``cuda``       our pinned buffer pool, stream pool, device buffers and a captured CUDA graph through
                 cuda-python (``inferbus.accelerators._cuda``): correctness, pinned vs pageable copy times.
* ``precision``  the load-time check of every JAX precision on the GPU (and ORT int8 on CPU) for the three
                 real models vs the FP32 ONNX Runtime reference: what each worker would serve.
* ``latency``    batch-1 latency of the same models: JAX session (host→device→host, as a worker calls it),
                 JAX on-device only, ONNX Runtime CPU, torch eager, torch CUDA-graph replay with pinned copies
                 inside the graph (the GPU floor); batch 64 throughput.
* ``hlo``        XLA's HLO for the digits MLP after optimization (fusions), written to mlp_hlo_optimized.txt.
* ``serve``      ``inferbus`` deployments through an embedded nats-server: a JAX GPU worker alone (c=1
                 latency, answers checked against the FP32 reference, plus a raw NATS echo floor), then JAX GPU +
                 ONNX Runtime CPU workers under concurrency (which worker served what).

Usage: ``python bench/accel_gpu.py --out DIR [--quick]``. Runs on a CPU-only machine too (GPU parts record
why they were skipped), which is how it is checked before a device run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch, cupy and JAX share the GPU here

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODELS = ROOT / "models"
RESULTS: dict = {}
SESS: dict = {}
N = 2000


def pct(samples_s) -> dict:
    a = np.asarray(samples_s, dtype=np.float64) * 1e6
    return {"n": int(a.size), "p50_us": round(float(np.percentile(a, 50)), 1),
            "p90_us": round(float(np.percentile(a, 90)), 1), "p99_us": round(float(np.percentile(a, 99)), 1),
            "mean_us": round(float(a.mean()), 1), "min_us": round(float(a.min()), 1)}


def timeit(fn, n=N, warm=100, busy_gap_s: float = 0.0) -> dict:
    """p50/p90/p99/mean/min of ``n`` calls after ``warm``; ``busy_gap_s``: spin that long before each call (the
    CPU stays awake, the GPU idles, as between requests of a closed loop at c=1)."""
    return pct(samples(fn, n, warm, busy_gap_s))


def samples(fn, n=N, warm=100, busy_gap_s: float = 0.0) -> list[float]:
    """Seconds of each of ``n`` calls after ``warm`` (see :func:`timeit`)."""
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(n):
        if busy_gap_s:
            end = time.perf_counter() + busy_gap_s
            while time.perf_counter() < end:
                pass
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return ts


def test_rows(model: str) -> np.ndarray:
    return np.load(MODELS / model / "data" / "test.npz")["X"].astype(np.float32)


def ort_ref(model: str, x: np.ndarray) -> dict:
    import onnxruntime as ort

    s = ort.InferenceSession(str(MODELS / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, {s.get_inputs()[0].name: x})))


def has_gpu() -> bool:
    try:
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    except Exception:
        return False


def section(name, fn, out: Path) -> None:
    t0 = time.perf_counter()
    try:
        RESULTS[name] = fn()
    except Exception:
        RESULTS[name] = {"error": traceback.format_exc()[-3000:]}
    RESULTS.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
    (out / "gpu_accel.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    print(f"[{name}] {RESULTS['seconds'][name]}s {'ERROR' if 'error' in (RESULTS[name] or {}) else 'ok'}", flush=True)


# ------------------------------------------------------------------------------------------ sections
def sec_env() -> dict:
    out = {"python": platform.python_version(), "machine": platform.machine(), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    for mod in ("jax", "jaxlib", "onnxruntime", "numpy", "torch", "cupy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as exc:
            out[mod] = f"absent ({type(exc).__name__})"
    try:
        import jax

        out["jax_devices"] = [f"{d.platform}:{d.id}:{getattr(d, 'device_kind', '')}" for d in jax.devices()]
    except Exception as exc:
        out["jax_devices"] = str(exc)
    try:
        from importlib.metadata import version

        out["cuda-bindings"] = version("cuda-bindings")
    except Exception:
        out["cuda-bindings"] = "absent"
    out["cpu_count"] = os.cpu_count()
    return out


def sec_cuda() -> dict:
    from inferbus.accelerators import BackendUnavailable, PoolExhausted
    from inferbus.accelerators._cuda import (
        CudaGraph, DeviceBuffer, PinnedBufferPool, StreamPool, check, cudart, memcpy_async,
    )

    try:
        rt = cudart()
        n = check(rt.cudaGetDeviceCount(), "cudaGetDeviceCount")
    except (BackendUnavailable, Exception) as exc:
        return {"skipped": f"no CUDA here: {exc}"}
    out = {"devices": n}
    t0 = time.perf_counter()
    pool = PinnedBufferPool()
    out["pool_alloc_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    out["pool_total_bytes"] = pool.total_bytes
    out["pool_pinned"] = pool.pinned
    # exhaustion: 64 KiB class has 64, then it spills to 1 MiB (16) and 16 MiB (4), then PoolExhausted
    held = []
    try:
        while True:
            held.append(pool.acquire(1000))
    except PoolExhausted:
        out["acquired_before_exhausted"] = len(held)
    for b in held:
        b.release()
    out["stats_after"] = [s.__dict__ for s in pool.stats()]
    streams = StreamPool(4)
    dev = DeviceBuffer(1 << 20)
    ok = True
    with streams.stream() as s, pool.buffer(1 << 20) as hin, pool.buffer(1 << 20) as hout:
        src = hin.view(np.uint8, (1 << 20,))
        src[:] = np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8)
        memcpy_async(dev.ptr, hin.ptr, 1 << 20, "h2d", s)
        memcpy_async(hout.ptr, dev.ptr, 1 << 20, "d2h", s)
        streams.synchronize(s)
        ok = bool(np.array_equal(hout.view(np.uint8, (1 << 20,)), src))
        out["roundtrip_1MiB_equal"] = ok

        def rt_pinned(nbytes):
            memcpy_async(dev.ptr, hin.ptr, nbytes, "h2d", s)
            memcpy_async(hout.ptr, dev.ptr, nbytes, "d2h", s)
            streams.synchronize(s)

        page_in = np.zeros(1 << 20, np.uint8)
        page_out = np.zeros(1 << 20, np.uint8)

        def rt_pageable(nbytes):
            memcpy_async(dev.ptr, page_in.ctypes.data, nbytes, "h2d", s)
            memcpy_async(page_out.ctypes.data, dev.ptr, nbytes, "d2h", s)
            streams.synchronize(s)

        out["h2d_d2h_256B_pinned"] = timeit(lambda: rt_pinned(256))
        out["h2d_d2h_256B_pageable"] = timeit(lambda: rt_pageable(256))
        out["h2d_d2h_1MiB_pinned"] = timeit(lambda: rt_pinned(1 << 20), n=500)
        out["h2d_d2h_1MiB_pageable"] = timeit(lambda: rt_pageable(1 << 20), n=500)
        # a CUDA graph of the two copies, replayed with one launch
        g = CudaGraph(s, lambda st: (memcpy_async(dev.ptr, hin.ptr, 256, "h2d", st),
                                     memcpy_async(hout.ptr, dev.ptr, 256, "d2h", st)))
        src[:256] = 7
        g.launch(s)
        streams.synchronize(s)
        out["graph_copy_equal"] = bool((hout.view(np.uint8, (256,)) == 7).all())

        def replay():
            g.launch(s)
            streams.synchronize(s)

        out["graph_h2d_d2h_256B"] = timeit(replay)
        g.close()
    out["streams_lent"] = streams.lent
    dev.free()
    streams.close()
    pool.close()
    return out


def sec_precision() -> dict:
    from inferbus.accelerators import get_backend, load_checked

    gpu = has_gpu()
    kind = "gpu" if gpu else "cpu"
    out = {"device_kind": kind}
    for model in ("digits", "digits_cnn", "fraud"):
        ref = MODELS / model / "data" / "test.npz"
        path = MODELS / model / "1" / "model.onnx"
        for be, precs, dk in (("jax", ("fp32", "fp16", "bf16", "int8"), kind), ("onnxruntime", ("int8",), "cpu")):
            for p in precs:
                t0 = time.perf_counter()
                sess = load_checked(get_backend(be), path, precision=p, device_kind=dk, reference_path=ref)
                d = sess.report.to_dict()
                d["load_s"] = round(time.perf_counter() - t0, 2)
                d["device"] = sess.device.to_dict()
                out[f"{model}/{be}/{p}"] = d
                if be == "jax" and p in ("fp32", "fp16") and model in ("digits", "digits_cnn"):
                    SESS[(model, p)] = sess
                else:
                    sess.close()
    return out


def sec_latency() -> dict:
    import jax

    from inferbus.accelerators import get_backend, load_checked

    out = {}
    for model in ("digits", "digits_cnn"):
        X = test_rows(model)
        x1 = X[:1]
        ref = ort_ref(model, X[:64])
        ort = load_checked(get_backend("onnxruntime"), MODELS / model / "1" / "model.onnx", precision="fp32")
        ort.warmup((1,))
        out[f"{model}/onnxruntime-cpu/fp32/b1"] = timeit(lambda: ort.infer({"pixels": x1}))
        for p in ("fp32", "fp16"):
            sess = SESS.get((model, p))
            if sess is None:
                continue
            sess.warmup((1, 64))
            out[f"{model}/jax-{sess.device.kind}/{sess.precision}/b1 session (host->dev->host)"] = timeit(
                lambda: sess.infer({"pixels": x1}))
            inner = sess.inner
            compiled = inner._compiled[1]
            xd = jax.device_put({"pixels": x1}, inner._sharding)
            out[f"{model}/jax-{sess.device.kind}/{sess.precision}/b1 on-device"] = timeit(
                lambda: compiled(xd)["logits"].block_until_ready())
            t = timeit(lambda: sess.infer({"pixels": X[:64]}), n=300)
            t["rows_per_s"] = round(64 / (t["p50_us"] / 1e6))
            out[f"{model}/jax-{sess.device.kind}/{sess.precision}/b64 session"] = t
            got = sess.infer({"pixels": X[:64]})
            err = float(np.abs(got["probabilities"] - ref["probabilities"]).max())
            out[f"{model}/jax-{sess.device.kind}/{sess.precision}/max_abs_err_prob_vs_ort"] = err
    out.update(torch_reference())
    return out


def torch_reference() -> dict:
    """Same models in torch (weights from the ONNX files): eager and CUDA-graph replay at batch 1."""
    try:
        import onnx
        import torch
        from onnx import numpy_helper
    except Exception as exc:
        return {"torch": f"skipped: {exc}"}
    if not torch.cuda.is_available():
        return {"torch": "skipped: no CUDA"}
    out = {}
    dev = torch.device("cuda")
    for model in ("digits", "digits_cnn"):
        W = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy())
             for i in onnx.load(str(MODELS / model / "1" / "model.onnx")).graph.initializer}
        X = test_rows(model)
        ref = ort_ref(model, X[:1])["probabilities"]
        for dt in (torch.float32, torch.float16):
            w = {k: v.to(dev, dt) if v.dtype.is_floating_point else v for k, v in W.items()}

            def fwd(x):
                if model == "digits":
                    h = torch.relu(torch.addmm(w["fc0.bias"], x, w["fc0.weight"]))
                    h = torch.relu(torch.addmm(w["fc1.bias"], h, w["fc1.weight"]))
                    logits = torch.addmm(w["fc2.bias"], h, w["fc2.weight"])
                else:
                    h = x.reshape(-1, 1, 8, 8)
                    h = torch.relu(torch.nn.functional.conv2d(h, w["conv1.weight"], w["conv1.bias"], padding=1))
                    h = torch.relu(torch.nn.functional.conv2d(h, w["conv2.weight"], w["conv2.bias"], padding=1))
                    h = torch.nn.functional.max_pool2d(h, 2).flatten(1)
                    h = torch.relu(torch.addmm(w["fc1.bias"], h, w["fc1.weight"]))
                    logits = torch.addmm(w["fc2.bias"], h, w["fc2.weight"])
                return torch.softmax(logits.float(), dim=-1)

            name = "fp32" if dt == torch.float32 else "fp16"
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            h_in = torch.from_numpy(X[:1]).pin_memory()
            h_out = torch.empty((1, 10), dtype=torch.float32).pin_memory()
            s_in = torch.zeros((1, 64), device=dev, dtype=dt)
            with torch.no_grad():
                def eager():
                    h_out.copy_(fwd(h_in.to(dev, dt, non_blocking=True)), non_blocking=True)
                    torch.cuda.current_stream().synchronize()

                out[f"{model}/torch-eager/{name}/b1 (pinned copies)"] = timeit(eager)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(5):
                        s_in.copy_(h_in, non_blocking=True)
                        fwd(s_in)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    s_in.copy_(h_in, non_blocking=True)  # H2D from pinned memory, inside the graph
                    s_out = fwd(s_in)
                    h_out.copy_(s_out, non_blocking=True)  # D2H into pinned memory, inside the graph

                def replay():
                    g.replay()
                    torch.cuda.current_stream().synchronize()

                replay()
                out[f"{model}/torch-cudagraph/{name}/max_abs_err_prob_vs_ort"] = float(np.abs(h_out.numpy() - ref).max())
                out[f"{model}/torch-cudagraph/{name}/b1 replay incl. pinned copies"] = timeit(replay)
                out[f"{model}/torch-cudagraph/{name}/b1 replay incl. pinned copies, 2 ms busy gap"] = timeit(
                    replay, n=N // 2, warm=20, busy_gap_s=0.002)
    return out


def sec_dispatch() -> dict:
    """Host-side call paths of one JAX executable at batch 1 (what a worker pays per request)."""
    import jax

    from inferbus.accelerators import get_backend

    out = {}
    s = get_backend("jax").load(MODELS / "digits" / "1" / "model.onnx", precision="fp32",
                                device_kind="gpu" if has_gpu() else "cpu")
    s.warmup((1, 8))
    x = test_rows("digits")[:1]
    c = s._compiled[1]
    xd = jax.device_put({"pixels": x}, s._sharding)
    out["session.infer"] = timeit(lambda: s.infer({"pixels": x}))
    out["session transfer"] = s.transfer
    from inferbus.accelerators._jax import JaxBackend

    p = JaxBackend(transfer="pjrt").load(MODELS / "digits" / "1" / "model.onnx", precision="fp32",
                                         device_kind="gpu" if has_gpu() else "cpu")
    p.warmup((1, 8))
    out["session.infer pjrt"] = timeit(lambda: p.infer({"pixels": x}))
    x8 = test_rows("digits")[:5]
    out["dlpack == pjrt (b1, b5 padded)"] = bool(
        np.allclose(s.infer({"pixels": x})["logits"], p.infer({"pixels": x})["logits"], atol=1e-5)
        and np.allclose(s.infer({"pixels": x8})["logits"], p.infer({"pixels": x8})["logits"], atol=1e-5))
    out["compiled(numpy) + np.asarray"] = timeit(lambda: [np.asarray(v) for v in c({"pixels": x}).values()])
    out["compiled(numpy) logits only"] = timeit(lambda: np.asarray(c({"pixels": x})["logits"]))
    out["device_put + compiled + np.asarray"] = timeit(
        lambda: [np.asarray(v) for v in c(jax.device_put({"pixels": x}, s._sharding)).values()])
    out["jit(numpy) + np.asarray"] = timeit(lambda: [np.asarray(v) for v in s._jit(s._params, {"pixels": x}).values()])
    out["on-device (input resident) + block"] = timeit(lambda: c(xd)["logits"].block_until_ready())
    out["device_put only"] = timeit(lambda: jax.device_put(x, s._jdev).block_until_ready())
    y = c(xd)["logits"]
    out["np.asarray of a resident output"] = timeit(lambda: np.asarray(jax.device_put(y, s._jdev) + 0))
    return out


def sec_hlo(out_dir: Path) -> dict:
    sess = SESS.get(("digits", "fp32"))
    if sess is None:
        from inferbus.accelerators import get_backend, load_checked

        sess = load_checked(get_backend("jax"), MODELS / "digits" / "1" / "model.onnx", precision="fp32")
    opt = sess.lowered_text(1, optimized=True)
    pre = sess.lowered_text(1, optimized=False)
    (out_dir / "mlp_hlo_optimized.txt").write_text(opt)
    (out_dir / "mlp_stablehlo.txt").write_text(pre)
    entry = opt[opt.find("ENTRY"):]
    return {"device": sess.device.to_dict(), "fusions_in_module": opt.count("fused_computation"),
            "entry_fusion_calls": entry.count(" fusion("), "entry_custom_calls": entry.count("custom-call("),
            "stablehlo_dot_general": pre.count("dot_general"), "stablehlo_ops_lines": pre.count("stablehlo."),
            "entry": entry[:4000]}


async def _serve(out: dict, backends: tuple[str, ...], workers: int, quick: bool) -> None:
    import nats

    from inferbus.accelerators import normalized_errors
    from inferbus.actors import Node, NodeConfig
    from inferbus.client import Client

    tag = "+".join(backends)
    # the models the JAX interpreter can run (a BYTES model such as 'strings' is ONNX Runtime only, and a model
    # no worker serves keeps a deployment not ready)
    cfg = NodeConfig(models_dir=str(MODELS), models=("digits", "digits_cnn", "fraud", "typed"), workers=workers,
                     nats_port=0, no_cache=True, backends=backends,
                     precision="auto", run_dir=f"/tmp/inferbus-accel-{tag}", health_timeout_s=10.0)
    t0 = time.perf_counter()
    node = Node(cfg)
    await node.start()
    try:
        try:
            await node.wait_ready(90)
        except TimeoutError as exc:  # say why: the ingress's view and the tails of every actor's log
            from inferbus.client import Client as _C

            diag = {"error": str(exc)}
            try:
                h = await _C(node.nc, cfg.prefix, retry_unavailable=False).health(timeout_s=2)
                diag["health"] = h.parameters
            except Exception as e2:
                diag["health"] = repr(e2)
            for log in sorted(Path(cfg.run_dir).glob("*.log")):
                diag[log.name] = log.read_text(errors="replace")[-2500:]
            out[tag] = diag
            return
        res = {"start_s": round(time.perf_counter() - t0, 1), "workers": list(node.worker_ids)}
        client = await Client.connect(node.nats_url, cfg.prefix)
        rng = np.random.default_rng(0)
        try:
            for model in ("digits", "digits_cnn"):
                X = test_rows(model)
                ref_all = ort_ref(model, X)
                # warm-up: every worker sees traffic
                await asyncio.gather(*[client.infer_result(model, {"pixels": X[i % 64:i % 64 + 1]}, timeout_s=5)
                                       for i in range(200)])
                lat, served, wrong, worst = [], {}, 0, 0.0
                timings = {}
                n = 300 if quick else 2000
                for i in range(n):
                    k = i % len(X)
                    x = X[k:k + 1] + np.float32(rng.random() * 1e-6)  # distinct inputs: no cache hits
                    t = time.perf_counter()
                    r = await client.infer_result(model, {"pixels": x}, timeout_s=5)
                    lat.append(time.perf_counter() - t)
                    p = r.parameters
                    key = f"{p['worker_id']} {p['backend']} {p['device']} {p['precision']}"
                    served[key] = served.get(key, 0) + 1
                    for st, v in (p.get("timings_us") or {}).items():
                        timings.setdefault(st, []).append(v)
                    err = max(normalized_errors(r.outputs, {o: ref_all[o][k:k + 1] for o in r.outputs}).values())
                    worst = max(worst, err)
                    wrong += int(r.outputs["probabilities"].argmax() != ref_all["probabilities"][k].argmax())
                res[f"{model} c=1"] = {"latency": pct(lat), "served_by": served, "argmax_disagreements": wrong,
                                       "max_normalized_err_vs_ort_fp32": worst,
                                       "stage_p50_us": {s: float(np.percentile(v, 50)) for s, v in timings.items()}}
                # concurrency: who serves what
                served_c, done = {}, 0
                stop = time.perf_counter() + (2.0 if quick else 4.0)

                async def caller(j):
                    nonlocal done
                    i = j
                    while time.perf_counter() < stop:
                        k = i % len(X)
                        r = await client.infer_result(model, {"pixels": X[k:k + 1] + np.float32(rng.random() * 1e-6)},
                                                      timeout_s=5)
                        key = f"{r.parameters['backend']} {r.parameters['device']}"
                        served_c[key] = served_c.get(key, 0) + 1
                        done += 1
                        i += 16

                t = time.perf_counter()
                await asyncio.gather(*[caller(j) for j in range(16)])
                res[f"{model} c=16"] = {"qps": round(done / (time.perf_counter() - t)), "served_by": served_c}
            # the bus floor on the same server: raw NATS echo round trip
            nc = await nats.connect(node.nats_url)
            nc2 = await nats.connect(node.nats_url)

            async def echo(msg):
                await msg.respond(msg.data)

            await nc2.subscribe("echo.floor", cb=echo)
            await nc2.flush()
            body = b"x" * 300
            for _ in range(200):
                await nc.request("echo.floor", body, timeout=2)
            ts = []
            for _ in range(300 if quick else 2000):
                t = time.perf_counter()
                await nc.request("echo.floor", body, timeout=2)
                ts.append(time.perf_counter() - t)
            res["nats_echo_floor"] = pct(ts)
            await nc.close()
            await nc2.close()
        finally:
            await client.close()
        out[tag] = res
    finally:
        await node.stop()


def sec_serve(quick: bool, which: str = "jax;jax,onnxruntime") -> dict:
    out: dict = {}
    gpu = has_gpu()
    for spec in filter(None, which.split(";")):
        backends = tuple(spec.split(","))
        workers = 4 if gpu and "onnxruntime" in backends else 1
        try:
            asyncio.run(_serve(out, backends, workers, quick))
        except Exception:
            out["+".join(backends)] = {"error": traceback.format_exc()[-3000:]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated sections")
    ap.add_argument("--serve", default="jax;jax,onnxruntime", help="deployments of the serve section: ';'-separated "
                    "backend lists")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    global N
    if a.quick:
        N = 300
    only = set(filter(None, a.only.split(",")))
    plan = [("env", sec_env), ("cuda", sec_cuda), ("dispatch", sec_dispatch), ("precision", sec_precision),
            ("latency", sec_latency),
            ("hlo", lambda: sec_hlo(a.out)), ("serve", lambda: sec_serve(a.quick, a.serve))]
    for name, fn in plan:
        if not only or name in only:
            section(name, fn, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
