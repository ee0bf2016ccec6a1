"""Diagnostic (not committed): why ~1 % of pathcost --batch 8 requests are answered late on the H200."""
import asyncio, sys, time
import uvloop
import inferbus.actors._worker as W
import bench.pathcost as pc

seen = {"not_inline": 0, "max_ewma_us": 0.0, "slices": 0, "slice_sizes": {}, "late_passes": []}
orig_ri = W.Worker._runs_inline
def ri(self, mk):
    r = orig_ri(self, mk)
    if not r:
        seen["not_inline"] += 1
    return r
W.Worker._runs_inline = ri
orig_rg = W.Worker._run_group
def rg(self, mk, outs, items):
    out = orig_rg(self, mk, outs, items)
    seen["max_ewma_us"] = max(seen["max_ewma_us"], self.compute_ewma_us.get(mk, 0.0))
    return out
W.Worker._run_group = rg
orig_take = W.Worker._take_inline
def take(self):
    jobs = orig_take(self)
    seen["slices"] += 1
    seen["slice_sizes"][len(jobs)] = seen["slice_sizes"].get(len(jobs), 0) + 1
    return jobs
W.Worker._take_inline = take
orig_per = pc._per_request_us
async def per(handle, passes, yields, answered=None, batch=1):
    us, late = await orig_per(handle, passes, yields, answered, batch)
    if answered is not None:
        seen["late_passes"].append(late)
    return us, late
pc._per_request_us = per
for b, y in ((8, 3), (8, 6)):
    for k in list(seen):
        seen[k] = {} if isinstance(seen[k], dict) else [] if isinstance(seen[k], list) else 0
    doc = uvloop.run(pc.run("digits", str(pc.ROOT / "models"), 3000, 5, y, 7, b))
    print(f"batch {b} yields {y}:", doc["cpu_us_per_request"], doc["counts"], seen, flush=True)
