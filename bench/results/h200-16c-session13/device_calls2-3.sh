#!/usr/bin/env bash
# thirteenth session, calls 2 and 3: bursts (the ingress holds back requests while more wait and has them
# computed as batches at the burst's end) against the base 8caabc1 in .base-tree.
# a: pathcost at batch 1, 2, 3, 8 (run to completion = bursts, queued = the worker's queue, in the same run), then
#    one A/B pair (base first). b: the second pair (work first).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/r"
what=${1:-a}
{
date -u; nproc
if [ "$what" = a ]; then
  for b in 1 2 3 8; do
    echo "[pathcost work b=$b] $(date -u +%T)"; timeout 100 python3 -m bench.pathcost --other-workers 7 --batch $b --json "$OUT/r/pc-work-b$b.json" 2>&1 | tail -5
  done
  first=base
else
  first=work
fi
timeout 330 python3 -m bench.ab --base-tree .base-tree --pairs 1 --first $first --out "$OUT/r/ab-$what" -- --profile throughput --no-ray \
  --colocate --workers 8 --ingress 1 --closed 1,64 --no-sweep --open-rates 14000,22000,28000,34000 2>&1 | tail -40
date -u
} 2>&1 | tee "$OUT/r/log-$what.txt"
tar czf "$OUT/results-$what.tgz" -C "$OUT" r && rm -rf "$OUT/r"
