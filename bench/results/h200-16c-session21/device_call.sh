#!/usr/bin/env bash
# twenty-first session's device call (the twentieth's script): the nineteenth session's throughput suite (11 colocated processes, the echo and
# the direct floor on 11 responders, closed c=1 and c=64, alternated sweeps), once per variant named, in order:
#   off     the actors block in epoll between requests (the default)
#   bpN     `--busy-poll-us N`: each actor process keeps its loop polling N µs after each request
# The echo never busy-polls: the floor is nats-py as issue 3 defines it.
#   OUT=... bash device_call.sh TAG VARIANT [VARIANT ...]
set -u
OUT=${OUT:-/tmp/out}; tag=$1; shift; mkdir -p "$OUT/$tag"
{
date -u; nproc
k=0
for v in "$@"; do
  k=$((k + 1))
  case $v in
    off) extra=() ;;
    bp*) extra=(--busy-poll-us "${v#bp}") ;;
    *) echo "unknown variant $v"; exit 2 ;;
  esac
  echo "[suite $k: $v] $(date -u +%T)"
  timeout 280 python3 -m bench.suite --profile throughput --no-ray --colocate --workers 11 --ingress 1 \
    --echo 11 --closed 1,64 --direct "${extra[@]}" --json "$OUT/$tag/suite-$k-$v.json" 2>&1 | tail -40
done
date -u
} 2>&1 | tee "$OUT/$tag/log.txt"
