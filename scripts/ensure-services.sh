#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432, trust auth) and Redis (127.0.0.1:6379) answer; start them, or install
# them from Debian's packages and start them, when they do not. The test suite needs both for real.
set -euo pipefail

reachable() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
wait_for() { for _ in $(seq 1 60); do reachable "$1" && return 0; sleep 0.5; done; echo "port $1 still closed" >&2; return 1; }

if ! reachable 5432; then
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    echo "installing PostgreSQL ..."
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  conf=/etc/postgresql/$version/main
  # Trust auth on loopback, as the suite expects (a developer or CI machine only).
  if ! grep -q "polar-test" "$conf/pg_hba.conf"; then
    as_root sed -i '1i host all all 127.0.0.1/32 trust # polar-test\nhost all all ::1/128 trust # polar-test\nlocal all all trust # polar-test' "$conf/pg_hba.conf"
  fi
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || as_root pg_ctlcluster "$version" main start
  wait_for 5432
  psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" | grep -q 1 \
    || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test" >/dev/null
fi

# Room for the suite's connections: each test process keeps its shared stack up beside the stack of the module it
# runs (a dozen processes each, two connections or so apiece, more at a batch's peak), and three test processes
# reached Postgres's default of 100 ("sorry, too many clients already"). A developer or CI machine only: the
# cluster is restarted once to take the setting.
MIN_CONNECTIONS=300
connections=$(psql -h 127.0.0.1 -U postgres -tAc "SHOW max_connections")
if [ "$connections" -lt "$MIN_CONNECTIONS" ]; then
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  psql -h 127.0.0.1 -U postgres -qc "ALTER SYSTEM SET max_connections = $MIN_CONNECTIONS"
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main restart || as_root pg_ctlcluster "$version" main restart
  wait_for 5432
  echo "postgres: max_connections $connections -> $MIN_CONNECTIONS"
fi

if ! reachable 6379; then
  if ! command -v redis-server >/dev/null; then
    echo "installing Redis ..."
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
  mkdir -p /tmp/polar-redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no --dir /tmp/polar-redis \
    --logfile /tmp/polar-redis/redis.log
  wait_for 6379
fi
echo "postgres and redis are reachable"

# bubblewrap for the bwrap runtime.
if ! command -v bwrap >/dev/null; then
  echo "installing bubblewrap ..."
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null \
    || echo "WARNING: could not install bubblewrap; the bwrap runtime tests will fail" >&2
fi

# Chromium (headless) for the web console's browser tests (tests/e2e/test_console.py).
if ! command -v chromium >/dev/null; then
  echo "installing chromium ..."
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
    || echo "WARNING: could not install chromium; the console's browser tests will fail" >&2
fi

# docker-compose (v1, Debian's) for the check that compose.yaml refuses to come up without its secrets.
if ! command -v docker-compose >/dev/null && ! docker compose version >/dev/null 2>&1; then
  echo "installing docker-compose ..."
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null \
    || echo "WARNING: could not install docker-compose; tests/test_compose.py skips its compose CLI checks" >&2
fi

# A Docker engine for the docker runtime. Sessions run with no network at all (network_mode none), so no bridge
# and no iptables are needed.
# Never fatal: without an engine the docker tests skip loudly ("NO DOCKER ENGINE: ...").
start_dockerd() {
  if ! command -v dockerd >/dev/null; then
    echo "installing docker.io ..."
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null \
      || return 1
  fi
  as_root sh -c 'nohup dockerd --iptables=false --bridge=none > /tmp/polar-dockerd.log 2>&1 &'
  for _ in $(seq 1 60); do as_root docker info >/dev/null 2>&1 && return 0; sleep 0.5; done
  return 1
}
if docker info >/dev/null 2>&1; then
  echo "docker engine is reachable"
elif start_dockerd; then
  echo "docker engine started (log: /tmp/polar-dockerd.log)"
else
  echo "!!!!! WARNING: no Docker engine could be started (see /tmp/polar-dockerd.log); docker tests will SKIP !!!!!" >&2
fi
