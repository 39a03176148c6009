#!/usr/bin/env bash
# Run a command, and everything it starts, within a CPU quota (a cgroup of its own; root): the suite on a machine
# this slow, as the slowest CI runner was. Docker's containers run in Docker's cgroups, outside the quota.
#   scripts/with-cpu-quota.sh 0.8 make test      # 0.8 of one CPU for the whole suite
set -euo pipefail

cpus=$1
shift
period=100000
quota=$(awk -v c="$cpus" -v p="$period" 'BEGIN { printf "%d", c * p }')
name="polar-quota-$$"
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # cgroup v2, unified
  group=/sys/fs/cgroup/$name
  mkdir "$group"
  echo "$quota $period" > "$group/cpu.max"
elif [ -d /sys/fs/cgroup/cpu ]; then  # cgroup v1
  group=/sys/fs/cgroup/cpu/$name
  mkdir "$group"
  echo "$period" > "$group/cpu.cfs_period_us"
  echo "$quota" > "$group/cpu.cfs_quota_us"
else
  echo "with-cpu-quota: no cgroup cpu controller here" >&2
  exit 2
fi
# The group goes once the command has ended; a process it left behind moves back to the root group first.
cleanup() {
  while read -r pid; do echo "$pid" > "$(dirname "$group")/cgroup.procs" 2>/dev/null || true; done < "$group/cgroup.procs"
  rmdir "$group" 2>/dev/null || true
}
trap cleanup EXIT
echo "with-cpu-quota: ${cpus} CPU for: $*" >&2
status=0
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' quota "$group" "$@" || status=$?
exit "$status"
