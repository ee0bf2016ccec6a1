#!/usr/bin/env bash
# fiftieth session, one device call: two runs of the twenty-eighth session's shortened suite with two generators and
# the direct floor (the forty-fourth session's script), then the GPU path's tests (the forty-seventh session's
# gpu_call.sh: the accelerator tests and the `up --backends onnxruntime,jax --demo`).
#   OUT=... bash bench/results/session50/device_call.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
t0=$(date +%s)
RUNS=${RUNS:-"1 2"} bash "$(dirname "$0")/../h200-16c-session44/device_call.sh"
OUT=$OUT bash "$(dirname "$0")/../session47/gpu_call.sh"
echo "call took $(( $(date +%s) - t0 )) s" >> "$OUT/host.txt"
