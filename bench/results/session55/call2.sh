#!/usr/bin/env bash
# fifty-fifth session, second device call (carry .whl): the HTTP port under concurrency against NATS on 16 cores
# (the default layout, then --colocate), the ONNX Runtime + JAX demo, and (SUITE=1) one shortened suite.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
L="--concurrency 1,8,32,64 --seconds 3"
{ date -u; nproc
  RUN=/tmp/hl-a LOADARGS="$L" JSON=$OUT/http-default.json timeout 150 bash bench/results/session55/http_load.sh
  date -u
  RUN=/tmp/hl-b UPARGS="--colocate" LOADARGS="$L" JSON=$OUT/http-colocate.json timeout 150 bash bench/results/session55/http_load.sh
  date -u; } > "$OUT/http.log" 2>&1
cat "$OUT/http.log"
{ date -u; timeout 200 python3 -m inferbus.cli up --backends onnxruntime,jax --demo --nats-port 0 --run-dir /tmp/gpu-run 2>&1 \
    | tail -14; echo "up rc=${PIPESTATUS[0]}"; date -u; } > "$OUT/gpu-demo.log" 2>&1
cat "$OUT/gpu-demo.log"
[ -z "${SUITE:-}" ] || RUNS=${RUNS:-3} GPU= OUT=$OUT bash bench/results/session55/call.sh
