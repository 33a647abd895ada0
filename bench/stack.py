"""The processes a benchmark run starts, the way tests/conftest.py starts them.

A fresh `surety_bench` database (dropped and created each run, then migrated), Redis DB 15
(flushed), one gunicorn (gthread) serving the API, the sandbox provider and the baseline views,
and RQ workers / the sweeper as separate processes. Each child runs in its own session, so it
and its children are stopped by its own process-group id and nothing else.

With `provider_database`, the sandbox provider the workers call is a service of its own, as a
real provider is: a second gunicorn on its own port and its own fresh database, so that its
CPU time (its processes, its PostgreSQL backends) is told apart from Surety's.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
DB_NAME = "surety_bench"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
PROVIDER_DB_NAME = "surety_bench_provider"
REDIS_URL = "redis://127.0.0.1:6379/15"

# What the server, the workers, the sweeper and this process agree on. LEASE_SECONDS is the
# figure (f) is judged by; CONNECTOR_TIMEOUT + LEASE_MARGIN_SECONDS must stay below it, or no
# worker would ever start a provider call. The sandbox's stall (a timeout_after_commit fault)
# outlasts CONNECTOR_TIMEOUT, so a worker in it is stuck long enough to be killed there.
STACK_ENV = {
    "DJANGO_SETTINGS_MODULE": "bench.settings",
    "DATABASE_URL": DATABASE_URL,
    "REDIS_URL": REDIS_URL,
    "DEBUG": "false",
    "PRODUCTION": "false",
    "LEASE_SECONDS": "10",
    "CONNECTOR_TIMEOUT": "6",
    "LEASE_MARGIN_SECONDS": "2",
    "SANDBOX_TIMEOUT_SLEEP": "20",
    "LOG_LEVEL": "WARNING",
    "PYTHONUNBUFFERED": "1",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url(name):
    return f"postgres://postgres@127.0.0.1:5432/{name}"


def reset_database(name=DB_NAME):
    """Drop and create database `name` (connections left by an earlier run are terminated)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def connection_slots():
    """(free, max): PostgreSQL connections still available to a non-superuser-reserved client."""
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        limit, reserved, used = conn.execute(
            "SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int,"
            " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')").fetchone()
    return limit - reserved - used, limit


def wait_for_connection_slots(needed, timeout=90):
    """Other test runs on the same server may hold most connections; wait a while for room."""
    deadline = time.monotonic() + timeout
    free, limit = connection_slots()
    while free < needed and time.monotonic() < deadline:
        time.sleep(2)
        free, limit = connection_slots()
    return free, limit


def flush_redis():
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()


class Stack:
    def __init__(self, logs, *, gunicorn_workers, gunicorn_threads, provider_database=None, provider_url=None,
                 env=None):
        """`provider_url`: the provider another Stack serves (this one starts none); `env` over
        STACK_ENV (the second stack of `--pooler` reaches the database through PgBouncer)."""
        self.logs = Path(logs)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.provider_database = provider_database
        self.provider_url = provider_url or (f"http://127.0.0.1:{free_port()}" if provider_database else self.url)
        self.env = {**os.environ, **STACK_ENV, "SANDBOX_BASE_URL": f"{self.provider_url}/sandbox/v1",
                    "SITE_URL": self.url, **(env or {})}
        self.gunicorn_workers, self.gunicorn_threads = gunicorn_workers, gunicorn_threads
        self.processes = {}  # name -> Popen
        self.load_pid = None
        self._n = 0

    # --- one-shot commands -------------------------------------------------------------------

    def manage(self, *args, **env):
        done = subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env={**self.env, **env}, capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def migrate(self):
        self.manage("migrate", "--noinput", "-v", "0")
        if self.provider_database:
            self.manage("migrate", "--noinput", "-v", "0", DATABASE_URL=database_url(self.provider_database))

    def create_agent(self, name, grants):
        """An agent whose grants are live. A new grant is shadow until a person promotes it after
        a passing replay run; the benchmark measures execution, so it writes the grants live
        straight into the table (as the tests do), past that gate."""
        self.manage("shell", "-c", "from django.contrib.auth import get_user_model; "
                                   "get_user_model().objects.get_or_create(username='bench-owner')")
        out = self.manage("create_agent", name, *[f"--grant={g}" for g in grants], "--owner=bench-owner")
        self.manage("shell", "-c", (
            "from datetime import timedelta; from django.db.models import F; from django.utils import timezone; "
            "from django.contrib.auth import get_user_model; from ledger.authority import Grant; "
            "from ledger.models import Agent; "
            "promoter = get_user_model().objects.get_or_create(username='bench-promoter')[0]; "
            f"Grant.objects.filter(agent__name={name!r}).update(live_until=timezone.now() + timedelta(days=1), "
            "promoted_by=promoter, promoted_at=timezone.now()); "
            f"Agent.objects.filter(name={name!r}).update(grants_version=F('grants_version') + 1)"))
        return out.strip().splitlines()[-1].strip()

    # --- long-running processes ----------------------------------------------------------------

    def _start(self, name, argv, **env):
        self._n += 1
        log = open(self.logs / f"{self._n:02d}-{name}.log", "w")
        process = subprocess.Popen(
            argv, cwd=ROOT, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        self.processes[name] = process
        return process

    def start_server(self):
        self._serve("gunicorn", self.url, "/bench/baseline/rows/-", 404)

    def start_provider(self):
        """The sandbox provider on its own port and database (see the module's docstring)."""
        self._serve("provider", self.provider_url, "/sandbox/v1/faults", 401,
                    DATABASE_URL=database_url(self.provider_database))

    def start_router(self, shard_urls, directory):
        """The shards' router (sharding/router.py) on this stack's port, in front of `shard_urls`,
        its directory in database `directory`."""
        self._serve("router", self.url, "/api/v1/schema", 200, app="sharding.router:app",
                    SHARD_URLS=",".join(shard_urls), SHARD_DIRECTORY_URL=database_url(directory))

    def _serve(self, name, url, probe, status, app="config.wsgi", **env):
        """A gunicorn serving `app` with the run's workers and threads, up once `probe` answers `status`."""
        self._start(name, [
            PYTHON, "-m", "gunicorn", app, "-b", url.removeprefix("http://"), "-k", "gthread",
            "-w", str(self.gunicorn_workers), "--threads", str(self.gunicorn_threads),
            "--timeout", "60", "--log-level", "warning",
        ], **env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}{probe}", timeout=2).status_code == status:
                    return
            except httpx.HTTPError:
                pass
            if self.processes[name].poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"{name} did not come up; see {self.logs}")

    def start_worker(self, name, **env):
        return self._start(name, [
            PYTHON, "manage.py", "rqworker", "default", "--worker-class", "ledger.worker.Worker",
        ], **env)

    def start_sweeper(self, interval=0.5):
        return self._start("sweeper", [PYTHON, "manage.py", "sweep", "--interval", str(interval)])

    def kill(self, name, sig=signal.SIGKILL):
        process = self.processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def stop(self, name):
        """A warm stop (SIGTERM), SIGKILL after 10 s."""
        self.kill(name, signal.SIGTERM)

    def stop_all(self):
        for name in list(self.processes):
            self.stop(name)

    # --- load ----------------------------------------------------------------------------------

    def load(self, mode, *, token="", prefix="k", keys_file=None, concurrency=16, duration=10.0, warmup=2.0,
             count=None):
        """Run the load generator in its own process; return its JSON report."""
        argv = [PYTHON, "-m", "bench.load", "--url", self.url, "--mode", mode, "--prefix", prefix,
                "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup)]
        if token:
            argv += ["--token", token]
        if keys_file:
            argv += ["--keys-file", str(keys_file)]
        if count is not None:
            argv += ["--count", str(count)]
        process = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.load_pid = process.pid
        try:
            stdout, stderr = process.communicate()
        finally:
            self.load_pid = None
        if process.returncode != 0:
            raise RuntimeError(f"load generator failed ({mode}):\n{stderr}")
        return json.loads(stdout.strip().splitlines()[-1])

    def named_pids(self):
        """{pid: category} of the direct children, for the CPU monitor."""
        named = {p.pid: ("workers" if n.startswith("worker") else n) for n, p in list(self.processes.items())}
        if self.load_pid:
            named[self.load_pid] = "load_generator"
        return named
