"""One line per figure of a suite JSON that the thirtieth session's device calls read: the crossings, the half
loads, and each open step's send lag and percentiles.   python3 summary.py suite.json"""
import json
import sys

d = json.load(open(sys.argv[1]))
t, h, hp = d["ratios"]["throughput"], d["ratios"]["half_load"], d["ratios"]["half_p99_load"]
print(sys.argv[1], "pacing", sorted({s.get("pacing") for s in d["steps"] if s["mode"] == "open"}),
      "gens", sorted({s.get("gen_procs") for s in d["steps"] if s["mode"] == "open"}))
m = d["floors"]["model"]
print("  model in-process p50 %.1f us p99 %.1f us (read the run only near 12 us p50)" % (m["p50_us"], m["p99_us"]))
print(" ", {k: t.get(k) for k in ("echo_max_qps_p99_under_limit", "echo_nats_unpinned_max_qps_p99_under_limit",
      "inferbus_max_qps_p99_under_limit", "inferbus_over_best_echo", "inferbus_max_sustained_qps")})
if "direct" in d["ratios"]:
    print("  direct", d["ratios"]["direct"].get("throughput"), d["ratios"]["direct"].get("half_load"))
print("  half", h)
print("  half p99", hp)
for s in d["steps"]:
    if s["mode"] == "open" and s["series"] in ("echo", "echo [nats unpinned]", "direct", "inferbus miss"):
        print("  %-22s %7.0f/s lag p50/p99 %5.0f/%5.0f  p50 %5.0f p99 %6.0f  cpu %s" % (
            s["series"], s["rate_qps"], s.get("send_lag_p50_us") or -1, s.get("send_lag_p99_us") or -1,
            s["p50_us"], s["p99_us"], s.get("cpu_us_per_req")))
