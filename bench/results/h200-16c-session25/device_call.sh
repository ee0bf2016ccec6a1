#!/usr/bin/env bash
# twenty-fifth session's device call: one alternated A/B pair of the throughput suite (11 colocated processes,
# the echo and the direct floor on 11 responders, closed c=1 and c=64, sweeps alternated), the base being
# 60407de (the generator before its lean judge) extracted into ab_base/
# with `git archive 60407de inferbus bench models | tar -x -C ab_base`, the work side the working tree.
#   OUT=... bash bench/results/h200-16c-session25/device_call.sh TAG base|work
# (carry .whl and ab_base; the wheels are those listed in docs/performance.md's device notes)
set -u
OUT=${OUT:-/tmp/out}; tag=$1; first=${2:-base}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
date -u; nproc
timeout 560 python3 -m bench.ab --base-tree ab_base --pairs 1 --first "$first" --out "$OUT/$tag" -- \
  --profile throughput --no-ray --colocate --workers 11 --ingress 1 --echo 11 --closed 1,64 --direct
date -u
