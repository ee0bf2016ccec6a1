#!/usr/bin/env bash
# thirty-seventh session: the serving-path additions of sessions 34-36 (lazy ml_dtypes, the query-of-death memory,
# the flight record, the SIGTERM handler, Router.behind_until, the busy-stale grace) against 606d80f (the code of the
# thirtieth to thirty-third sessions' suites), alternated pairs of the twenty-eighth session's shortened suite.
#   git archive 606d80f inferbus bench models | tar -x -C .ab/base; rm -rf .ab/base/bench/results
#   OUT=... PAIRS=2 FIRST=base bash bench/results/h200-16c-session37/device_call.sh    (carry .whl and .ab)
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
