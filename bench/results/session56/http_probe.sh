#!/usr/bin/env bash
# fifty-sixth session: where the HTTP gateway's time goes on 16 cores. For each GIL switch interval (IB_SWITCH, an
# uncommitted experiment hook in cli.py; "" = Python's 5 ms): up --http-infer (default layout), bench.http_load at
# c=1,8,64, then a py-spy --gil profile of the node process under HTTP c=8 (carry .whl, py-spy included).
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
for SW in ${SWITCHES:-"" 0.0005}; do
  tag=sw${SW:-default}
  RUN=/tmp/hp-$tag; rm -rf $RUN; mkdir -p $RUN
  NP=14222; HP=18000
  IB_SWITCH=$SW python3 -m inferbus.cli up --nats-port $NP --http-port $HP --http-host 127.0.0.1 --http-infer --run-dir $RUN > $RUN/up.out 2>&1 &
  UP=$!
  python3 - $HP <<'PY'
import sys, time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v2/health/ready", timeout=1); break
    except Exception:
        time.sleep(0.5)
PY
  echo "== $tag $(date -u)"
  timeout 120 python3 -m bench.http_load --url http://127.0.0.1:$HP --nats nats://127.0.0.1:$NP --concurrency 1,8,64 --seconds 3 --json $OUT/http-$tag.json
  if [ -n "${SPY-1}" ]; then
    (sleep 2; timeout 20 py-spy record -p $UP -d 3 -r 250 --gil -f raw -o $OUT/spy-gil-$tag.txt --threads > $OUT/spy-$tag.log 2>&1) &
    SP=$!
    timeout 60 python3 -m bench.http_load --url http://127.0.0.1:$HP --nats nats://127.0.0.1:$NP --concurrency 8 --seconds 6 2>&1 | grep http
    wait $SP
    ps -L -p $UP | wc -l
  fi
  kill -TERM $UP; wait $UP
done
