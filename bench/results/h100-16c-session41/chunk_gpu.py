"""Forty-first session, on the device: 1-row probes during a large batch on the JAX GPU worker, chunked or not.

    python3 bench/results/h100-16c-session41/chunk_gpu.py OUT_DIR [ROWS] [CHUNK_ROWS,...]

(The forty-second session added the batch's stage timings to the results: ``compute`` (its own chunks),
``between_chunks`` (the probes served between them) and how far the worker's stages are from ``worker_total``; and
the third argument, the ``--chunk-rows`` values to run in turn, default ``1024,0,1024``.)

For ``--chunk-rows 1024`` (the default) and ``--chunk-rows 0`` (never split), in turn: ``inferbus up --backends jax
--model digits_cnn --no-cache`` (one JAX worker on the GPU; it always computes on its inference thread), one batch of
ROWS rows (default 20,000) and, while it computes, 1-row probes one after another. Prints and writes
``chunk_gpu.json``: the batch's latency, the probes answered while it computed and their latency (p50, max), and
whether the batch's answer matches ONNX Runtime's on the CPU (argmax of every row, and the largest difference of
the logits: the GPU serves fp16 by default).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]


def start(chunk_rows: int, run_dir: Path, port: int) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "up.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "inferbus.cli", "up", "--backends", "jax", "--model", "digits_cnn",
                             "--no-cache", "--nats-port", str(port), "--prefix", "g", "--run-dir", str(run_dir),
                             "--chunk-rows", str(chunk_rows)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while b"inferbus up in" not in (run_dir / "up.log").read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((run_dir / "up.log").read_text()[-3000:])
        time.sleep(0.2)
    return proc


async def trial(url: str, big: np.ndarray, ref_logits: np.ndarray) -> dict:
    from inferbus.client import Client

    async with await Client.connect(url, "g") as client:
        rng = np.random.default_rng(3)
        for _ in range(20):
            await client.infer("digits_cnn", {"pixels": rng.random((1, 64), dtype=np.float32)}, timeout_s=30)
        await client.infer("digits_cnn", {"pixels": big[:2048]}, timeout_s=60)  # warm the larger sizes too
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        task = asyncio.create_task(client.infer_result("digits_cnn", {"pixels": big}, timeout_s=120))
        lat = []
        while not task.done():
            t = loop.time()
            await client.infer("digits_cnn", {"pixels": rng.random((1, 64), dtype=np.float32)}, timeout_s=120)
            if not task.done():
                lat.append((loop.time() - t) * 1000)
        res = await task
        big_ms = (loop.time() - t0) * 1000
        logits = res.outputs["logits"]
        t = res.parameters["timings_us"]
        stages = sum(t.get(k, 0) for k in ("worker_decode", "queue", "compute", "between_chunks", "encode"))
        return {"batch_rows": len(big), "batch_ms": round(big_ms, 1), "probes_during": len(lat),
                "compute_us": t["compute"], "between_chunks_us": t.get("between_chunks", 0),
                "worker_total_us": t["worker_total"], "stages_short_of_worker_total_us": t["worker_total"] - stages,
                "probe_p50_ms": round(float(np.median(lat)), 2) if lat else None,
                "probe_max_ms": round(max(lat), 2) if lat else None,
                "argmax_match": float(np.mean(logits.argmax(1) == ref_logits.argmax(1))),
                "max_abs_logit_diff": float(np.abs(logits - ref_logits).max())}


def main() -> None:
    import onnxruntime as ort

    out_dir = Path(sys.argv[1])
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    big = np.random.default_rng(1).random((rows, 64), dtype=np.float32)
    ref = ort.InferenceSession(str(ROOT / "models" / "digits_cnn" / "1" / "model.onnx"))
    ref_logits = ref.run(["logits"], {"pixels": big})[0]
    results = {}
    chunks = [int(c) for c in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1024, 0, 1024]
    for i, chunk_rows in enumerate(chunks):
        port = 14300 + i
        proc = start(chunk_rows, Path(f"/tmp/chunk-gpu-{i}"), port)
        try:
            r = asyncio.run(trial(f"nats://127.0.0.1:{port}", big, ref_logits))
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(60)
        r["chunk_rows"] = chunk_rows
        results[f"{i + 1}:chunk_rows={chunk_rows}"] = r
        print(json.dumps(r), flush=True)
    (out_dir / "chunk_gpu.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
