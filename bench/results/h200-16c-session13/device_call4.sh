#!/usr/bin/env bash
# thirteenth session, call 4: the throughput suite of call 1 again, with bursts (7d950d6)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/r"
{
date -u; nproc
timeout 300 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 8 --ingress 1 --closed 1,8,64 --direct --json "$OUT/r/suite.json" 2>&1 | tail -45
date -u
} 2>&1 | tee "$OUT/r/log.txt"
tar czf "$OUT/results-4.tgz" -C "$OUT" r && rm -rf "$OUT/r"
