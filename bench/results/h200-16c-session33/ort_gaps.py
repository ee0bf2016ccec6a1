"""One ONNX Runtime run of ``digits`` when the process did something else just before (thirty-third session).

Why: a serving process's ``compute`` stage (the model run alone, timed around ``OrtSession.infer``) reads 3-5 ×
the model's in-process floor, which the suite measures in a tight loop: on the 2-core box a colocated process at
500 requests/s gives a compute p50 of 146 µs against 46 µs hot. This times one run after each kind of gap
(none; a sleep of 250 µs or 1 ms, as an idle event loop waits in epoll; ~150 µs of other Python work that also
copies 256 KiB, as decoding and encoding do), for the worker's session options (``OnnxRuntimeBackend.load``) and
for the same with ONNX Runtime's CPU memory arena and/or memory pattern off, at batch 1 and 3. One process,
pinned to one core.

    python3 bench/results/h200-16c-session33/ort_gaps.py OUT.json [runs per configuration]
"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from inferbus.accelerators._onnxruntime import OnnxRuntimeBackend

MODEL = next(Path("models/digits/1").glob("*.onnx"))


def session(arena: bool, pattern: bool):
    """The worker's session, or one with the same options but the arena and/or memory pattern off."""
    if arena and pattern:
        return OnnxRuntimeBackend().load(MODEL)._sess
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # as OnnxRuntimeBackend.load
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.enable_cpu_mem_arena = arena
    so.enable_mem_pattern = pattern
    return ort.InferenceSession(str(MODEL), sess_options=so, providers=["CPUExecutionProvider"])


SRC = bytes(range(256)) * 1024  # 256 KiB


def filler(n: int) -> None:
    d = {}
    for i in range(n):
        d[i & 63] = (i, str(i))
    bytearray(SRC)  # a copy, as a body is sliced and an answer encoded


def main() -> None:
    out = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[min(2, len(cores) - 1)]})
    t0 = time.perf_counter()
    filler(3000)
    per = (time.perf_counter() - t0) / 3000
    fill_n = max(1, int(150e-6 / per))
    gaps = {"none": None, "sleep_250us": ("sleep", 250e-6), "sleep_1ms": ("sleep", 1e-3), "python_150us": ("fill", fill_n)}
    results = []
    for arena, pattern in ((True, True), (False, True), (True, False), (False, False)):
        sess = session(arena, pattern)
        for batch in (1, 3):
            x = {"pixels": np.random.default_rng(batch).random((batch, 64), dtype=np.float32)}
            for _ in range(2000):
                sess.run(None, x)
            for gap, how in gaps.items():
                ws = []
                for _ in range(runs):
                    if how is not None:
                        if how[0] == "sleep":
                            time.sleep(how[1])
                        else:
                            filler(how[1])
                    t = time.perf_counter()
                    sess.run(None, x)
                    ws.append(time.perf_counter() - t)
                w = np.asarray(ws) * 1e6
                r = {"arena": arena, "mem_pattern": pattern, "batch": batch, "gap": gap, "runs": runs,
                     "p50_us": round(float(np.percentile(w, 50)), 1), "p90_us": round(float(np.percentile(w, 90)), 1),
                     "p99_us": round(float(np.percentile(w, 99)), 1), "mean_us": round(float(w.mean()), 1)}
                results.append(r)
                print(json.dumps(r), flush=True)
    Path(out).write_text(json.dumps({"onnxruntime": ort.__version__, "model": str(MODEL), "results": results},
                                    indent=1))


if __name__ == "__main__":
    main()
