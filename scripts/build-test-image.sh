#!/usr/bin/env bash
# Build polar-test:latest (or $1) for the docker runtime's tests, with no registry: `docker import` of a root
# filesystem taken from this host's system directories (shell, coreutils, procps, shared libraries, /etc).
# Python and polar are not in the image: the docker runtime bind-mounts the running venv and its base
# interpreter read-only at their host paths. Idempotent: does nothing when the image exists.
set -euo pipefail

image=${1:-polar-test:latest}
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image exists"
  exit 0
fi

skeleton=$(mktemp -d)
trap 'rm -rf "$skeleton"' EXIT
mkdir -p "$skeleton"/{tmp,var/tmp,root,home,run,proc,sys,dev,work}
chmod 1777 "$skeleton/tmp" "$skeleton/var/tmp"

system=(etc bin sbin lib lib64 usr/bin usr/sbin usr/lib64 usr/libexec usr/lib/x86_64-linux-gnu
        usr/lib/locale usr/share/ca-certificates usr/share/zoneinfo)
present=()
for path in "${system[@]}"; do [ -e "/$path" ] || [ -L "/$path" ] && present+=("$path"); done

echo "building $image from the host's ${present[*]} ..."
{ tar -cf - --numeric-owner \
    --exclude='usr/lib/x86_64-linux-gnu/libLLVM*' --exclude='usr/lib/x86_64-linux-gnu/*.a' \
    --exclude='usr/lib/x86_64-linux-gnu/valgrind' --exclude='usr/lib/x86_64-linux-gnu/dri' \
    --exclude='etc/docker' --exclude='etc/ssh/ssh_host_*' --exclude='etc/shadow*' --exclude='etc/gshadow*' \
    -C / "${present[@]}" -C "$skeleton" tmp var root home run proc sys dev work 2>/dev/null || [ $? -eq 1 ]; } \
  | docker import --change 'CMD ["sleep", "infinity"]' - "$image" >/dev/null
echo "built $image ($(docker image inspect -f '{{.Size}}' "$image") bytes)"
