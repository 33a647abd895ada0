#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) answer; start them if they
# are installed but stopped; fail with a clear message if they are not installed.
set -euo pipefail

PG_HOST=127.0.0.1 PG_PORT=5432 REDIS_HOST=127.0.0.1
REDIS_PORT="${REDIS_PORT:-6379}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

say() { echo "services: $*"; }
die() { echo "services: ERROR: $*" >&2; exit 1; }

postgres_up() {
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -h "$PG_HOST" -p "$PG_PORT"
  else
    (exec 3<>"/dev/tcp/$PG_HOST/$PG_PORT") 2>/dev/null
  fi
}

redis_up() {
  # PING over a plain socket: needs no client tools.
  local reply=""
  { exec 3<>"/dev/tcp/$REDIS_HOST/$REDIS_PORT"; } 2>/dev/null || return 1
  printf 'PING\r\n' >&3
  read -r -t 2 reply <&3 || true
  exec 3<&- 3>&-
  [[ "$reply" == +PONG* ]]
}

wait_for() {  # wait_for NAME CHECK SECONDS
  local name=$1 check=$2 deadline=$((SECONDS + $3))
  until "$check"; do
    [ "$SECONDS" -lt "$deadline" ] || die "$name did not come up within $3 s"
    sleep 0.5
  done
}

# --- PostgreSQL ---------------------------------------------------------------------------
if postgres_up; then
  say "PostgreSQL answers on $PG_HOST:$PG_PORT"
else
  command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ] && [ -n "$(ls /etc/postgresql)" ] \
    || die "PostgreSQL is not running on $PG_HOST:$PG_PORT and is not installed (Debian: apt-get install postgresql)"
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  say "starting PostgreSQL $version (cluster main)"
  $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main start \
    || say "pg_ctlcluster returned non-zero (already starting?); waiting for it"
  wait_for PostgreSQL postgres_up 60
  say "PostgreSQL is up"
fi

# --- Redis --------------------------------------------------------------------------------
if redis_up; then
  say "Redis answers on $REDIS_HOST:$REDIS_PORT"
else
  command -v redis-server >/dev/null 2>&1 \
    || die "Redis is not running on $REDIS_HOST:$REDIS_PORT and is not installed (Debian: apt-get install redis-server)"
  say "starting Redis"
  $SUDO mkdir -p /var/lib/redis /var/log/redis
  $SUDO redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for Redis redis_up 30
  say "Redis is up"
fi
