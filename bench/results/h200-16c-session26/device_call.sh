#!/usr/bin/env bash
# twenty-sixth session's device call: one alternated pair of the throughput suite on the same code (the working
# tree as its own base, `--base-tree .`), the work side with nats-server kept off the 11 serving cores
# (`--nats-cpus 11-15`: it shares cores 12-15 with the 4 generators), the base side with nats-server unpinned, as in
# every earlier run; otherwise the suite of the last three sessions (11 colocated processes, echo and direct floor
# on 11 responders, closed c=1 and c=64, sweeps alternated).
#   OUT=... bash bench/results/h200-16c-session26/device_call.sh TAG base|work [NATS_CPUS] [EXTRA SUITE ARGS...]
# (carry .whl; the wheels are those listed in docs/performance.md's device notes)
set -u
OUT=${OUT:-/tmp/out}; tag=$1; first=${2:-base}; cpus=${3:-11-15}; shift 3 2>/dev/null || shift $#
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
date -u; nproc; lscpu | grep -iE "^(model name|thread|core|socket|numa node|l[123])" || true
timeout 560 python3 -m bench.ab --base-tree . --pairs 1 --first "$first" --work-args "--nats-cpus $cpus ${WORK_EXTRA:-}" \
  --out "$OUT/$tag" -- --profile throughput --no-ray --colocate --workers 11 --ingress 1 --echo 11 --closed 1,64 \
  --direct "$@"
date -u
