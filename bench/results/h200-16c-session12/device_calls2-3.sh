#!/usr/bin/env bash
# twelfth session's device calls. a: profiles (colocated vs direct, same rate) + pathcost base/work. b: suite A/B.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/r"
what=${1:-a}
{
date -u; nproc
if [ "$what" = a ]; then
  for rate in 2750 5000; do
    echo "[profile $rate] $(date -u +%T)"
    timeout 150 python3 -m bench.profile_hotpath --colocate --no-l2 --mode open --rate-qps $rate --direct --seconds 8 --top 40 --out "$OUT/r/prof-$rate" > "$OUT/r/prof-$rate.txt" 2>&1 || echo "profile failed $?"
    grep -E "^(inferbus|echo|direct) |^==|by layer" "$OUT/r/prof-$rate.txt"
  done
  mkdir -p /tmp/pcbase/bench && cp -r .base-tree/inferbus .base-tree/models /tmp/pcbase/ && cp bench/__init__.py bench/pathcost.py bench/_args.py /tmp/pcbase/bench/
  for b in 1 8; do
    echo "[pathcost base b=$b] $(date -u +%T)"; (cd /tmp/pcbase && timeout 120 python3 -m bench.pathcost --other-workers 7 --batch $b --json "$OUT/r/pc-base-b$b.json" 2>&1 | tail -4)
    echo "[pathcost work b=$b] $(date -u +%T)"; timeout 120 python3 -m bench.pathcost --other-workers 7 --batch $b --json "$OUT/r/pc-work-b$b.json" 2>&1 | tail -4
  done
else
  mv .base-tree/bench.base .base-tree/bench
  timeout 560 python3 -m bench.ab --base-tree .base-tree --pairs 2 --out "$OUT/r/ab" -- --profile throughput --no-ray \
    --colocate --workers 8 --ingress 1 --closed 1,64 --no-sweep --open-rates 14000,22000,28000 2>&1 | tail -30
fi
date -u
} 2>&1 | tee "$OUT/r/log-$what.txt"
tar czf "$OUT/results-$what.tgz" -C "$OUT" r && rm -rf "$OUT/r"
