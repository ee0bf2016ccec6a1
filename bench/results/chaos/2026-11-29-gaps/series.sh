#!/bin/bash
# drills affected by the gap fixes (branch rel), then the two 10-minute soaks, one at a time;
# one JSON line per drill run, one JSON object per soak
cd /work/wt-rel
OUT=bench/results/chaos/2026-11-29-gaps
PY=/tmp/venv-rel/bin/python
run() { # name n args...
  local name=$1 n=$2; shift 2
  for i in $(seq 1 $n); do
    echo "$(date -Is) $name $i $* load=$(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/series.log
    timeout 400 $PY -m inferbus.cli chaos run $name --json "$@" 2>>$OUT/series.err | tail -1 >> $OUT/$name${TAG}.jsonl
  done
}
run nats-node-loss 5 --rate 100 --duration 8
run worker-hang 3 --rate 100
run worker-crash 3 --rate 100
run region-failover 3 --rate 100 --duration 6
TAG=-topology-1-worker run soak 1 --topology --workers 1 --faults hang-worker --fault-every 10 --duration 60 --rate 100
soak() { # tag args...
  local tag=$1; shift
  (date -Is; cat /proc/loadavg) > $OUT/soak-$tag-600s.env
  echo "$(date -Is) soak $tag $*" >> $OUT/series.log
  timeout 900 $PY -m inferbus.cli chaos run soak --duration 600 --rate 100 --json "$@" > $OUT/soak-$tag-600s.json 2> $OUT/soak-$tag-600s.err
}
soak node
soak topology --topology
echo "$(date -Is) done" >> $OUT/series.log
