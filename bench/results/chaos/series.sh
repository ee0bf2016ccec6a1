#!/bin/bash
# every drill a few times at 100 req/s; one JSON line per run
cd /work/main
OUT=bench/results/chaos
run() { # name n args...
  local name=$1 n=$2; shift 2
  for i in $(seq 1 $n); do
    echo "$(date -Is) $name $i $*" >> $OUT/series.log
    timeout 400 /tmp/venv/bin/inferbus chaos run $name --json "$@" 2>>$OUT/series.err | tail -1 >> $OUT/$name${TAG}.jsonl
  done
}
run worker-crash 3 --rate 100
run worker-hang 3 --rate 100
run cache-loss 3 --rate 100
run region-failover 3 --rate 100 --duration 6
run region-partition 3 --rate 100
run nats-node-loss 5 --rate 100 --duration 8
run gateway-degrade 3 --rate 100 --duration 8
TAG=-links-all run gateway-degrade 2 --rate 100 --duration 10 --fault-s 6 --links all
TAG=-on-degraded-wan run region-failover 2 --rate 100 --duration 6 --latency-ms 50 --drop-pct 5
echo "$(date -Is) done" >> $OUT/series.log
