#!/usr/bin/env bash
# twenty-ninth session, the harness: the twenty-eighth session's shortened suite (device_call.sh there) three times in
# one call, each variant named in $ORDER (default "timer4 timer2 spin4"):
#   timer4  the open loop paced by the generators' timerfd (the default), 4 generator processes (the default);
#   timer2  the same with 2 generator processes: fewer generators on cores 11-15, which they share with nats-server;
#   spin4   the old sleep-then-spin pacing (--no-tick-timer), 4 generators: the pacing pair the last session could only
#           run on a slow host.
# Read only when the host is at its usual speed: the model's in-process p50 (suite log, "model") about 12 us.
#   OUT=... ORDER="timer2 timer4 spin4" bash bench/results/h200-16c-session29/device_call_harness.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nproc
for v in ${ORDER:-timer4 timer2 spin4}; do
  flags="--tick-timer --gens ${v: -1}"; [ "${v%?}" = spin ] && flags="--no-tick-timer --gens ${v: -1}"
  date -u
  timeout 180 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 --echo 11 \
    --closed 64 --no-direct --nats-cpus 11-15 --duration 1.5 --sweep-max-steps 8 --sweep-factor 1.35 $flags \
    --json "$OUT/suite-$v.json" --png "$OUT/suite-$v.png" > "$OUT/suite-$v.log" 2>&1
  python3 bench/results/h200-16c-session29/summary.py "$OUT/suite-$v.json"
done
date -u
