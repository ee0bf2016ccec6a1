"""A/B of the worker's two execution paths in one run: inline on the event loop vs the inference thread.

    python -m bench.worker_ab [--model digits] [--rounds 4] [--seconds 2] [--json out.json]

Two worker processes on one real nats-server, the same model, one with the default
``inline_max_compute_us`` and one with 0 (every batch on the thread). Requests go straight to
each worker's subject (the forward header an ingress sends), so only the worker hop differs.
Rounds alternate between the two workers, so both see the same box load; per path: closed-loop
p50/p99 latency at concurrency 1 and the answers per second and worker CPU µs per answer
(``/proc/<pid>/stat``) at concurrency 32. Ratios between the paths are the result; absolute
figures of a shared box are not (DESIGN §11).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import _args as args

ROOT = Path(__file__).resolve().parents[1]


def _cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


async def _run(model: str, rounds: int, seconds: float) -> dict:
    import nats

    from inferbus.actors import ModelRepository, WorkerConfig
    from inferbus.bus import BusConfig, EmbeddedNats
    from inferbus.bus import headers as H
    from inferbus.schemas import InferRequest, decode_error, decode_response, encode_request, input_from_numpy

    repo = ModelRepository(ROOT / "models", [model])
    mv = repo.get(model).version("1")
    X = np.load(ROOT / "models" / model / "data" / "test.npz")["X"].astype(np.float32)
    name = mv.inputs[0].name
    bodies = [encode_request(InferRequest(inputs=[input_from_numpy(name, X[i % len(X):i % len(X) + 1])]))
              for i in range(256)]
    paths = {"inline": None, "thread": 0.0}
    out: dict = {"model": model, "rounds": rounds, "seconds": seconds, "nproc": os.cpu_count(), "paths": {}}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(run_dir=Path(tmp) / "nats") as srv:
        bus = BusConfig(servers=(srv.url,), prefix="ab")
        procs = {}
        for p, limit in paths.items():
            kw = {} if limit is None else {"inline_max_compute_us": limit}
            cfg = WorkerConfig(worker_id=f"w-{p}", bus=bus, models_dir=str(ROOT / "models"), models=(model,), **kw)
            procs[p] = subprocess.Popen([sys.executable, "-m", "inferbus.actors", "worker", cfg.to_json()],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            for proc in procs.values():
                assert proc.stdout.readline().strip() == b"READY"
            nc = await nats.connect(srv.url)
            hdrs = {H.FWD: H.fwd_value(-1, "bench", model, "1", 60000.0, (time.time() + 60) * 1000.0, "", "", "")}
            stats = {p: {"lat": [], "n": 0, "t": 0.0, "cpu": 0.0, "bs": []} for p in paths}
            seen: dict[str, str] = {}

            async def closed(p: str, conc: int, dur: float, record_lat: bool) -> None:
                subj = f"ab._w.w-{p}"
                end = time.perf_counter() + dur
                st = stats[p]

                async def one(k: int) -> None:
                    i = k
                    while time.perf_counter() < end:
                        t0 = time.perf_counter()
                        msg = await nc.request(subj, bodies[i % len(bodies)], timeout=5, headers=hdrs)
                        dt = (time.perf_counter() - t0) * 1e6
                        assert decode_error(msg.headers, msg.data) is None
                        if record_lat:
                            st["lat"].append(dt)
                        else:
                            st["n"] += 1
                            if st["n"] % 16 == 0:
                                st["bs"].append(decode_response(msg.data).parameters["batch_size"])
                        if p not in seen:
                            seen[p] = decode_response(msg.data).parameters["exec"]
                        i += conc
                await asyncio.gather(*(one(k) for k in range(conc)))

            for p in paths:  # warm-up
                await closed(p, 8, 0.5, record_lat=True)
                stats[p]["lat"].clear()
            for _ in range(rounds):
                for p in paths:
                    await closed(p, 1, seconds, record_lat=True)
                    c0, t0 = _cpu_s(procs[p].pid), time.perf_counter()
                    await closed(p, 32, seconds, record_lat=False)
                    stats[p]["t"] += time.perf_counter() - t0
                    stats[p]["cpu"] += _cpu_s(procs[p].pid) - c0
            await nc.close()
            for p, st in stats.items():
                lat = sorted(st["lat"])
                out["paths"][p] = {
                    "c1_p50_us": round(lat[len(lat) // 2], 1), "c1_p99_us": round(lat[int(len(lat) * 0.99)], 1),
                    "c32_qps": round(st["n"] / st["t"]), "c32_worker_cpu_us_per_req": round(st["cpu"] * 1e6 / st["n"], 1),
                    "c32_mean_batch_size": round(sum(st["bs"]) / max(len(st["bs"]), 1), 2),
                }
            a, b = out["paths"]["inline"], out["paths"]["thread"]
            out["ratios_inline_over_thread"] = {k: round(a[k] / b[k], 3) for k in a}
            out["exec_seen"] = seen  # parameters.exec of each worker's first answer
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(10)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.worker_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="digits")
    ap.add_argument("--rounds", type=args.count, default=4)
    ap.add_argument("--seconds", type=args.positive, default=2.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    try:
        import uvloop

        doc = uvloop.run(_run(a.model, a.rounds, a.seconds))
    except ImportError:  # pragma: no cover
        doc = asyncio.run(_run(a.model, a.rounds, a.seconds))
    print(json.dumps(doc, indent=1))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
