#!/usr/bin/env bash
# fifty-fifth session: `inferbus up --http-infer` on free ports, then bench.http_load (HTTP keep-alive vs NATS, same
# node, closed loops). RUN, NP, HP, UPARGS, LOADARGS, JSON from the environment.
set -u
RUN=${RUN:-/tmp/hl-run}; rm -rf $RUN; mkdir -p $RUN
NP=${NP:-14222}; HP=${HP:-18000}
python3 -m inferbus.cli up --nats-port $NP --http-port $HP --http-host 127.0.0.1 --http-infer --run-dir $RUN ${UPARGS:-} > $RUN/up.out 2>&1 &
UP=$!
python3 - $HP <<'PY'
import sys, time, urllib.request
for _ in range(240):
    try:
        print("ready", urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v2/health/ready", timeout=1).status); break
    except Exception:
        time.sleep(0.5)
PY
python3 -m bench.http_load --url http://127.0.0.1:$HP --nats nats://127.0.0.1:$NP ${LOADARGS:-} --json ${JSON:-/tmp/hl.json}
rc=$?
kill -TERM $UP; wait $UP; echo "up rc=$? load rc=$rc"
