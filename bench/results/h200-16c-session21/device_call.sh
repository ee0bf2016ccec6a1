#!/usr/bin/env bash
# twenty-first session's device call: the twentieth session's script, unchanged (the throughput suite with
# 11 colocated processes, the echo and the direct floor on 11 responders), run as `... call1 off off`:
#   OUT=... bash bench/results/h200-16c-session21/device_call.sh TAG VARIANT [VARIANT ...]
exec bash "$(dirname "$0")/../h200-16c-session20/device_call.sh" "$@"
