#!/usr/bin/env bash
# twenty-fifth session's device call: the same alternated A/B pair of the throughput suite as the twenty-fourth
# session's script (11 colocated processes, the echo and the direct floor on 11 responders, closed c=1 and c=64,
# sweeps alternated), the base being 60407de (the load generator before its lean judge) extracted into ab_base/
# with `git archive 60407de inferbus bench models | tar -x -C ab_base`, the work side the working tree.
#   OUT=... bash bench/results/h200-16c-session25/device_call.sh TAG base|work
# (carry .whl and ab_base; the wheels are those listed in docs/performance.md's device notes)
exec bash "$(dirname "$0")/../h200-16c-session24/device_call.sh" "$@"
