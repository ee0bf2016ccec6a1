"""HTTP inference under concurrency against the same requests over NATS, one node, one run.

    python -m bench.http_load --url http://127.0.0.1:8000 --nats nats://127.0.0.1:4222 [--prefix inferbus]
                              [--concurrency 1,8,32] [--seconds 4] [--json F]

Needs a node serving OIP v2 inference over HTTP (``inferbus up --http-port 8000 --http-host 127.0.0.1
--http-infer``) with the ``digits`` model. For each concurrency C, C client processes each run a closed loop for
``--seconds``: first over HTTP (one keep-alive ``http.client`` connection each, ``POST
/v2/models/digits/infer``), then over NATS (one nats-py connection each, a request to the ingresses' subject
``<prefix>.infer.digits`` with the same JSON body and ``Content-Type: application/json``). Every input is distinct
(a random row per request), so no answer comes from the cache: each is a miss through the whole pipeline.

What it shows: the cost of the HTTP gateway (``docs/http.md``: a waitress thread in the node process, then the
node's own NATS connection to an ingress) next to a client on the bus, both answered by the same ingresses and
workers. Latencies go into an HDR histogram per way (``hdrhistogram``, 1 µs to 60 s, 3 significant digits);
printed: answers/s, p50/p95/p99/p99.9 (µs), and HTTP ÷ NATS for each. Every answer must be a success (HTTP 200,
or a NATS answer without an ``error``); otherwise the run exits 1 naming the first failure.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing as mp
import os
import socket
import sys
import time
from urllib.parse import urlsplit

import numpy as np

_MAX_US = 60_000_000
NODELAY = os.environ.get("IB_NODELAY", "1") == "1"
"""Set ``TCP_NODELAY`` on each HTTP client's socket, as urllib3 (requests), geventhttpclient (tritonclient.http) and
curl do: ``http.client`` alone writes a request's headers and its body in two writes, and with Nagle's algorithm on
the body waits for the headers' ACK, which the server's kernel may delay (a delayed ACK: up to ~40 ms on Linux), so
a client without it measures that wait, not the server. ``IB_NODELAY=0`` measures ``http.client`` as it is (the
fifty-sixth session's runs)."""


def _bodies(seed: int, n: int = 4096) -> list[bytes]:
    x = np.random.default_rng(seed).random((n, 64), dtype=np.float32)
    return [json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                    "data": row.tolist()}]}).encode() for row in x]


def _http_loop(url: str, seconds: float, seed: int, q) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=30)
    if NODELAY:
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    bodies = _bodies(seed)
    lat, fail, i = [], None, 0
    hdrs = {"Content-Type": "application/json"}
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        conn.request("POST", "/v2/models/digits/infer", bodies[i % len(bodies)], hdrs)
        resp = conn.getresponse()
        data = resp.read()
        lat.append(time.perf_counter() - t0)
        i += 1
        if resp.status != 200 and fail is None:
            fail = f"HTTP {resp.status}: {data[:200]!r}"
    conn.close()
    q.put((lat, fail))


def _nats_loop(server: str, prefix: str, seconds: float, seed: int, q) -> None:
    import nats

    async def run():
        nc = await nats.connect(server)
        bodies = _bodies(seed)
        lat, fail, i = [], None, 0
        hdrs = {"Content-Type": "application/json"}
        subject = f"{prefix}.infer.digits"
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            msg = await nc.request(subject, bodies[i % len(bodies)], timeout=30, headers=hdrs)
            lat.append(time.perf_counter() - t0)
            i += 1
            if fail is None and b'"error"' in msg.data[:200]:
                fail = f"NATS error answer: {msg.data[:200]!r}"
        await nc.close()
        return lat, fail

    try:
        import uvloop
        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    q.put(asyncio.run(run()))


def _run(way: str, c: int, a) -> dict:
    from hdrh.histogram import HdrHistogram

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_http_loop, args=(a.url, a.seconds, 1000 + k, q)) if way == "http" else
             ctx.Process(target=_nats_loop, args=(a.nats, a.prefix, a.seconds, 2000 + k, q)) for k in range(c)]
    for p in procs:
        p.start()
    results = [q.get(timeout=a.seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    h = HdrHistogram(1, _MAX_US, 3)
    n = 0
    for lat, fail in results:
        if fail is not None:
            raise SystemExit(f"error: {way} at concurrency {c}: {fail}")
        for t in lat:
            h.record_value(min(max(int(t * 1e6), 1), _MAX_US))
        n += len(lat)
    return {"answers": n, "per_s": n / a.seconds,
            **{f"p{q}_us": h.get_value_at_percentile(q) for q in (50, 95, 99, 99.9)}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.http_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the node's HTTP port, e.g. http://127.0.0.1:8000")
    p.add_argument("--nats", required=True, help="the node's NATS URL, e.g. nats://127.0.0.1:4222")
    p.add_argument("--prefix", default="inferbus", help="the node's subject prefix (default inferbus)")
    p.add_argument("--concurrency", default="1,8,32", help="client processes per step, comma-separated, each in "
                   "[1, 512] (default 1,8,32)")
    p.add_argument("--seconds", type=float, default=4.0, help="each step's length, in (0, 600] (default 4)")
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args(argv)
    try:
        conc = [int(x) for x in a.concurrency.split(",")]
    except ValueError:
        p.error(f"--concurrency must be integers separated by commas, got {a.concurrency!r}")
    if not all(1 <= c <= 512 for c in conc):
        p.error(f"--concurrency must be in [1, 512] each, got {a.concurrency!r}")
    if not 0 < a.seconds <= 600:
        p.error(f"--seconds must be in (0, 600], got {a.seconds}")
    out = {"steps": []}
    for c in conc:
        step = {"concurrency": c, "http": _run("http", c, a), "nats": _run("nats", c, a)}
        step["http_over_nats"] = {k: step["http"][k] / step["nats"][k] for k in step["http"] if step["nats"][k]}
        out["steps"].append(step)
        for way in ("http", "nats"):
            r = step[way]
            print(f"c={c:<4d} {way:5s} {r['per_s']:9.0f}/s  p50 {r['p50_us']:7d}  p95 {r['p95_us']:7d}  "
                  f"p99 {r['p99_us']:7d}  p99.9 {r['p99.9_us']:7d} µs", flush=True)
        r = step["http_over_nats"]
        print(f"c={c:<4d} http ÷ nats: answers/s {r['per_s']:.2f}  p50 {r['p50_us']:.2f}  p99 {r['p99_us']:.2f}",
              flush=True)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
