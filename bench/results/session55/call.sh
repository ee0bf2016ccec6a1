#!/usr/bin/env bash
# fifty-fifth session: the forty-fourth session's shortened suite (11 colocated processes, two generators,
# nats-server on cores 11-15, the direct floor and both echo layouts in each run), RUNS times, then the GPU tests
# (bench/results/session47/gpu_call.sh, NO_DEMO unless DEMO=1).
#   OUT=... RUNS="1 2" bash bench/results/session55/call.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
RUNS=${RUNS:-1 2} OUT=$OUT bash bench/results/h200-16c-session44/device_call.sh
if [ -n "${GPU-1}" ]; then
  if [ -n "${DEMO:-}" ]; then OUT=$OUT bash bench/results/session47/gpu_call.sh
  else NO_DEMO=1 OUT=$OUT bash bench/results/session47/gpu_call.sh; fi
fi
cat "$OUT/summary.txt"; tail -5 "$OUT/gpu.log" 2>/dev/null
