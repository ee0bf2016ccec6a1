#!/usr/bin/env bash
# twenty-seventh session's device call (about 4 minutes of device time were left): ONE shortened throughput suite
# with nats-server kept off the 11 serving cores (--nats-cpus 11-15, shared with the 4 generators), and, new, the echo
# measured again through an unpinned nats-server in the same run (series 'echo [nats unpinned]'), so that the
# throughput target is read against the better echo of the two layouts in one run. Steps of 1.5 s, closed c=64
# only, no direct floor, no Ray (it cannot run there). Then the thread count and affinity of each actor process of
# a pinned node (the actors now get their core at spawn).
#   OUT=... bash bench/results/h200-16c-session27/device_call.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
date -u; nproc
timeout 200 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 --echo 11 \
  --closed 64 --no-direct --nats-cpus 11-15 --duration 1.5 --sweep-max-steps 8 --sweep-factor 1.35 \
  --json "$OUT/suite.json" --png "$OUT/suite.png" 2>&1 | tee "$OUT/suite.log" | tail -n 60
date -u
timeout 40 python3 - <<'PY' 2>&1 | tee "$OUT/threads.log"
import asyncio, os
from inferbus.actors import Node, NodeConfig
async def main():
    cfg = NodeConfig(models_dir="models", models=("digits",), workers=11, colocate=True, no_cache=True,
                     pin_cpus=True, nats_cpus=(11, 12, 13, 14, 15))
    async with Node(cfg) as node:
        for info in node.supervisor.which_children():
            tids = os.listdir(f"/proc/{info.pid}/task")
            aff = {tuple(sorted(os.sched_getaffinity(int(t)))) for t in tids}
            print(info.id, "threads", len(tids), "affinity", sorted(aff))
        print("nats-server threads", len(os.listdir(f"/proc/{node.nats.pid}/task")),
              "affinity", sorted(os.sched_getaffinity(node.nats.pid)))
asyncio.run(main())
PY
date -u
