#!/usr/bin/env bash
# twenty-ninth session, the router's local fast path priced by the class (22159df): the shortened suite of
# device_call_harness.sh twice in one call, with this tree ("new") and with a copy of it in which that pricing is
# switched off by one sed ("old": the fast path prices the local worker by its own EWMA, as before 22159df), in the
# order $ORDER (default "new old"). Both count the full scans (ingress_counts.route_scans).
#   OUT=... ORDER="old new" bash bench/results/h200-16c-session29/device_call_router.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
rm -rf /tmp/old && mkdir /tmp/old && cp -r inferbus bench models /tmp/old/ 2>/dev/null
sed -i 's/        if (one_class and fastest is not None/        if (False and one_class and fastest is not None/' \
  /tmp/old/inferbus/actors/_router.py
grep -c "if (False and one_class" /tmp/old/inferbus/actors/_router.py || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
here=$PWD
nproc
for v in ${ORDER:-new old}; do
  tree=$here; [ "$v" = old ] && tree=/tmp/old
  date -u
  (cd "$tree" && PYTHONPATH=/tmp/site:$tree timeout 180 python3 -m bench.suite --profile throughput --no-ray --colocate \
    --workers 11 --ingress 1 --echo 11 --closed 64 --no-direct --nats-cpus 11-15 --duration 1.5 --sweep-max-steps 8 \
    --sweep-factor 1.35 --json "$OUT/suite-$v.json" --png "$OUT/suite-$v.png" > "$OUT/suite-$v.log" 2>&1)
  python3 "$here/bench/results/h200-16c-session29/summary.py" "$OUT/suite-$v.json" | head -5
  python3 - "$OUT/suite-$v.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for s in d["steps"]:
    if s["series"] == "inferbus miss":
        c = s.get("ingress_counts") or {}
        n = c.get("requests") or 0
        print("  %-6s %7.0f/s p99 %6.0f  scans/req %.3f  deferred/req %.3f  mean batch %s  colocated cpu/miss %s" % (
            s["mode"], s["rate_qps"] if s["mode"] == "open" else s["concurrency"], s["p99_us"],
            c.get("route_scans", 0) / n if n else -1, c.get("burst_deferred", 0) / n if n else -1,
            s.get("mean_batch"), (s.get("cpu_us_per_req") or {}).get("colocated")))
PY
done
date -u
