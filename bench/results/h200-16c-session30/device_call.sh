#!/usr/bin/env bash
# thirtieth session: the generator-count pair on one host speed, and the Python floor ("direct") against this code.
# Each variant in $ORDER runs the twenty-eighth session's shortened suite once:
#   g2 / g4     timerfd pacing, 2 / 4 generator processes, no direct series;
#   g2d / g4d   the same with the direct responders (--direct: decode, model at batch 1, encode; nothing else).
# Alternate the variants (e.g. "g2 g4 g2 g4") so that a change of the host's speed within the call shows as a
# difference between two runs of one variant. Read a run only when the model's in-process p50 is about 12 us.
#   OUT=... ORDER="g2 g4 g2 g4" bash bench/results/h200-16c-session30/device_call.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
mkdir -p /tmp/png
nproc
i=0
for v in ${ORDER:-g2 g4 g2 g4}; do
  i=$((i + 1))
  g=${v:1:1}; direct=--no-direct; [ "${v:2:1}" = d ] && direct=--direct
  date -u
  timeout 240 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 --echo 11 \
    --closed 64 $direct --nats-cpus 11-15 --duration 1.5 --sweep-max-steps 8 --sweep-factor 1.35 --tick-timer \
    --gens "$g" --json "$OUT/suite-$i-$v.json" --png "/tmp/png/suite-$i-$v.png" > "$OUT/suite-$i-$v.log" 2>&1
  python3 bench/results/h200-16c-session30/summary.py "$OUT/suite-$i-$v.json"
  tar -czf "$OUT/png.tgz" -C /tmp/png .   # one file for all plots: the files that come back are few
done
date -u
