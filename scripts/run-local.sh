#!/usr/bin/env bash
# Local run: prepare the `surety` database, then run the web app, two RQ workers and the
# sweeper in the foreground. Ctrl-C (or any one process exiting) stops all of them.
# Expects `make install services` to have run (`make run` does both).
#
# PORT (default 8000) is where the web app listens on 127.0.0.1; the sandbox connector's
# SANDBOX_BASE_URL and the alerts' SITE_URL follow it unless set. WEB_THREADS (default 16) is
# each of the web app's two processes' threads, each holding a database connection. Every process runs with
# config.local: alert e-mails are written to artifacts/mail/, refused requests are one line. DEBUG is on
# unless set: the only way config.settings gives the development SECRET_KEY and ALLOWED_HOSTS (with it
# off it refuses to load without SECRET_KEY), so the lines printed for a person to paste carry it too.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
PORT="${PORT:-8000}"
say() { echo "run: $*"; }

# --- the port, before anything is prepared or announced ----------------------------------------
if ! [[ "$PORT" =~ ^[0-9]+$ ]] || [ "$PORT" -lt 1 ] || [ "$PORT" -gt 65535 ]; then
  say "PORT must be a number from 1 to 65535, not '$PORT'" >&2
  exit 2
fi
# SO_REUSEADDR, as gunicorn binds: the last run's connections in TIME_WAIT (a minute after
# Ctrl-C) do not keep the port; a process listening on it does.
if ! "$PY" -c 'import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))' "$PORT" 2>/dev/null; then
  say "port $PORT on 127.0.0.1 is in use; choose another: make run PORT=8001" >&2
  exit 1
fi

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/surety}"
export DEBUG="${DEBUG:-true}"
export DJANGO_SETTINGS_MODULE="${DJANGO_SETTINGS_MODULE:-config.local}"
export SITE_URL="${SITE_URL:-http://127.0.0.1:$PORT}"
export SANDBOX_BASE_URL="${SANDBOX_BASE_URL:-$SITE_URL/sandbox/v1}"
export PYTHONUNBUFFERED=1

# --- the database -------------------------------------------------------------------------
say "ensuring database ${DATABASE_URL##*/}"
"$PY" - <<'PY'
import os, psycopg
from psycopg import sql
from urllib.parse import urlsplit

url = urlsplit(os.environ["DATABASE_URL"])
name = url.path.lstrip("/")
admin = url._replace(path="/postgres").geturl().replace("postgres://", "postgresql://", 1)
with psycopg.connect(admin, autocommit=True) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        print(f"run: created database {name}")
PY
say "migrating"
"$PY" manage.py migrate --noinput -v 0
if "$PY" manage.py help seed_demo >/dev/null 2>&1; then
  say "seeding demo data"
  "$PY" manage.py seed_demo
else
  say "no seed_demo command yet: skipping demo data"
fi
say "collecting static files"
"$PY" manage.py collectstatic --noinput -v 0

# --- the processes ------------------------------------------------------------------------
pids=()
start() {  # start NAME COMMAND...: run in the background, output prefixed with NAME
  local name=$1; shift
  # The prefixer ignores Ctrl-C, so it outlives its process and shows its shutdown.
  "$@" > >(trap '' INT TERM; exec sed -u "s/^/$name | /") 2>&1 &
  pids+=($!)
  say "started $name (pid $!): $*"
}

stopping=0
stop() {
  [ "$stopping" -eq 0 ] || return 0
  stopping=1
  say "stopping ${#pids[@]} processes"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 100); do  # up to 10 s for a warm shutdown
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 1 ] || break
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  say "stopped"
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT

# The web app in a process group of its own: Ctrl-C's SIGINT, sent to the terminal's whole group,
# would reach its workers too, and gunicorn's quick exit on it at times hangs a worker (in the
# interpreter's exit) until the master kills it 5 s later ("was sent SIGKILL! Perhaps out of
# memory?"). Out of that group, it gets only stop()'s SIGTERM: a graceful shutdown.
own_group() { exec "$PY" -c 'import os, sys; os.setpgid(0, 0); os.execv(sys.argv[1], sys.argv[1:])' "$@"; }
start web    own_group "$PY" -m gunicorn config.wsgi -b "127.0.0.1:$PORT" -k gthread -w 2 --threads "${WEB_THREADS:-16}" --timeout 60 --graceful-timeout 5 --access-logfile -
start worker1 "$PY" manage.py rqworker default --worker-class ledger.worker.Worker --with-scheduler
start worker2 "$PY" manage.py rqworker default --worker-class ledger.worker.Worker --with-scheduler
start sweeper "$PY" manage.py sweep

# Announced once the web app answers: gunicorn can still fail to start (the port taken meanwhile).
for _ in $(seq 1 300); do
  "$PY" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=1)' "$SITE_URL/accounts/login/" >/dev/null 2>&1 && break
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || { say "a process exited before the web app answered"; exit 1; }; done
  sleep 0.2
done
# SITE_URL must reach this web app, not another on its port: the replay set's webhook case
# posts there, and alerts link to it. A signed probe only this deployment answers tells.
if ! "$PY" manage.py check_site_url > >(sed -u "s/^/site | /") 2>&1; then
  say "SITE_URL=$SITE_URL does not reach this web app: set SITE_URL to its address (the replay set's webhook case fails)"
fi
# The replay set against the connector of every action type the demo agents use (refund,
# send_message, create_booking), run only for one that has not passed it as the workers run it,
# then each of their grants made live on that connector in ada's name, the demo person (a grant is
# made live by a person, never by the system; the reason says make run acted in her name). The
# seed wrote them live, bound to no connector, as its own doing; this binds them once, and again
# only once a review date passed or a connector changed, never at every start.
if ! "$PY" manage.py promote_demo_grants --by ada > >(sed -u "s/^/replay | /") 2>&1; then
  say "a replay set did not pass: the demo's grants for it stay as the seed wrote them, new grants shadow (see $SITE_URL/connectors/)"
fi
say "web app at $SITE_URL/ — Ctrl-C stops everything"
say "alert e-mails are written to ${EMAIL_FILE_PATH:-artifacts/mail}/"
say "an agent on this database: DATABASE_URL=$DATABASE_URL DEBUG=$DEBUG .venv/bin/python manage.py create_agent my-bot --grant refund --owner olga"
# The promotion asks these workers which connector they run: the shell needs this database and Redis.
say "and its refunds live: DATABASE_URL=$DATABASE_URL REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0} DEBUG=$DEBUG .venv/bin/python manage.py grant_promote my-bot refund --by ada --reason 'quick start'"
# Whichever process ends first (a crash, a kill) ends the whole run.
set +e
wait -n "${pids[@]}"
status=$?
set -e
say "a process exited with status $status; shutting down the rest"
exit "$status"
