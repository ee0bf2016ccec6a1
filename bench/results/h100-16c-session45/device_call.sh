#!/usr/bin/env bash
# forty-fifth session, the one device call: the newest code (the inline price clipped), one run of the
# twenty-eighth session's shortened suite with two generators and the direct floor: the forty-fourth session's
# script with RUNS=1 (what ran, 2026-12-06 05:36 UTC).
#   OUT=... bash bench/results/h100-16c-session45/device_call.sh   (carry .whl)
RUNS=${RUNS:-1} exec bash "$(dirname "$0")/../h200-16c-session44/device_call.sh"
