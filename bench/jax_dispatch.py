#!/usr/bin/env python
"""Where a batch-1 JAX call spends its time on a GPU, variant by variant (issue 4, "p50 within 2x of the
CUDA-graph floor"). One process, results as JSON.

Variants, digits MLP (models/digits/1/model.onnx) and digits_cnn, batch 1, fp32 and fp16, p50 of N calls
after a warm-up (``bench/accel_gpu.py``'s ``timeit``):

* ``compiled_resident``    ``Compiled(params, feeds)`` with feeds already on the device (what the session
                           runs, minus transfers) + ``block_until_ready``.
* ``jit_resident``         the same through the ``jax.jit`` object's C++ fast path instead of ``Compiled``.
* ``const_resident``       parameters closed over (XLA constants): ``jit(lambda f: program(params, f))``; no
                           parameter pytree to flatten and check per call.
* ``const_dlpack``         ``const`` program, host numpy in and out through CuPy + DLPack (a worker's call).
* ``session``              ``JaxSession.infer`` as the worker calls it today (numpy in and out).
* ``cupy_roundtrip``       CuPy H2D + D2H of the same bytes (the transfers alone).

``--context`` measures the session call (``sess.infer``, timed around the call only) the way a worker makes it,
to find what separates the worker's ``compute`` stage from the back-to-back figure: ``ctx_back_to_back``,
``ctx_gap_sleep_2ms`` (a 2 ms ``time.sleep`` between calls: CPU and GPU idle as in a closed loop at c=1),
``ctx_gap_spin_2ms`` (the same gap busy-waiting: the CPU stays awake), ``ctx_thread_gap_2ms`` (calls made on an
inference thread fed through a ``queue.Queue`` by an asyncio loop in the main thread, 2 ms apart, like the
worker's thread path), ``ctx_thread_back_to_back``.

Run it twice with different ``XLA_FLAGS`` (e.g. ``--xla_gpu_enable_command_buffer=`` to turn XLA's CUDA
graphs off) to see what XLA's command buffers change. Usage: ``python bench/jax_dispatch.py --out FILE``;
on a CPU-only machine it measures the CPU device (a check that it runs, not a GPU figure).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timeit(fn, n: int, warm: int = 200) -> dict:
    for _ in range(warm):
        fn()
    ts = np.empty(n)
    for i in range(n):
        t = time.perf_counter()
        fn()
        ts[i] = time.perf_counter() - t
    ts *= 1e6
    return {"n": n, "p50_us": round(float(np.percentile(ts, 50)), 1), "p99_us": round(float(np.percentile(ts, 99)), 1),
            "min_us": round(float(ts.min()), 1)}


def measure(model: str, precision: str, n: int, out: dict) -> None:
    import jax

    from inferbus.accelerators._jax import JaxBackend

    kind = "gpu" if any(d.platform == "gpu" for d in jax.devices()) else "cpu"
    sess = JaxBackend().load(ROOT / "models" / model / "1" / "model.onnx", precision=precision, device_kind=kind)
    sess.warmup((1,))
    name = sess.inputs[0].name
    shape = sess._shape(sess.inputs[0], 1)
    x = np.random.default_rng(0).random(shape, dtype=np.float32).astype(sess._in_dtypes[name])
    res: dict = {"device": kind, "transfer": sess.transfer}
    params = sess._params
    compiled = sess._jit.lower(params, {name: jax.ShapeDtypeStruct(shape, x.dtype, sharding=sess._sharding)}).compile()
    xd = jax.device_put(x, sess._jdev)
    feeds_d = {name: xd}
    outname = sess.outputs[0].name

    def run(label, fn):
        try:
            res[label] = timeit(fn, n)
        except Exception:
            res[label] = {"error": traceback.format_exc(limit=3)}

    run("compiled_resident", lambda: compiled(params, feeds_d)[outname].block_until_ready())
    jitted = sess._jit
    run("jit_resident", lambda: jitted(params, feeds_d)[outname].block_until_ready())
    program = sess._program
    const = jax.jit(lambda f: program(params, f))
    run("const_resident", lambda: const(feeds_d)[outname].block_until_ready())
    run("session", lambda: sess.infer({name: x}))
    try:
        import cupy as cp

        def const_dlpack():
            xin = jax.dlpack.from_dlpack(cp.asarray(x))
            return cp.from_dlpack(const({name: xin})[outname]).get()

        run("const_dlpack", const_dlpack)
        run("cupy_roundtrip", lambda: cp.asarray(x).get())
        ref = sess.infer({name: x})[outname]
        np.testing.assert_allclose(const_dlpack(), ref, rtol=1e-3, atol=1e-3)
        res["const_matches_session"] = True
    except ImportError:
        res["const_dlpack"] = {"skipped": "no cupy"}
    out[f"{model}/{precision}"] = res


def _gap_stats(ts: list[float]) -> dict:
    a = np.asarray(ts) * 1e6
    return {"n": len(a), "p50_us": round(float(np.percentile(a, 50)), 1),
            "p99_us": round(float(np.percentile(a, 99)), 1), "min_us": round(float(a.min()), 1)}


def context(model: str, precision: str, n: int, out: dict) -> None:
    """``sess.infer`` timed in the settings a worker calls it in (see the module docstring, ``--context``), for
    each host transfer path (GPU: dlpack and memcpy; CPU: pjrt and memcpy)."""
    import jax

    from inferbus.accelerators._jax import JaxBackend

    kind = "gpu" if any(d.platform == "gpu" for d in jax.devices()) else "cpu"
    for transfer in (("dlpack", "memcpy") if kind == "gpu" else ("pjrt", "memcpy")):
        sess = JaxBackend(transfer=transfer).load(ROOT / "models" / model / "1" / "model.onnx", precision=precision,
                                                  device_kind=kind)
        sess.warmup((1,))
        res: dict = {"device": kind, "transfer": sess.transfer, "params_as_constants": sess.params_as_constants}
        _context_one(sess, n, res)
        res["transfer_after"] = sess.transfer  # a fast path that failed falls back to pjrt
        out[f"context {model}/{precision} {transfer}"] = res


def _context_one(sess, n: int, res: dict) -> None:
    import asyncio
    import queue
    import threading

    name = sess.inputs[0].name
    x = np.random.default_rng(0).random(sess._shape(sess.inputs[0], 1), dtype=np.float32)

    def timed() -> float:
        t = time.perf_counter()
        sess.infer({name: x})
        return time.perf_counter() - t

    for _ in range(200):
        timed()
    res["ctx_back_to_back"] = _gap_stats([timed() for _ in range(n)])
    ts = []
    for _ in range(n):
        time.sleep(0.002)
        ts.append(timed())
    res["ctx_gap_sleep_2ms"] = _gap_stats(ts)
    ts = []
    for _ in range(n):
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
        ts.append(timed())
    res["ctx_gap_spin_2ms"] = _gap_stats(ts)

    def thread_run(gap_s: float) -> dict:
        jobs: queue.Queue = queue.Queue()
        ts: list[float] = []

        def worker() -> None:
            while True:
                item = jobs.get()
                if item is None:
                    return
                fut, loop = item
                ts.append(timed())
                loop.call_soon_threadsafe(fut.set_result, None)

        th = threading.Thread(target=worker, daemon=True)
        th.start()

        async def feed() -> None:
            loop = asyncio.get_running_loop()
            for _ in range(n):
                fut = loop.create_future()
                jobs.put((fut, loop))
                await fut
                if gap_s:
                    await asyncio.sleep(gap_s)

        asyncio.run(feed())
        jobs.put(None)
        th.join()
        return _gap_stats(ts)

    res["ctx_thread_gap_2ms"] = thread_run(0.002)
    res["ctx_thread_back_to_back"] = thread_run(0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--context", action="store_true", help="only the worker-context section (see the docstring)")
    args = ap.parse_args()
    import jax

    out: dict = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "jax": jax.__version__,
                 "xla_flags": os.environ.get("XLA_FLAGS", ""), "devices": [str(d) for d in jax.devices()]}
    for model in ("digits", "digits_cnn"):
        for precision in ("fp32", "fp16"):
            try:
                (context if args.context else measure)(model, precision, args.n, out)
            except Exception:
                out[f"{model}/{precision}"] = {"error": traceback.format_exc(limit=5)}
    Path(args.out).write_text(json.dumps(out, indent=1))
    for k, v in out.items():
        if isinstance(v, dict):
            print(k, {a: (b.get("p50_us") if isinstance(b, dict) else b) for a, b in v.items()})


if __name__ == "__main__":
    main()
