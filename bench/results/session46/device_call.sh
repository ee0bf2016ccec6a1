#!/usr/bin/env bash
# forty-sixth session, the one device call: the newest code, one run of the twenty-eighth session's shortened suite
# with two generators and the direct floor (the forty-fourth session's script with RUNS=1).
#   OUT=... bash bench/results/session46/device_call.sh   (carry .whl)
RUNS=${RUNS:-1} exec bash "$(dirname "$0")/../h200-16c-session44/device_call.sh"
