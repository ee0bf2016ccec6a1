#!/usr/bin/env bash
# One device call (DESIGN §11: absolute figures only from the H200 hosts). Usage, from the repo root:
#   bash bench/device_run.sh [all|x4|mesh|busy]     results (JSON, PNG, log) under $OUT
# all:  throughput profile (+ echo ceiling, same run), latency ('quick') profile, micro-benchmarks, py-spy profile.
# x4:   throughput profile with closed loops up to c=1024, then the latency profile (64-core host).
# mesh: the 100k attempt (64-core host): colocated processes spread over 4 gateway-joined nats-servers
#       (as many echo responders as colocated processes, on the same mesh and placement), then the same
#       colocated layout on one server, for the ratio.
# busy: busy polling A/B, alternated (colocated off, on, off, on; then the separate layout off, on), fixed open
#       rates, no sweep (~8 minutes on the 16-core host).
set -u
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
what=${1:-all}
{
  date -u; nproc; grep -m1 "model name" /proc/cpuinfo; python3 --version
  python3 -c "from importlib.metadata import version as v; print(*(f'{p} {v(p)}' for p in ('onnxruntime', 'nats-py', 'msgspec', 'uvloop', 'numpy')))"
  command -v nats-server py-spy
  closed=1,8,64,256
  [ "$what" = x4 ] && closed=1,8,64,256,1024
  if [ "$what" = busy ]; then
    ab() { local t=$1; shift
      timeout 130 python3 -m bench.suite --profile throughput --no-ray --closed 1,64 --no-sweep \
        --open-rates 10000,15000,20000,25000,30000 --json "$OUT/$t.json" "$@" || echo "suite $t failed: $?"; }
    C="--colocate --workers 8 --ingress 1"
    ab c-off-1 $C; ab c-on-1 $C --busy-poll-us 5000; ab c-off-2 $C; ab c-on-2 $C --busy-poll-us 5000
    ab s-off --workers 4 --ingress 4; ab s-on --workers 4 --ingress 4 --busy-poll-us 5000
    exit 0
  fi
  if [ "$what" = mesh ]; then
    n=$(nproc)
    timeout 420 python3 -m bench.suite --profile throughput --no-ray --colocate --workers $((n * 9 / 16)) \
      --gens $((n / 5)) --echo $((n * 9 / 16)) --nats-servers 4 --closed 1,64,256,1024 --json "$OUT/mesh4.json" || echo "mesh suite failed: $?"
    timeout 420 python3 -m bench.suite --profile throughput --no-ray --colocate --workers $((n * 9 / 16)) \
      --gens $((n / 5)) --echo $((n * 9 / 16)) --closed 1,64,256,1024 --json "$OUT/mesh1.json" || echo "one-server suite failed: $?"
    exit 0
  fi
  timeout 360 python3 -m bench.suite --profile throughput --ray --closed $closed --json "$OUT/throughput.json" \
    || echo "throughput suite failed: $?"
  timeout 150 python3 -m bench.suite --profile quick --workers 2 --ingress 1 --gens 2 --pin --json "$OUT/quick.json" \
    || echo "quick suite failed: $?"
  if [ "$what" = all ]; then
    timeout 60 python3 -m bench.micro --json "$OUT/micro.json" || echo "micro failed: $?"
    timeout 60 python3 -m bench.profile_hotpath --seconds 6 --workers 2 --gens 2 --concurrency 128 --no-l2 --out /tmp/prof \
      && tar czf "$OUT/profile.tgz" -C /tmp/prof . || echo "profile failed: $?"
  fi
} 2>&1 | tee "$OUT/log.txt"
