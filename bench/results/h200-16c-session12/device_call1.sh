#!/usr/bin/env bash
# twelfth session's device call: clock costs, pathcost base/work at batch 1 and 8, one throughput suite (work)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/r"
{
date -u; nproc; python3 --version
python3 - <<'EOF'
import time, timeit
for name in ("monotonic", "time", "perf_counter", "thread_time", "process_time"):
    f = getattr(time, name)
    n = 200000
    print(f"time.{name}: {min(timeit.repeat(f, number=n, repeat=5)) / n * 1e9:.0f} ns/call")
EOF
for r in 1 2; do
  for b in 1 8; do
    echo "[pathcost base b=$b r=$r] $(date -u +%T)"; (cd .base-tree && timeout 120 python3 -m bench.pathcost --other-workers 7 --batch $b --json "$OUT/r/pc-base-b$b-$r.json" | tail -4)
    echo "[pathcost work b=$b r=$r] $(date -u +%T)"; timeout 120 python3 -m bench.pathcost --other-workers 7 --batch $b --json "$OUT/r/pc-work-b$b-$r.json" | tail -4
  done
done
echo "[bytecodes work] $(date -u +%T)"; timeout 120 python3 -m bench.pathcost --bytecodes 200 --other-workers 7 --top 40 --json "$OUT/r/bc-work.json" | tail -4
echo "[suite] $(date -u +%T)"
timeout 330 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 8 --ingress 1 --closed 1,8,64 --direct --json "$OUT/r/suite.json" 2>&1 | tail -40
date -u
} 2>&1 | tee "$OUT/r/log.txt"
tar czf "$OUT/results.tgz" -C "$OUT" r
