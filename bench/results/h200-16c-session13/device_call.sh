#!/usr/bin/env bash
# thirteenth session's device call: pathcost base (ceb3df5) / work alternated at batch 1, work with the model's
# cache off (cache_ttl_ms 0), then one throughput suite (work, colocated, with the direct floor)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/r"
{
date -u; nproc; python3 --version
rm -rf /tmp/mnc && mkdir -p /tmp/mnc && cp -r models/digits /tmp/mnc/ && sed -i 's/"cache_ttl_ms": 100/"cache_ttl_ms": 0/' /tmp/mnc/digits/config.json
for r in 1 2 3; do
  echo "[pathcost base r=$r] $(date -u +%T)"; (cd .base-tree && timeout 100 python3 -m bench.pathcost --other-workers 7 --json "$OUT/r/pc-base-$r.json" | tail -4)
  echo "[pathcost work r=$r] $(date -u +%T)"; timeout 100 python3 -m bench.pathcost --other-workers 7 --json "$OUT/r/pc-work-$r.json" | tail -4
done
echo "[pathcost work, cache off] $(date -u +%T)"; timeout 100 python3 -m bench.pathcost --other-workers 7 --models-dir /tmp/mnc --json "$OUT/r/pc-work-nocache.json" | tail -4
echo "[bytecodes work] $(date -u +%T)"; timeout 100 python3 -m bench.pathcost --bytecodes 200 --other-workers 7 --top 40 --json "$OUT/r/bc-work.json" | tail -4
echo "[suite] $(date -u +%T)"
timeout 300 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 8 --ingress 1 --closed 1,8,64 --direct --json "$OUT/r/suite.json" 2>&1 | tail -45
date -u
} 2>&1 | tee "$OUT/r/log.txt"
tar czf "$OUT/results.tgz" -C "$OUT" r
