"""HTTP inference round trip on one keep-alive connection against a new TCP connection per request.

    python -m bench.http_keepalive --url http://127.0.0.1:8000 [--requests 2000] [--block 100] [--json F]

Needs a node serving OIP v2 inference over HTTP (``inferbus up --http-port 8000 --http-host 127.0.0.1
--http-infer``) with the ``digits`` model. Sends ``--requests`` sequential JSON infers of ``digits`` (1 row, each a
distinct random input, so that no answer comes from the cache) in each of two ways, with ``http.client``:

* ``keepalive``: every request on one connection (HTTP/1.1, as ``tritonclient.http`` and load balancers send);
* ``fresh``: a new connection for each request (``Connection: close``), as every request was served before the
  node's server kept connections (wsgiref, HTTP/1.0).

The two alternate in blocks of ``--block`` requests, so that the host's noise falls on both alike. Prints p50,
p99 and mean per way, in µs, and the ratios fresh ÷ keep-alive (on a noisy box, quote the ratios: DESIGN.md,
"Measuring"). Every answer must be 200 (else exit 1). docs/http.md, "Where it runs, and what it costs", has
figures.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from urllib.parse import urlsplit

import numpy as np


def _bodies(n: int, seed: int = 7) -> list[bytes]:
    x = np.random.default_rng(seed).random((n, 64), dtype=np.float32)
    return [json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                    "data": row.tolist()}]}).encode() for row in x]


def _one(conn: http.client.HTTPConnection, body: bytes, close: bool) -> float:
    headers = {"Content-Type": "application/json", **({"Connection": "close"} if close else {})}
    t0 = time.perf_counter()
    conn.request("POST", "/v2/models/digits/infer", body, headers)
    resp = conn.getresponse()
    data = resp.read()
    took = time.perf_counter() - t0
    if resp.status != 200:
        raise SystemExit(f"error: HTTP {resp.status}: {data[:300]!r}")
    return took


def measure(url: str, requests: int, block: int) -> dict:
    """``{way: {p50_us, p99_us, mean_us, n}}`` and the ratios, for ``requests`` infers each way (module docstring)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    bodies = _bodies(2 * requests + 20)
    kept = http.client.HTTPConnection(host, port, timeout=30)
    for b in bodies[:20]:  # warm-up: the connection, the ingress's and worker's first requests
        _one(kept, b, False)
    times: dict[str, list[float]] = {"keepalive": [], "fresh": []}
    it = iter(bodies[20:])
    while len(times["fresh"]) < requests:
        k = min(block, requests - len(times["fresh"]))
        for _ in range(k):
            times["keepalive"].append(_one(kept, next(it), False))
        for _ in range(k):
            conn = http.client.HTTPConnection(host, port, timeout=30)
            try:
                times["fresh"].append(_one(conn, next(it), True))
            finally:
                conn.close()
    kept.close()
    out: dict = {}
    for way, t in times.items():
        a = np.array(t) * 1e6
        out[way] = {"n": len(a), "p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
                    "mean_us": float(a.mean())}
    out["fresh_over_keepalive"] = {s: out["fresh"][s] / out["keepalive"][s] for s in ("p50_us", "p99_us", "mean_us")}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.http_keepalive", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the node's HTTP port, e.g. http://127.0.0.1:8000")
    p.add_argument("--requests", type=int, default=2000, help="infers each way, in [1, 1000000] (default 2000)")
    p.add_argument("--block", type=int, default=100, help="requests per block before the other way takes its turn, "
                   "in [1, --requests] (default 100)")
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args(argv)
    if not 1 <= a.requests <= 1_000_000:
        p.error(f"--requests must be in [1, 1000000], got {a.requests}")
    if not 1 <= a.block <= a.requests:
        p.error(f"--block must be in [1, {a.requests}], got {a.block}")
    out = measure(a.url, a.requests, a.block)
    for way in ("keepalive", "fresh"):
        r = out[way]
        print(f"{way:10s} n={r['n']}  p50 {r['p50_us']:8.0f} µs  p99 {r['p99_us']:8.0f} µs  mean {r['mean_us']:8.0f} µs")
    r = out["fresh_over_keepalive"]
    print(f"fresh ÷ keep-alive: p50 {r['p50_us']:.2f}  p99 {r['p99_us']:.2f}  mean {r['mean_us']:.2f}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
