#!/usr/bin/env bash
# nineteenth session's device call: the throughput suite twice (11 colocated processes, the echo and the direct
# floor on 11 responders, closed c=1 and c=64, as the sixteenth/seventeenth sessions' calls) with the sweeps
# alternated (`--alternate`, now the throughput profile's default: step k of every series before step k+1 of
# any), so that the echo's and the pipeline's p99 < 5 ms crossings are measured close together in time.
#   OUT=... bash device_call.sh TAG [extra suite args]
set -u
OUT=${OUT:-/tmp/out}; tag=$1; shift; mkdir -p "$OUT/$tag"
{
date -u; nproc
for k in 1 2; do
  echo "[suite $k] $(date -u +%T)"
  timeout 280 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 \
    --echo 11 --closed 1,64 --direct "$@" --json "$OUT/$tag/suite-$k.json" 2>&1 | tail -40
done
date -u
} 2>&1 | tee "$OUT/$tag/log.txt"
