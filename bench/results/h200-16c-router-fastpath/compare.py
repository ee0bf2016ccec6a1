"""Same-run comparison of suite results (run-to-completion A/B): python bench/results/h200-16c-run-now/compare.py on1.json off1.json ..."""
import json, sys
for path in sys.argv[1:]:
    d = json.load(open(path))
    print("==", path, d["meta"]["date"])
    st = {}
    for s in d["steps"]:
        if s["mode"] == "closed":
            st[(s["series"], s["concurrency"])] = s
    for c in (1, 64):
        m, di, e = st[("inferbus miss", c)], st[("direct", c)], st[("echo", c)]
        ic = m.get("ingress_counts") or {}
        print(f"  c={c}: echo {e['qps']:.0f}/s  direct {di['qps']:.0f}/s p50 {di['p50_us']:.0f}  miss {m['qps']:.0f}/s p50 {m['p50_us']:.0f} p99 {m['p99_us']:.0f} | cpu echo {e['cpu_us_per_req'].get('echo',0):.0f} direct {di['cpu_us_per_req'].get('direct',0):.0f} coloc {m['cpu_us_per_req'].get('colocated',0):.0f} (÷direct {m['cpu_us_per_req'].get('colocated',0)/max(1,di['cpu_us_per_req'].get('direct',1)):.2f}) | miss qps÷direct {m['qps']/di['qps']:.2f} | run_now {ic.get('run_now')}/{ic.get('requests')}")
    r = d["ratios"]
    print("  p99<5ms: echo", r["throughput"]["echo_max_qps_p99_under_limit"], "direct", r["direct"]["throughput"]["direct_max_qps_p99_under_limit"], "inferbus", r["throughput"]["inferbus_max_qps_p99_under_limit"], "÷echo", r["throughput"]["inferbus_over_echo"], "÷direct", r["direct"]["throughput"]["inferbus_over_direct"], "direct÷echo", r["direct"]["throughput"]["direct_over_echo"])
    print("  sustained: echo", r["throughput"]["echo_max_sustained_qps"], "direct", r["direct"]["throughput"]["direct_max_sustained_qps"], "inferbus", r["throughput"]["inferbus_max_sustained_qps"])
    hl = d["half_load"]
    mi = hl["inferbus miss"]; ic = next((s.get("ingress_counts") for s in d["steps"] if s["series"] == "inferbus miss" and s["mode"] == "open" and s.get("rate_qps") == hl["rate"]), None)
    hcpu = {s["series"]: s["cpu_us_per_req"] for s in d["steps"] if s["mode"] == "open" and s.get("rate_qps") == hl["rate"]}
    print(f"  half {hl['rate']}: miss p50/p99 ÷(echo+model) {r['half_load']['miss_p50_over_echo_plus_model']} / {r['half_load']['miss_p99_over_echo_plus_model']}, direct {r['direct']['half_load']['direct_p50_over_echo_plus_model']} / {r['direct']['half_load']['direct_p99_over_echo_plus_model']}, hit p50÷echo {r['half_load']['hit_p50_over_echo_p50']} | cpu echo {hcpu.get('echo',{}).get('echo',0):.0f} direct {hcpu.get('direct',{}).get('direct',0):.0f} miss {hcpu.get('inferbus miss',{}).get('colocated',0):.0f} | run_now {ic and ic.get('run_now')}/{ic and ic.get('requests')}")
    sw = d["sweeps"].get("inferbus miss", {})
    pts = [(round(p.get("rate_qps") or p.get("offered_qps") or 0), (p.get("ingress_counts") or {}).get("run_now"), (p.get("ingress_counts") or {}).get("requests")) for p in d["steps"] if p["series"] == "inferbus miss" and p["mode"] == "open"]
    print("  sweep run_now/requests:", pts)
