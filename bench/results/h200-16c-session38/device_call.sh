#!/usr/bin/env bash
# thirty-eighth session: this code (the colocated flight record on each miss, the shared query-of-death memory) against
# a79ce15 (the thirty-seventh session's code), one alternated pair of the twenty-eighth session's shortened suite.
#   git archive a79ce15 inferbus bench models | tar -x -C .ab/base; rm -rf .ab/base/bench/results
#   OUT=... PAIRS=2 FIRST=base bash bench/results/h200-16c-session38/device_call.sh    (carry .whl and .ab)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nproc; date -u
timeout ${AB_TIMEOUT_S:-540} python3 -m bench.ab --base-tree .ab/base --pairs "${PAIRS:-2}" --first "${FIRST:-base}" \
  --out /tmp/ab -- --profile throughput --no-ray --colocate --workers 11 --ingress 1 --echo 11 --closed 64 \
  --no-direct --nats-cpus 11-15 --duration 1.5 --sweep-max-steps 8 --sweep-factor 1.35 --tick-timer --gens 2 \
  2>&1 | tee "$OUT/ab.log"
for f in /tmp/ab/base-*.json /tmp/ab/work-*.json; do echo "== $f"; python3 bench/results/h200-16c-session30/summary.py "$f"; done 2>&1 | tee "$OUT/summary.txt"
tar -czf "$OUT/ab.tgz" -C /tmp/ab . ; date -u
