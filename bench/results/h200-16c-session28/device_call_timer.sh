#!/usr/bin/env bash
# twenty-eighth session, the generators' pacing: the shortened suite of device_call.sh twice in one call, with the
# open loop's ticks woken through a timerfd (the new default) and with the old sleep-then-spin pacing
# (--no-tick-timer), in the order $ORDER (default "timer spin"). The old pacing's send lag was 1.1-1.4 ms at p99 at
# every rate on this host (call2/suite.json), and it is part of every open-loop latency.
#   OUT=... ORDER="spin timer" bash bench/results/h200-16c-session28/device_call_timer.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nproc
for p in ${ORDER:-timer spin}; do
  flag=--tick-timer; [ "$p" = spin ] && flag=--no-tick-timer
  date -u
  timeout 200 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 --echo 11 \
    --closed 64 --no-direct --nats-cpus 11-15 --duration 1.5 --sweep-max-steps 8 --sweep-factor 1.35 $flag \
    --json "$OUT/suite-$p.json" --png "$OUT/suite-$p.png" > "$OUT/suite-$p.log" 2>&1
  python3 - "$OUT/suite-$p.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t, h, hp = d["ratios"]["throughput"], d["ratios"]["half_load"], d["ratios"]["half_p99_load"]
print(sys.argv[1], {s["pacing"] for s in d["steps"] if s["mode"] == "open"})
print(" ", {k: t.get(k) for k in ("echo_max_qps_p99_under_limit", "echo_nats_unpinned_max_qps_p99_under_limit",
      "inferbus_max_qps_p99_under_limit", "inferbus_over_best_echo", "inferbus_max_sustained_qps")})
print("  half", h)
print("  half p99", hp)
for s in d["steps"]:
    if s["mode"] == "open" and s["series"] in ("echo", "inferbus miss"):
        print("  %-14s %7.0f/s lag p50/p99 %4.0f/%5.0f  p50 %5.0f p99 %6.0f" % (s["series"], s["rate_qps"],
              s["send_lag_p50_us"], s["send_lag_p99_us"], s["p50_us"], s["p99_us"]))
PY
done
date -u
