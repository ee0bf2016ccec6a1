"""What a frozen Valkey costs a cache miss, with and without the L2 lookups' circuit breaker.

    python -m bench.l2_outage [--requests 400] [--json bench/results/l2_outage.json]

One ``inferbus up`` per variant (one worker, one ingress, ``digits``, ``--l2-lookup`` with the default 2 ms L2
timeout, Valkey its own process started here), driven by one SDK client at concurrency 1 with distinct inputs (every
request a miss that looks L2 up). Three phases per variant, each ``--requests`` requests: Valkey answering;
Valkey frozen (SIGSTOP, what a stalled VM or a swapped-out process looks like to the ingress: the TCP connection
stays open and nothing comes back); Valkey resumed (SIGCONT). The variants: the breaker as shipped
(``--l2-breaker-failures 20``) and turned off (``--l2-breaker-failures 1000000000``: every lookup is made, as before
2026-12-06). Latency percentiles (µs) from an HDR histogram per phase, and each phase's p50 as a ratio of the same
variant's healthy p50 (ratios in one run: the 2-core box is shared and noisy; absolute times only from the GPU host).

The result document goes to stdout as JSON and to ``--json`` when given; a table to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {"breaker": 20, "no_breaker": 1_000_000_000}
PHASES = ("healthy", "frozen", "resumed")


async def _phase(client, n: int, first: int) -> dict:
    from inferbus.loadgen._result import new_histogram

    hist = new_histogram()
    x = np.random.default_rng(first).random((1, 64), dtype=np.float32)
    for k in range(n):
        t0 = time.perf_counter()
        await client.infer("digits", {"pixels": x + np.float32(first + k)}, timeout_s=5)
        hist.record_value(max(1, int((time.perf_counter() - t0) * 1e6)))
    return {q: hist.get_value_at_percentile(p) for q, p in (("p50", 50), ("p95", 95), ("p99", 99), ("p99.9", 99.9))}


async def _health_counts(client) -> dict:
    p = (await client.health()).parameters
    return {"l2_lookups": p.get("l2_lookups"), **{k: p["counts"].get(k, 0) for k in ("l2_timeouts", "l2_errors",
                                                                                     "l2_skipped")}}


def _start_up(run_dir: Path, redis_url: str, failures: int) -> tuple[subprocess.Popen, str]:
    from inferbus.bus import free_port

    port = free_port()
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "up.log"
    env = {**os.environ, "INFERBUS_REDIS_URL": redis_url}
    argv = [sys.executable, "-m", "inferbus.cli", "up", "--nats-port", str(port), "--workers", "1", "--model",
            "digits", "--models", str(ROOT / "models"), "--run-dir", str(run_dir), "--prefix", "l2o", "--l2-lookup",
            "--l2-breaker-failures", str(failures)]
    fh = open(log, "wb")
    proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=ROOT)
    deadline = time.monotonic() + 90
    while b"inferbus up" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"inferbus up did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, f"nats://127.0.0.1:{port}"


async def _variant(name: str, failures: int, n: int, work: Path) -> dict:
    from inferbus.bus import EmbeddedValkey
    from inferbus.client import Client

    out: dict = {"l2_breaker_failures": failures}
    with EmbeddedValkey(run_dir=work / name / "valkey") as vk:
        proc, url = await asyncio.to_thread(_start_up, work / name / "up", vk.url, failures)
        try:
            async with await Client.connect(url, "l2o") as client:
                await _phase(client, 50, 1)  # warm-up
                for i, phase in enumerate(PHASES):
                    if phase == "frozen":
                        os.kill(vk.pid, signal.SIGSTOP)
                    elif phase == "resumed":
                        os.kill(vk.pid, signal.SIGCONT)
                        await asyncio.sleep(1.5)  # one probe per --l2-breaker-open-s (1 s) turns the lookups on
                    before = await _health_counts(client)
                    q = await _phase(client, n, 1000 * (i + 1))
                    after = await _health_counts(client)
                    out[phase] = {**q, "l2_lookups_after": after["l2_lookups"],
                                  **{k: after[k] - before[k] for k in ("l2_timeouts", "l2_errors", "l2_skipped")}}
        finally:
            os.kill(vk.pid, signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)
    for phase in PHASES:
        out[phase]["p50_ratio_to_healthy"] = round(out[phase]["p50"] / out["healthy"]["p50"], 2)
        out[phase]["p99_ratio_to_healthy"] = round(out[phase]["p99"] / out["healthy"]["p99"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.l2_outage", description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400, help="requests per phase (default 400)")
    ap.add_argument("--json", type=Path, default=None, help="write the result document here too")
    args = ap.parse_args(argv)
    if args.requests < 1:
        ap.error("--requests must be >= 1")
    if args.json is not None and not (args.json.parent.is_dir() and os.access(args.json.parent, os.W_OK)):
        print(f"error: --json {args.json}: its folder is missing or not writable", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="inferbus-l2o-") as tmp:
        doc = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "host_cores": os.cpu_count(),
               "requests_per_phase": args.requests, "l2_timeout_ms": 2.0,
               "variants": {name: asyncio.run(_variant(name, f, args.requests, Path(tmp)))
                            for name, f in VARIANTS.items()}}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(f"\n{'variant':12s} {'phase':8s} {'p50 µs':>8s} {'p99 µs':>8s} {'p50/healthy':>12s} {'failed':>8s} "
          f"{'skipped':>8s}", file=sys.stderr)
    for name, v in doc["variants"].items():
        for phase in PHASES:
            r = v[phase]
            print(f"{name:12s} {phase:8s} {r['p50']:8d} {r['p99']:8d} {r['p50_ratio_to_healthy']:12.2f} "
                  f"{r['l2_timeouts'] + r['l2_errors']:8d} {r['l2_skipped']:8d}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
