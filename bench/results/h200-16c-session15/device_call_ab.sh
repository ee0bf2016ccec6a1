#!/usr/bin/env bash
# fifteenth session's last device call: the throughput suite (11 colocated processes, as device_call.sh) for the
# session's start (80dd3e5, extracted to .base-tree) and for its end (the deadline header on every request, read by
# the ingress), one after the other
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/ab"
{
date -u
for side in base work; do
  echo "[suite $side] $(date -u +%T)"
  dir=.; [ "$side" = base ] && dir=.base-tree
  (cd "$dir" && timeout 195 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 \
    --echo 11 --closed 1,64 --direct --json "$OUT/ab/suite-$side.json" 2>&1 | tail -30)
done
date -u
} 2>&1 | tee "$OUT/ab/log.txt"
