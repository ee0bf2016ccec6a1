#!/usr/bin/env bash
# forty-eighth session, one device call: the session's code, two runs of the twenty-eighth session's shortened suite
# with two generators and the direct floor (the forty-fourth session's script).
#   OUT=... bash bench/results/session48/device_call.sh   (carry .whl)
RUNS=${RUNS:-"1 2"} exec bash "$(dirname "$0")/../h200-16c-session44/device_call.sh"
