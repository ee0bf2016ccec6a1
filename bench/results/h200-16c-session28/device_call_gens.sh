#!/usr/bin/env bash
# twenty-eighth session, second experiment: the same shortened suite as device_call.sh, run twice in one call, with
# 2 and with 4 load-generator processes (order given by $ORDER, default "2 4"). The generators pace the open loop by
# spinning the last 0.5 ms before each 1 ms tick, on cores 15, 14, ... which they share with nats-server (11-15):
# does fewer spinners there move the echo's and inferbus's p99 < 5 ms crossings?
#   OUT=... ORDER="4 2" bash bench/results/h200-16c-session28/device_call_gens.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nproc
for g in ${ORDER:-2 4}; do
  date -u
  timeout 200 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 --echo 11 \
    --gens "$g" --closed 64 --no-direct --nats-cpus 11-15 --duration 1.5 --sweep-max-steps 8 --sweep-factor 1.35 \
    --json "$OUT/suite-gens$g.json" --png "$OUT/suite-gens$g.png" > "$OUT/suite-gens$g.log" 2>&1
  python3 - "$OUT/suite-gens$g.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t, h = d["ratios"]["throughput"], d["ratios"]["half_load"]
print(sys.argv[1], {k: t.get(k) for k in ("echo_max_qps_p99_under_limit", "echo_nats_unpinned_max_qps_p99_under_limit",
      "inferbus_max_qps_p99_under_limit", "inferbus_over_best_echo", "inferbus_max_sustained_qps")}, h)
PY
done
date -u
