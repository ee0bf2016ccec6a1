"""What the result cache costs a miss, timed alone (thirteenth session, 2-core box): cache key, raw index and L1
operations for 40,000 distinct digits requests, with 10,000 and 100 entries. Run from the repository root."""
import time, os, sys, numpy as np
sys.path.insert(0, '.')
from inferbus.actors._cache import L1Cache, cache_key
from inferbus.schemas import decode_request
from inferbus.loadgen import Workload
from inferbus.actors._repository import ModelRepository
import gc
from inferbus.actors._common import serving_gc
repo = ModelRepository('models', ['digits'])
N = 40000
w = Workload(repo, 'digits', '1', pool=N, distinct=True)
bodies = w.bodies
reqs = [decode_request(b, None) for b in bodies]
from inferbus.schemas import input_to_numpy
arrs = [[input_to_numpy(t, field="x") for t in r.inputs] for r in reqs]
resp = os.urandom(420)
serving_gc()
for cap in (10000, 100):
    l1 = L1Cache(cap); raw = L1Cache(cap)
    t_key = t_raw = t_l1 = 0.0
    c0 = time.thread_time()
    for i in range(N):
        now = time.monotonic()
        a = time.perf_counter()
        rk = ('digits:1', False, bodies[i])
        raw.get(rk, now)
        b = time.perf_counter()
        k = cache_key('digits', '1', reqs[i].inputs, arrs[i], None, True, None)
        c = time.perf_counter()
        raw.put(rk, (k, None), 100, now)
        l1.get(k, now)
        d = time.perf_counter()
        l1.put(k, resp + bytes(4), 100, now)   # a fresh response object each time
        e = time.perf_counter()
        t_key += c - b; t_raw += (b - a) + (d - c); t_l1 += e - d
    tot = time.thread_time() - c0
    print(f"cap {cap}: per request key {t_key/N*1e6:.2f} µs, raw index {t_raw/N*1e6:.2f} µs, l1 put {t_l1/N*1e6:.2f} µs, loop total cpu {tot/N*1e6:.2f} µs")
