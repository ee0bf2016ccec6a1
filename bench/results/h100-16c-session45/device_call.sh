#!/usr/bin/env bash
# forty-fifth session, the one device call: the newest code (the inline price clipped), one run of the twenty-eighth session's
# shortened suite with two generators and the direct floor, for the status table.
#   OUT=... bash bench/results/h100-16c-session45/device_call.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
{ git log --oneline -1 2>/dev/null || true; lscpu | grep "Model name"; nvidia-smi -L; nproc; date -u; } > "$OUT/host.txt" 2>&1
mkdir -p /tmp/png
for i in ${RUNS:-1}; do
  timeout 250 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 --echo 11 \
    --closed 64 --direct --nats-cpus 11-15 --duration 1.5 --sweep-max-steps 8 --sweep-factor 1.35 --tick-timer \
    --gens 2 --json "$OUT/suite-$i.json" --png /tmp/png/suite-$i.png > "$OUT/suite-$i.log" 2>&1
  python3 bench/results/h200-16c-session30/summary.py "$OUT/suite-$i.json" >> "$OUT/summary.txt" 2>&1
  date -u >> "$OUT/summary.txt"
done
