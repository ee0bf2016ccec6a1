#!/usr/bin/env python
"""How close a batch-1 JAX call gets to the GPU floor, and what each part of it costs (issue 4, "p50 within 2x
of the CUDA-graph floor"). One run, one JSON file per variant plus a summary.

The parent runs each variant in its own child process (CUDA context flags and ``XLA_FLAGS`` must be set before
JAX starts), then the floor (``bench/accel_gpu.py``'s torch CUDA-graph replay, H2D + model + D2H from pinned
memory inside one graph) in another child, and writes ``summary.json`` with every p50 over the floor's.

Variants (environment of the child):

* ``base``      what a worker runs today.
* ``graph1``    ``XLA_FLAGS=--xla_gpu_graph_min_graph_size=1``: XLA puts even a program of one or two kernels
                into a CUDA graph (command buffer); the default minimum skips small programs.
* ``spin``      the CUDA primary context set to ``cudaDeviceScheduleSpin`` (CuPy, before JAX creates it): a
                host wait spins instead of yielding or blocking on an OS primitive.
* ``graph1_spin`` both.

Measured in each, per model (digits MLP, digits_cnn) and precision (fp32, fp16), batch 1, p50 of ``-n`` calls,
the session variants in four interleaved rounds (the host drifts; every variant gets each round's conditions):

* ``session_b2b``       ``JaxSession.infer`` back to back, ``transfer="memcpy"`` (the GPU default: CuPy copies,
                        outputs packed into one array);
* ``session_gap_spin``  the same with a 2 ms busy gap before each call (a closed loop at c=1 with the CPU awake);
                        its ratio is taken to the floor measured with the same gap;
* ``unpacked_b2b`` / ``unpacked_gap_spin``  the memcpy path with one wait and copy per output (before packing);
* ``hostmem_b2b`` / ``hostmem_gap_spin``  the same with ``transfer="hostmem"`` (inputs and the packed output in
                        ``pinned_host`` memory, XLA's copies inside the program, no CuPy call);
* ``const_resident``    the jitted call on an input already on the device + ``block_until_ready`` (JAX's floor);
* ``steps_unpacked``    the memcpy path *without* packed outputs taken apart with ``perf_counter_ns`` around each
                        step: cast, staging copy, H2D ``cudaMemcpy``, the jitted call returning (dispatch),
                        ``block_until_ready`` of every output, D2H ``cudaMemcpy`` of every output, result copy.

Usage: ``python bench/jax_floor.py --out DIR [-n 2000] [--variants base,graph1,...]``. On a machine without a GPU
it runs the CPU device (a check that it runs; no floor, no GPU figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = {
    "base": {},
    "graph1": {"XLA_FLAGS": "--xla_gpu_graph_min_graph_size=1"},
    "spin": {"INFERBUS_BENCH_CUDA_SPIN": "1"},
    "graph1_spin": {"XLA_FLAGS": "--xla_gpu_graph_min_graph_size=1", "INFERBUS_BENCH_CUDA_SPIN": "1"},
}
CASES = (("digits", "fp32"), ("digits", "fp16"), ("digits_cnn", "fp32"), ("digits_cnn", "fp16"))


def _stats(ts_s) -> dict:
    a = np.asarray(ts_s, dtype=np.float64) * 1e6
    return {"n": len(a), "p50_us": round(float(np.percentile(a, 50)), 1),
            "p99_us": round(float(np.percentile(a, 99)), 1), "min_us": round(float(a.min()), 1)}


def _timeit(fn, n: int, warm: int = 200, spin_gap_s: float = 0.0) -> dict:
    return _stats(_times(fn, n, warm, spin_gap_s))


def _times(fn, n: int, warm: int = 200, spin_gap_s: float = 0.0) -> list[float]:
    """Seconds of ``n`` calls after ``warm``; ``spin_gap_s``: busy-wait that long before each call."""
    from bench.accel_gpu import samples

    return samples(fn, n, warm, spin_gap_s)


def _ctx_flags() -> dict:
    """The CUDA primary context's scheduling flags as the driver reports them (cuda-python), if it imports."""
    try:
        from cuda.bindings import driver as drv
    except ImportError:
        try:
            from cuda import cuda as drv  # older cuda-python
        except ImportError:
            return {"skipped": "no cuda-python"}
    try:
        err, dev = drv.cuDeviceGet(0)
        err, flags, active = drv.cuDevicePrimaryCtxGetState(dev)
        return {"flags": int(flags), "sched": {0: "auto", 1: "spin", 2: "yield", 4: "blocking_sync"}.get(
            int(flags) & 7, str(int(flags) & 7)), "active": int(active)}
    except Exception as exc:
        return {"error": repr(exc)}


def _steps(sess, x: np.ndarray, n: int) -> dict:
    """The memcpy path of ``JaxSession.infer`` step by step (same operations, timed separately)."""
    name = sess.inputs[0].name
    names = sess._all_outputs
    b, compiled = sess._pick(1)
    feeds = {name: x.astype(sess._in_dtypes[name])}
    bufs = sess._input_buffers(b, feeds)
    arr, ptr, staging = bufs[name]
    keys = ("cast", "staging", "h2d", "dispatch", "block", "d2h", "result")
    ts = {k: [] for k in keys}
    ts["total"] = []
    pc = time.perf_counter_ns
    for i in range(n + 200):
        t0 = pc()
        xi = x.astype(sess._in_dtypes[name]) if x.dtype != sess._in_dtypes[name] else x
        t1 = pc()
        np.copyto(staging, xi)
        t2 = pc()
        sess._copy(ptr, staging.ctypes.data, staging.nbytes, to_device=True)
        t3 = pc()
        outs = compiled({name: arr})
        t4 = pc()
        for k in names:
            outs[k].block_until_ready()
        t5 = pc()
        hosts = {}
        for k in names:
            o = outs[k]
            st = sess._out_staging.get((k, o.nbytes))
            if st is None:
                st = sess._out_staging[(k, o.nbytes)] = sess._host_buffer(o.nbytes)
            sess._copy(st.ctypes.data, o.unsafe_buffer_pointer(), o.nbytes, to_device=False)
            hosts[k] = (st, o.dtype, o.shape)
        t6 = pc()
        res = {k: st.view(dt).reshape(sh).copy() for k, (st, dt, sh) in hosts.items()}
        t7 = pc()
        if i >= 200:
            for k, a, z in zip(keys, (t0, t1, t2, t3, t4, t5, t6), (t1, t2, t3, t4, t5, t6, t7)):
                ts[k].append((z - a) / 1e9)
            ts["total"].append((t7 - t0) / 1e9)
    out = {k: _stats(v) for k, v in ts.items()}
    out["sum_of_p50_us"] = round(sum(out[k]["p50_us"] for k in keys), 1)
    out["check_max_abs_vs_session"] = float(max(np.abs(res[k].astype(np.float64) - sess.infer({name: x})[k].astype(
        np.float64)).max() for k in names))
    return out


def child(variant: str, n: int, out: Path) -> None:
    if os.environ.get("INFERBUS_BENCH_CUDA_SPIN"):
        from cuda.bindings import runtime as cudart  # cuda-python; CuPy has no cudaSetDeviceFlags

        err, = cudart.cudaSetDeviceFlags(cudart.cudaDeviceScheduleSpin)  # before anything creates the context
        if int(err):
            raise RuntimeError(f"cudaSetDeviceFlags: {err}")
    import jax

    from inferbus.accelerators._jax import JaxBackend

    kind = "gpu" if any(dd.platform == "gpu" for dd in jax.devices()) else "cpu"
    res: dict = {"variant": variant, "env": VARIANTS[variant], "device": kind, "jax": jax.__version__}
    rng = np.random.default_rng(0)
    for model, precision in CASES:
        key = f"{model}/{precision}"
        r: dict = {}
        res[key] = r
        try:
            sessions = {}
            for tag, transfer in (("session", "memcpy"), ("unpacked", "memcpy"), ("hostmem", "hostmem")):
                sess = JaxBackend(transfer=transfer).load(ROOT / "models" / model / "1" / "model.onnx",
                                                          precision=precision, device_kind=kind)
                sess.warmup((1,))
                if tag == "unpacked":
                    sess._packed.clear()
                sessions[tag] = sess
                r[f"{tag}_transfer"], r[f"{tag}_packed"] = sess.transfer, sorted(sess._packed)
            first = sessions["session"]
            name = first.inputs[0].name
            x = rng.random(first._shape(first.inputs[0], 1), dtype=np.float32)
            ref = first.infer({name: x})
            for tag, sess in sessions.items():
                got = sess.infer({name: x})
                r[f"{tag}_max_abs_vs_session"] = float(max(np.abs(got[k].astype(np.float64) - ref[k].astype(
                    np.float64)).max() for k in ref))
            # interleaved rounds, so that the host's drift falls on every variant alike
            raw: dict = {}
            rounds = 4
            for _ in range(rounds):
                for tag, sess in sessions.items():
                    call = (lambda s: lambda: s.infer({name: x}))(sess)
                    raw.setdefault(f"{tag}_b2b", []).extend(_times(call, n // rounds, warm=50))
                    raw.setdefault(f"{tag}_gap_spin", []).extend(
                        _times(call, n // (2 * rounds), warm=10, spin_gap_s=0.002))
            for k, v in raw.items():
                r[k] = _stats(v)
            xd = jax.device_put(x.astype(first._in_dtypes[name]), first._jdev)
            fn = first._compiled[1]
            outname = first._all_outputs[0]
            r["const_resident"] = _timeit(lambda: fn({name: xd})[outname].block_until_ready(), n)
            r["steps_unpacked"] = _steps(sessions["unpacked"], x, n)
        except Exception:
            r["error"] = traceback.format_exc(limit=4)
    res["ctx_flags"] = _ctx_flags()
    out.write_text(json.dumps(res, indent=1))


def floor_child(out: Path) -> None:
    from bench.accel_gpu import torch_reference

    out.write_text(json.dumps(torch_reference(), indent=1))


def summarize(out_dir: Path, variants: list[str]) -> dict:
    floor, floor_gap = {}, {}
    try:
        fl = json.loads((out_dir / "floor.json").read_text())
        for model, precision in CASES:
            v = fl.get(f"{model}/torch-cudagraph/{precision}/b1 replay incl. pinned copies")
            if isinstance(v, dict):
                floor[f"{model}/{precision}"] = v.get("p50_us")
            v = fl.get(f"{model}/torch-cudagraph/{precision}/b1 replay incl. pinned copies, 2 ms busy gap")
            if isinstance(v, dict):
                floor_gap[f"{model}/{precision}"] = v.get("p50_us")
    except (OSError, ValueError):
        pass
    rows = {}
    for variant in variants:
        try:
            r = json.loads((out_dir / f"{variant}.json").read_text())
        except (OSError, ValueError):
            continue
        for case in (f"{m}/{p}" for m, p in CASES):
            c = r.get(case, {})
            fl_us = floor.get(case)
            row = {}
            for label in ("session_b2b", "session_gap_spin", "unpacked_b2b", "unpacked_gap_spin", "hostmem_b2b",
                          "hostmem_gap_spin", "const_resident"):
                v = c.get(label)
                if isinstance(v, dict) and "p50_us" in v:
                    fl_gap = floor_gap.get(case)
                    ref = fl_gap if label.endswith("_gap_spin") and fl_gap else fl_us
                    row[label] = {"p50_us": v["p50_us"], "x_floor": round(v["p50_us"] / ref, 2) if ref else None}
            rows[f"{variant} {case}"] = row
    return {"floor_p50_us": floor, "floor_gap_spin_p50_us": floor_gap, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the JSON files")
    ap.add_argument("-n", type=int, default=2000, help="timed calls per figure")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.child == "floor":
        floor_child(out_dir / "floor.json")
        return
    if args.child:
        child(args.child, args.n, out_dir / f"{args.child}.json")
        return
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    import importlib.util

    if importlib.util.find_spec("cuda") is None:  # no cuda-python: the spin variants cannot set the flag
        skipped = [v for v in variants if "INFERBUS_BENCH_CUDA_SPIN" in VARIANTS[v]]
        if skipped:
            print(f"skipping {', '.join(skipped)}: cuda-python is not installed (no CUDA here)", flush=True)
        variants = [v for v in variants if v not in skipped]
    for v in ["floor"] + variants:
        env = {**os.environ, **VARIANTS.get(v, {})}
        t = time.monotonic()
        p = subprocess.run([sys.executable, __file__, "--out", str(out_dir), "-n", str(args.n), "--child", v],
                           env=env, capture_output=True, text=True, timeout=600)
        (out_dir / f"{v}.log").write_text(p.stdout + p.stderr)
        print(f"{v}: rc={p.returncode} in {time.monotonic() - t:.0f} s", flush=True)
    s = summarize(out_dir, variants)
    try:
        s["device"] = json.loads((out_dir / f"{variants[0]}.json").read_text()).get("device")
    except (OSError, ValueError, IndexError):
        s["device"] = None
    if not s["floor_p50_us"]:
        s["note"] = "no floor: torch with CUDA is not available here, so x_floor is null (floor.json says why)"
    (out_dir / "summary.json").write_text(json.dumps(s, indent=1))
    print(json.dumps(s, indent=1))
    print(f"device: {s['device']}" + ("" if s["device"] == "gpu" else " (a check that it runs, not a GPU figure)"))


if __name__ == "__main__":
    main()
