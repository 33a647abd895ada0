"""Real components for the integration tests: a gunicorn server, RQ worker processes,
Redis and PostgreSQL, all talking to the test database over real connections.

Each xdist worker gets its own test database (pytest-django) and its own Redis database
number, so parallel tests never share state.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import redis
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.core.management.commands import flush as flush_command
from django.db import connection, connections
from django.db.backends.postgresql.operations import DatabaseOperations as PostgresOperations
from ledger import compiled

# The named actors' fixtures (`agent`, `operator`, `auditor`) beside their factories.
pytest_plugins = ["tests.factories"]

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# What the server, the workers and this process agree on: short timeouts keep tests fast.
STACK_ENV = {
    # Above the sandbox's answer time on a loaded 2-core CI machine, below its fault stall.
    "CONNECTOR_TIMEOUT": "2",
    "LEASE_SECONDS": "4",
    "LEASE_MARGIN_SECONDS": "1",
    "SANDBOX_TIMEOUT_SLEEP": "3",
    "BACKOFF_BASE_SECONDS": "0.2",
    "BACKOFF_MAX_SECONDS": "1",
    "MAX_ATTEMPTS": "3",
}


def _redis_db():
    # TEST_REDIS_DB lets two test runs share one Redis without flushing each other's queues.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(os.environ.get("TEST_REDIS_DB", 1)) + int(worker.removeprefix("gw") or 0)


REDIS_URL = f"redis://127.0.0.1:6379/{_redis_db()}"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """The test database, dropped only once the processes the tests started are gone from it:
    PostgreSQL ends a killed client's session a moment after the client, and the drop refuses
    a database another session still uses."""
    yield
    if connection.vendor != "postgresql":
        return
    # This process's own session may have been ended by a test that ends sessions (the database
    # blips, a connection lost mid-intake) with no test after it to reconnect: a new one looks.
    connection.close()
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        def others():
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid()")
            return cursor.fetchone()[0]

        wait_until(lambda: not others(), seconds=10, interval=0.05,
                   message="the started processes' sessions to leave the test database")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answering(body, content_type="text/html", status=200):
    """A handler for `thread_server` that answers every GET and POST alike (its body read and
    dropped): a page where a provider's answer was expected, a proxy of one's own making."""

    class Answer(BaseHTTPRequestHandler):
        def _answer(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer  # noqa: N815 (http.server's names)

        def log_message(self, format, *args):  # noqa: A002
            pass

    return Answer


@contextmanager
def thread_server(handler):
    """A stdlib HTTP server with `handler` in a thread of this process, on a free port; its
    `url` is its address."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.url = f"http://127.0.0.1:{server.server_port}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _database_url():
    s = connection.settings_dict
    return f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Stack:
    """Processes started for tests; all of them are killed at teardown."""

    def __init__(self, base_url, env, gunicorn=None):
        self.url = base_url
        self.env = env
        self.gunicorn = gunicorn  # the server's process
        self.workers = []
        self.sweepers = []

    def start_worker(self, log=None, **env):
        """An RQ worker as a process of its own; with `log` (a path), its output goes there, and
        is its `process.log`."""
        process = self._spawn(
            ["rqworker", "default", "--worker-class", "ledger.worker.Worker",
             "--burst" if env.pop("burst", False) else "--with-scheduler"], env, log)
        process.log = log
        self.workers.append(process)
        return process

    def start_sweeper(self, interval=0.5, log=None, **env):
        """`manage.py sweep` as a process of its own, as a deployment runs it (stopped with the
        workers); with `log` (a path), its output goes there, and is its `process.log`."""
        process = self._spawn(["sweep", "--interval", str(interval)], env, log)
        process.log = log
        self.sweepers.append(process)
        return process

    def _spawn(self, command, env, log=None):
        with open(log, "w") if log else nullcontext(subprocess.DEVNULL) as out:
            return subprocess.Popen(
                [PYTHON, "manage.py", *command],
                cwd=ROOT, env={**self.env, **{k: str(v) for k, v in env.items()}},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def kill_worker(self, process):
        _kill(process)
        self.workers.remove(process)

    def kill_sweeper(self, process):
        _kill(process)
        self.sweepers.remove(process)

    def stop_workers(self):
        for process in list(self.workers):
            self.kill_worker(process)
        for process in list(self.sweepers):
            self.kill_sweeper(process)


def _delete_for_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
    """A transactional test's flush as DELETEs with triggers and foreign-key checks off for
    the flush's own transaction (the append-only triggers would refuse them), then the
    sequences reset where asked: on these 57 small tables one TRUNCATE takes 0.45 s (a new
    file for each table), the DELETEs 0.02 s, and a full run flushes after some 700 tests.
    The database cache's table is emptied too: the sign-in rate limits count there (per
    address, so across every test of a worker: 30 sign-ins a minute from 127.0.0.1 refused
    the next ones), and Django's flush leaves it alone as no model's. Needs a superuser, as
    the tests' database user is (decision 51). Content types and permissions are kept: they
    are what `migrate` made, no test changes them, and they keep their ids (the servers'
    caches hold them), so the post_migrate that Django sends after a flush is skipped
    (`_post_migrate_unless_kept`): recreating them took 0.1 s a flush, finding them 0.03 s."""
    tables = [table for table in tables if table not in KEPT_BY_FLUSH]
    if not tables:
        return []
    caches = [c["LOCATION"] for c in django_settings.CACHES.values() if c["BACKEND"].endswith("DatabaseCache")]
    deletes = ["SET LOCAL session_replication_role = replica",
               *(f"DELETE FROM {self.quote_name(table)}" for table in [*tables, *caches])]
    if not reset_sequences:
        return deletes
    sequences = [s for s in self.connection.introspection.sequence_list() if s["table"] in tables]
    return [*deletes, *self.sequence_reset_by_name_sql(style, sequences)]


KEPT_BY_FLUSH = {ContentType._meta.db_table, Permission._meta.db_table}


def _post_migrate_unless_kept(verbosity, interactive, db, **kwargs):
    if connections[db].vendor != "postgresql":
        _emit_post_migrate(verbosity, interactive, db, **kwargs)


PostgresOperations.sql_flush = _delete_for_flush

# In this process only (the servers the tests start serve static files as production does):
# Django's test client loads the middleware anew for each test's client, and WhiteNoise reads
# every static file's headers when it is loaded, a fifth of an in-process page test's CPU.
# Looking a file up when it is asked for serves the same files with the same headers.
django_settings.WHITENOISE_AUTOREFRESH = True
_emit_post_migrate = flush_command.emit_post_migrate_signal
flush_command.emit_post_migrate_signal = _post_migrate_unless_kept


def _kill(process):
    """SIGKILL to the process's group; one that ended by itself (what a test then reports) is
    only waited for, so that the rest of its stack is still stopped."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _wait_for_http(url, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


class OwnRedis:
    """A Redis server of this test's own (a free port, nothing kept on disk, as Surety runs it),
    so that restarting it touches nobody else's queues."""

    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = None

    def start(self):
        self.process = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                         "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        wait_until(self._answers, seconds=10, interval=0.05, message="Redis to answer")

    def _answers(self):
        try:
            return redis.Redis.from_url(self.url).ping()
        except redis.ConnectionError:
            return False

    def restart(self):
        """Killed (every connection dropped, every job lost), down for a second, started again."""
        self.stop()
        time.sleep(1)
        self.start()

    def stall(self):
        """Stopped, not killed: connections are still accepted (by the kernel), nothing answers."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self):
        self.process.send_signal(signal.SIGCONT)

    def stop(self):
        self.process.kill()
        self.process.wait()


@pytest.fixture
def own_redis():
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def running_server(django_db_blocker, **env):
    """gunicorn serving the app (API, sandbox, dashboard) on the test database, with `env`
    over the stack's (DATABASE_URL: the test database, straight to PostgreSQL, unless given).

    The server caches content type ids (django-guardian looks grants up by them): they keep
    the ids `migrate` gave them, as no flush deletes them (`_delete_for_flush`).
    """
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, reset_sequences=True, verbosity=0)
        database_url = _database_url()
    with serving(env.pop("DATABASE_URL", database_url), **env) as stack:
        yield stack


@pytest.fixture(scope="session")
def server(django_db_setup, django_db_blocker):
    """gunicorn serving the app on the test database (see `running_server`)."""
    with running_server(django_db_blocker) as stack:
        yield stack


@contextmanager
def serving(database_url, stderr=None, workers=2, threads=12, **env):
    """gunicorn serving the app on `database_url` (`workers` processes of `threads` threads, each
    thread a database connection), with `env` over the stack's, as a Stack whose workers and
    sweepers the test starts (all stopped with the server); its log goes to `stderr` (a file) if
    given."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ, **STACK_ENV,
        "DATABASE_URL": database_url, "REDIS_URL": REDIS_URL,
        "SANDBOX_BASE_URL": f"{base_url}/sandbox/v1", "SITE_URL": base_url, "DEBUG": "false", **env,
    }
    process = subprocess.Popen(
        [PYTHON, "-m", "gunicorn", "config.wsgi", "--preload", "-b", f"127.0.0.1:{port}", "-k", "gthread",
         "-w", str(workers), "--threads", str(threads), "--timeout", "60", "--log-level", "warning",
         # Idle connections stay open (gunicorn's default is 2 s): tests that connect many
         # clients first and then send at once must not find some of them closed meanwhile.
         "--keep-alive", "30"],
        cwd=ROOT, env=env, stderr=stderr, start_new_session=True,
    )
    stack = Stack(base_url, env, gunicorn=process)
    try:
        _wait_for_http(f"{base_url}/api/v1/schema")
        yield stack
    finally:
        stack.stop_workers()
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:  # a server still up would keep the test database in use
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(autouse=True)
def _grants_read_afresh():
    """The process's grant cache is keyed by agent id and grants_version: a test whose database
    reset its sequences (the stack's) gives another test's agent the same pair."""
    yield
    if "ledger.grants._checked" in compiled.CACHES:  # registered once ledger.grants is imported
        compiled.CACHES["ledger.grants._checked"].clear()


@pytest.fixture
def stack(server, django_db_reset_sequences, settings):
    """The server plus this test's own workers (started by the test), on a clean Redis."""
    for name, value in STACK_ENV.items():
        setattr(settings, name, float(value) if "." in value or name != "MAX_ATTEMPTS" else int(value))
    settings.SANDBOX_BASE_URL = f"{server.url}/sandbox/v1"
    settings.RQ_QUEUES = {"default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 600, "ASYNC": True}}
    settings.RQ_ASYNC = True  # work goes to the workers, never run quietly in this process
    redis.Redis.from_url(REDIS_URL).flushdb()
    yield server
    server.stop_workers()
    redis.Redis.from_url(REDIS_URL).flushdb()


def wait_until(predicate, seconds=20, interval=0.1, message="condition"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {seconds}s waiting for {message}")


@pytest.fixture
def jobs_to_test_redis(settings):
    """For tests without workers: what the code enqueues lands in this run's own Redis
    database, where no worker listens, rather than running in-process or elsewhere."""
    settings.RQ_ASYNC = True
    settings.RQ_QUEUES = {"default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 600, "ASYNC": True}}


@pytest.fixture
def live_server(live_server):
    """pytest-django's live server, which the product's pooled HTTP client lets go of after the
    test: a connection kept alive holds a request thread of the server, and that thread's
    database connection, open until the run ends, and the test database could not be dropped."""
    yield live_server
    compiled.CACHES["ledger.connectors.http._clients"].clear()


# The fixtures that start processes or serve over HTTP: a test that needs any of them, however
# indirectly, needs the live stack (own_postgres: a cluster of its own, served by gunicorn). The
# others run in `make test-fast`; a test that starts a stack itself is marked `stack` by hand.
LIVE_STACK_FIXTURES = {"server", "stack", "live_server", "stripe_server", "stripe_stack", "pgbouncer", "browser",
                       "own_postgres"}


def pytest_collection_modifyitems(items):
    """Marks `stack` every test whose fixture closure (pytest resolves it at collection, through
    the fixtures' own requests) holds a live-stack fixture: `-m "not stack"` leaves them out."""
    for item in items:
        if LIVE_STACK_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.stack)
