"""Python bytecodes per L1 hit at a colocated ingress (run to completion), by function: a one-off count for the
twenty-third session (request layouts: hits through the layout's key instead of the raw index).

    PYTHONPATH=<tree> python bench/results/h200-16c-session23/hit_bytecodes.py [N]

Uses ``bench.pathcost``'s harness (a real nats-server, one colocated ingress + worker, no other worker):
N distinct requests warm up, then N more are each sent twice in a row: a miss (the answer fills L1 in the same
call) and the same body again, counted (an L1 hit: ``digits`` keeps answers 100 ms). Counted as ``bench.pathcost --bytecodes`` counts: ``sys.settrace`` opcode events in this
task only.
"""
import asyncio
import sys

from bench import pathcost as pc


async def main(n: int) -> None:
    worker = {"inline_max_compute_us": 1e12}
    async with pc._harness("digits", str(pc.ROOT / "models"), 0, {"now": (True, worker)}) as (mv, cols, _direct):
        col = cols["now"]
        bodies = pc._bodies("digits", str(pc.ROOT / "models"), mv, 2 * n)
        hdrs = {"Inferbus-Timeout-Ms": "100000.000"}
        subject = col.ingress.subjects.infer("digits", mv.version)
        me = asyncio.current_task()
        counts: dict = {}
        driver = main.__code__

        def tracer(frame, event, arg):
            if event == "call" and asyncio.current_task() is not me:
                return None
            frame.f_trace_opcodes = True
            if event == "opcode" and frame.f_code is not driver:
                counts[frame.f_code] = counts.get(frame.f_code, 0) + 1
            return tracer

        for b in bodies[:n]:  # warm-up, until the router has measured the colocated worker (it then wins)
            await col.ingress._on_infer(pc._Msg(subject, pc.SINK, b, dict(hdrs)))
            await asyncio.sleep(0)
        await pc._await_routed(col)
        bodies = bodies[n:]
        hits0 = col.ingress.counts["l1_hits"]
        for b in bodies:  # a miss (computed, answered and put in L1 within the call), then the same body counted
            await col.ingress._on_infer(pc._Msg(subject, pc.SINK, b, dict(hdrs)))
            m = pc._Msg(subject, pc.SINK, b, dict(hdrs))
            sys.settrace(tracer)
            try:
                await col.ingress._on_infer(m)
            finally:
                sys.settrace(None)
            await asyncio.sleep(0)
        hits = col.ingress.counts["l1_hits"] - hits0
        by_fn: dict = {}
        for code, c in counts.items():
            k = pc._where(code)
            by_fn[k] = by_fn.get(k, 0) + c
        raw_hits = col.ingress.counts["l1_raw_hits"]
    print(f"hits {hits} of {n}; bytecodes per hit {sum(by_fn.values()) / n:,.1f}; raw-index hits {raw_hits}",
          file=sys.stderr)
    for k, v in sorted(by_fn.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {v / n:8.1f}  {k}", file=sys.stderr)


asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))
