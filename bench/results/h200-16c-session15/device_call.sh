#!/usr/bin/env bash
# fifteenth session's device calls: the throughput suite (colocated, with the direct floor) with N colocated
# processes (the echo and direct floors on as many responders, same cores), in the order given:
#   bash bench/results/h200-16c-session15/device_call.sh TAG N [N ...]   [EXTRA suite args in $SUITE_EXTRA]
set -u
OUT=${OUT:-/tmp/out}; tag=$1; shift; mkdir -p "$OUT/$tag"
{
date -u; nproc; python3 --version
for n in "$@"; do
  echo "[suite n=$n] $(date -u +%T)"
  timeout 280 python3 -m bench.suite --profile throughput --no-ray --colocate --workers "$n" --ingress 1 --echo "$n" \
    --closed 1,64 --direct ${SUITE_EXTRA:-} --json "$OUT/$tag/suite-n$n.json" 2>&1 | tail -42
done
date -u
} 2>&1 | tee "$OUT/$tag/log.txt"
