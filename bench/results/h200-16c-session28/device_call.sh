#!/usr/bin/env bash
# twenty-eighth session's first device call: ONE shortened throughput suite
# with nats-server kept off the 11 serving cores (--nats-cpus 11-15, shared with the 4 generators), and, new, the echo
# measured again through an unpinned nats-server in the same run (series 'echo [nats unpinned]'), so that the
# throughput target is read against the better echo of the two layouts in one run. Steps of 1.5 s, closed c=64
# only, no direct floor, no Ray (it cannot run there). New: the stage timings of every miss slower than 2.5 ms
# are added up on their own (stages_tail_us, with 'inbound': send -> ingress callback), at the sweep's last rate
# under p99 5 ms and its first over.
#   OUT=... bash bench/results/h200-16c-session28/device_call.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
date -u; nproc
timeout 200 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 --echo 11 \
  --closed 64 --no-direct --nats-cpus 11-15 --duration 1.5 --sweep-max-steps 8 --sweep-factor 1.35 \
  --json "$OUT/suite.json" --png "$OUT/suite.png" 2>&1 | tee "$OUT/suite.log" | tail -n 60
date -u
