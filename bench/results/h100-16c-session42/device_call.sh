#!/usr/bin/env bash
# forty-second session, one device call: the GPU path on the newest code (accelerator tests, the JAX worker's
# chunked batches with the new between_chunks stage, `up --backends onnxruntime,jax --demo`), then one run of the
# twenty-eighth session's shortened suite with two generators and the direct floor.
#   OUT=... bash bench/results/h100-16c-session42/device_call.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
{
  git log --oneline -1 2>/dev/null || true
  lscpu | grep "Model name"; nvidia-smi -L; nproc; date -u
  timeout 200 python3 -m pytest -p no:cacheprovider -o addopts="" -q tests/test_accelerators_gpu.py tests/test_accelerators.py 2>&1 | tail -4
  date -u
  timeout 150 python3 bench/results/h100-16c-session41/chunk_gpu.py "$OUT" 20000 1024,0 2>&1 | tail -8
  date -u
  timeout 150 python3 -m inferbus.cli up --backends onnxruntime,jax --demo --nats-port 0 2>&1 | tail -6
  echo "up rc=$?"; date -u
} > "$OUT/gpu.log" 2>&1
mkdir -p /tmp/png
timeout 240 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 --echo 11 \
  --closed 64 --direct --nats-cpus 11-15 --duration 1.5 --sweep-max-steps 8 --sweep-factor 1.35 --tick-timer \
  --gens 2 --json "$OUT/suite-1-g2d.json" --png /tmp/png/suite-1-g2d.png > "$OUT/suite-1-g2d.log" 2>&1
python3 bench/results/h200-16c-session30/summary.py "$OUT/suite-1-g2d.json" > "$OUT/summary.txt" 2>&1
date -u >> "$OUT/summary.txt"
