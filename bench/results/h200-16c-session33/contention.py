"""The model's run time when every serving core is busy (thirty-third session).

Why: under the throughput suite's open load the worker's ``compute`` stage reads 74-84 µs for batches of ~2-3
requests on the H200 host, against the suite's in-process model floor of 11-17 µs p50 (one process, a tight loop on
an otherwise idle host). This measures ``digits`` run by the worker's own session (``OnnxRuntimeBackend.load``, the
same session options) in N processes at once, each pinned to its own core, batch B, with or without ~F µs of other
Python work between runs (a serving process decodes, encodes and does I/O between model runs, which takes the
model's data out of the caches). Percentiles of one run's wall time and thread CPU time, per configuration.

    python3 bench/results/h200-16c-session33/contention.py OUT.json [seconds per configuration]
"""
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

from inferbus.accelerators._onnxruntime import OnnxRuntimeBackend

MODEL = next(Path("models/digits/1").glob("*.onnx"))


def _filler(n: int) -> int:
    d = {}
    for i in range(n):  # dict and int churn, like decoding and bookkeeping
        d[i & 63] = (i, str(i))
    return len(d)


def _worker(core: int, batch: int, filler_n: int, seconds: float, start_at: float, q) -> None:
    os.sched_setaffinity(0, {core})
    sess = OnnxRuntimeBackend().load(MODEL)
    x = {"pixels": np.random.default_rng(core).random((batch, 64), dtype=np.float32)}
    for _ in range(2000):
        sess.infer(x)
    while time.monotonic() < start_at:
        time.sleep(0.001)
    walls, cpus = [], []
    end = start_at + seconds
    while time.monotonic() < end:
        if filler_n:
            _filler(filler_n)
        t0, c0 = time.perf_counter(), time.thread_time()
        sess.infer(x)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    q.put((walls, cpus))


def _pct(xs, p):
    return round(float(np.percentile(np.asarray(xs) * 1e6, p)), 1)


def main() -> None:
    out, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    cores = sorted(os.sched_getaffinity(0))
    t0 = time.perf_counter()
    _filler(3000)
    per_iter_us = (time.perf_counter() - t0) / 3000 * 1e6
    filler_n = max(1, int(150 / per_iter_us))  # about 150 µs of other Python work between runs, when asked
    results = []
    ctx = mp.get_context("fork")
    for procs in (1, 11, 16):
        if procs > len(cores):
            continue
        for batch in (1, 3):
            for filler in (0, filler_n):
                q = ctx.Queue()
                start_at = time.monotonic() + 1.5
                ps = [ctx.Process(target=_worker, args=(cores[i], batch, filler, seconds, start_at, q))
                      for i in range(procs)]
                for p in ps:
                    p.start()
                got = [q.get() for _ in ps]
                for p in ps:
                    p.join()
                walls = [w for g in got for w in g[0]]
                cpus = [c for g in got for c in g[1]]
                r = {"procs": procs, "batch": batch, "filler_iters": filler, "runs": len(walls),
                     "wall_p50_us": _pct(walls, 50), "wall_p99_us": _pct(walls, 99),
                     "cpu_p50_us": _pct(cpus, 50), "cpu_p99_us": _pct(cpus, 99)}
                results.append(r)
                print(json.dumps(r), flush=True)
    doc = {"host_cores": len(cores), "filler_iter_us": round(per_iter_us, 4), "seconds": seconds,
           "model": str(MODEL), "results": results}
    Path(out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
