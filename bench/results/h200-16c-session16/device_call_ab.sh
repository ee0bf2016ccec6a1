#!/usr/bin/env bash
# sixteenth session's A/B device calls: the throughput suite (11 colocated processes, as the fifteenth session's
# device_call.sh) for the fifteenth session's start (80dd3e5, extracted to .base-tree) and for this session's
# HEAD (the deadline header on every request, read by the ingress; the overload bookkeeping), in the order given:
#   bash device_call_ab.sh TAG base work   |   bash device_call_ab.sh TAG work base
set -u
OUT=${OUT:-/tmp/out}; tag=$1; shift; mkdir -p "$OUT/$tag"
{
date -u; nproc
for side in "$@"; do
  echo "[suite $side] $(date -u +%T)"
  dir=.; [ "$side" = base ] && dir=.base-tree
  (cd "$dir" && timeout 260 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 \
    --echo 11 --closed 1,64 --direct --json "$OUT/$tag/suite-$side.json" 2>&1 | tail -30)
done
date -u
} 2>&1 | tee "$OUT/$tag/log.txt"
