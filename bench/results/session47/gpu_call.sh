#!/usr/bin/env bash
# forty-seventh session: the GPU path on the newest code (the forty-fourth session's checks): the accelerator tests
# and `inferbus up --backends onnxruntime,jax --demo` (NO_DEMO=1: the tests alone). The tests run one at a time:
# with -n 4 (the first try) 12 JAX-GPU tests failed, four processes each taking the GPU's memory.
#   OUT=... bash bench/results/session47/gpu_call.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
{ date -u; nvidia-smi -L; nproc
  timeout 300 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_accelerators_gpu.py tests/test_accelerators.py \
    tests/test_batch_rows.py tests/test_ingress_hang.py 2>&1 | tail -15
  date -u
  [ -n "${NO_DEMO:-}" ] || timeout 200 python3 -m inferbus.cli up --backends onnxruntime,jax --demo --nats-port 0 --run-dir /tmp/gpu-run 2>&1 \
    | tail -12
  echo "up rc=${PIPESTATUS[0]}"; date -u; } > "$OUT/gpu.log" 2>&1
