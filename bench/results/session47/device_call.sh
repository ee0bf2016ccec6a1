#!/usr/bin/env bash
# forty-seventh session, first device call: the newest code, two runs of the twenty-eighth session's shortened suite
# with two generators and the direct floor (the forty-fourth session's script).
#   OUT=... bash bench/results/session47/device_call.sh   (carry .whl)
RUNS=${RUNS:-"1 2"} exec bash "$(dirname "$0")/../h200-16c-session44/device_call.sh"
