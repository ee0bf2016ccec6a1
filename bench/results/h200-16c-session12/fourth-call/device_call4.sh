set -u
mkdir -p /tmp/pcbase/bench && cp -r .base-tree/inferbus .base-tree/models /tmp/pcbase/ && cp bench/__init__.py bench/pathcost.py bench/_args.py /tmp/pcbase/bench/
mkdir -p "$OUT/r"
for r in 1 2; do for b in 8 1; do
  echo "[pathcost base b=$b r=$r] $(date -u +%T)"; (cd /tmp/pcbase && timeout 120 python3 -m bench.pathcost --other-workers 7 --batch $b --json "$OUT/r/pc-base-b$b-$r.json" 2>&1 | tail -4)
  echo "[pathcost work b=$b r=$r] $(date -u +%T)"; timeout 120 python3 -m bench.pathcost --other-workers 7 --batch $b --json "$OUT/r/pc-work-b$b-$r.json" 2>&1 | tail -4
done; done 2>&1 | tee "$OUT/r/log.txt"
tar czf "$OUT/pc8.tgz" -C "$OUT" r && rm -rf "$OUT/r"
