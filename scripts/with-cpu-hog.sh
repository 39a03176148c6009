#!/usr/bin/env bash
# Run a command beside processes that keep CPU cores busy the whole time (HOG_CORES, default 1), then stop them:
# `make test-stress` runs the suite this way, to show it does not depend on a quiet machine before you submit.
#   scripts/with-cpu-hog.sh make test          # one core kept busy
#   HOG_CORES=2 scripts/with-cpu-hog.sh make test
set -euo pipefail

cores=${HOG_CORES:-1}
hogs=()
stop_hogs() { for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_hogs EXIT INT TERM
for _ in $(seq 1 "$cores"); do
  # A shell busy loop at normal priority: it competes for the core as a noisy neighbour would.
  bash -c 'while :; do :; done' &
  hogs+=("$!")
done
echo "with-cpu-hog: ${cores} busy loop(s) (pids ${hogs[*]}) beside: $*" >&2
status=0
"$@" || status=$?
exit "$status"
