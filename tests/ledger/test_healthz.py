"""/healthz: 200 when the database, Redis, a worker and the sweeper were seen; 503 naming what is down.
/healthz/web, a load balancer's: 200 while this web process's database answers, whatever else is down."""

import logging
import socket
import time
from contextlib import contextmanager

import httpx
import pytest
from django.core.management import call_command
from django.db import InterfaceError, connection
from rq import Worker

from console import monitoring
from ledger import jobs
from ledger.outages import Outage
from tests.conftest import free_port, wait_until
from tests.factories import database_away

ALL_OK = {"database": "ok", "redis": "ok", "worker": "ok", "sweeper": "ok"}


@contextmanager
def redis_that_never_answers(settings, timeout):
    """Redis, for the jobs, at a port that listens and never accepts: the kernel connects, nobody
    reads (a host that hangs, a blackholed port), each request waiting `timeout` seconds."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        settings.RQ_ASYNC = True
        settings.RQ_QUEUES = {"default": {"ASYNC": True, "DEFAULT_TIMEOUT": 600, "URL": (
            f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
            f"?socket_connect_timeout={timeout}&socket_timeout={timeout}")}}
        yield


def health(url):
    response = httpx.get(f"{url}/healthz", timeout=10)
    return response.status_code, response.json()


def test_it_answers_200_once_a_worker_and_a_sweeper_pass_were_seen(stack):
    assert health(stack.url) == (503, {**ALL_OK, "worker": "down", "sweeper": "down"})

    stack.start_worker()
    wait_until(lambda: Worker.all(connection=jobs.redis_connection()), message="the worker's registration")
    assert health(stack.url) == (503, {**ALL_OK, "sweeper": "down"})

    call_command("sweep", "--once")  # in this process, against the server's database and Redis
    assert health(stack.url) == (200, ALL_OK)


def test_the_sweeper_is_down_once_its_trace_expires(stack, settings):
    stack.start_worker()
    wait_until(lambda: Worker.all(connection=jobs.redis_connection()), message="the worker's registration")
    call_command("sweep", "--once")
    assert health(stack.url)[0] == 200
    # A pass whose trace lasts half a second (a loaded machine's request took longer to ask for it).
    settings.HEALTHZ_SWEEPER_SECONDS = 0.5
    call_command("sweep", "--once")

    time.sleep(0.6)

    assert health(stack.url) == (503, {**ALL_OK, "sweeper": "down"})


def test_a_worker_whose_heartbeat_is_older_than_the_window_is_down(stack, client, settings):
    stack.start_worker()
    # Registered, a worker beats once more as it starts listening, and then, idle, not for minutes
    # (every worker_ttl - 15 s): on a loaded machine that beat could come after this test's sleep
    # had begun, within the window. Once it has come, the sleep outlasts the window.
    wait_until(lambda: any(worker.last_heartbeat > worker.birth_date
                           for worker in Worker.all(connection=jobs.redis_connection())),
               seconds=60, message="the worker's beat as it starts listening")
    call_command("sweep", "--once")  # on an empty database it gives the worker nothing to do (and beat after)
    settings.HEALTHZ_WORKER_SECONDS = 0.5

    # A check that took a registered worker for a live one, whatever its last beat, answers "ok".
    time.sleep(0.6)
    response = client.get("/healthz")  # in this process, to see the shorter window

    assert response.status_code == 503
    assert response.json() == {**ALL_OK, "worker": "down"}


@pytest.mark.django_db
def test_it_answers_503_naming_redis_when_redis_stops(client, settings):
    # The machine's Redis is shared, so it is not stopped: this process's settings point at a
    # port where nothing listens, as if Redis had gone away after the app started with it.
    settings.RQ_ASYNC = True
    settings.RQ_QUEUES = {"default": {"URL": f"redis://127.0.0.1:{free_port()}/0", "DEFAULT_TIMEOUT": 600,
                                      "ASYNC": True}}

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json() == {"database": "ok", "redis": "down", "worker": "down", "sweeper": "down"}


@pytest.mark.django_db
def test_a_redis_that_does_not_answer_costs_one_timeout_and_one_line_in_the_log(client, settings, monkeypatch,
                                                                               caplog):
    """A Redis that takes connections and never answers (a host that hangs, a blackholed port):
    Redis, the workers and the sweeper were each asked, each after its own timeout, three in
    all before a load balancer's probe got its answer, and each poll logged three tracebacks."""
    timeout = 1
    monkeypatch.setattr(monitoring, "_REDIS_OUTAGE", Outage("/healthz", monitoring.logger))
    caplog.set_level(logging.INFO, logger="surety.metrics")
    with redis_that_never_answers(settings, timeout):
        for _ in range(3):  # a load balancer's polls
            began = time.monotonic()
            response = client.get("/healthz")
            took = time.monotonic() - began

            assert response.status_code == 503
            assert response.json() == {"database": "ok", "redis": "down", "worker": "down", "sweeper": "down"}
            assert took < 2 * timeout, took

    lines = [(record.levelname, record.getMessage(), record.exc_info) for record in caplog.records
             if record.name == "surety.metrics"]
    assert len(lines) == 1 and lines[0][2] is None, lines
    assert "Redis is unreachable (TimeoutError" in lines[0][1]


@pytest.mark.django_db
def test_without_redis_jobs_run_in_process_and_redis_and_workers_are_not_used(client, settings):
    settings.RQ_ASYNC = False

    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"database": "ok", "redis": "not used", "worker": "not used", "sweeper": "not checked"}


def test_it_tells_anonymous_callers_nothing_but_the_checks(stack):
    response = httpx.get(f"{stack.url}/healthz", timeout=10)

    assert set(response.json()) == set(ALL_OK)
    assert response.headers["Content-Type"] == "application/json"
    assert "no-cache" in response.headers["Cache-Control"]



@pytest.mark.django_db(transaction=True)
def test_it_answers_503_naming_the_database_while_it_is_away_and_200_as_soon_as_it_answers(client, settings):
    settings.RQ_ASYNC = False  # only the database is checked
    with database_away():
        response = client.get("/healthz")

    assert response.status_code == 503 and response.json()["database"] == "down"
    assert client.get("/healthz").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_database_error_that_is_no_database_error_is_the_database_down_in_the_report(client, settings, monkeypatch):
    """Django's InterfaceError (psycopg's "the connection is in status …", psycopg2's "connection
    already closed") is a django.db.Error but no DatabaseError: the probe let it through, and only
    the API's middleware kept it from a 500, answering its own problem document (503
    database_unavailable) instead of the report naming what is down. The error is staged by
    patching the connection's cursor to raise it (the only patch here: a real connection does not
    reach that state on demand)."""
    settings.RQ_ASYNC = False  # only the database is checked
    monkeypatch.setattr(monitoring, "_DATABASE_OUTAGE", Outage("/healthz", monitoring.logger))

    def unusable():
        raise InterfaceError("connection already closed")

    with monkeypatch.context() as patched:
        patched.setattr(connection, "cursor", unusable)
        response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json() == {"database": "down", "redis": "not used", "worker": "not used",
                               "sweeper": "not checked"}
    assert client.get("/healthz").status_code == 200


def test_a_worker_down_is_the_system_down_and_not_the_web(stack):
    """A load balancer asking /healthz took every web process out because a worker stopped,
    though each could still record work for the worker to come."""
    call_command("sweep", "--once")  # a sweeper, and no worker

    assert health(stack.url) == (503, {**ALL_OK, "worker": "down"})
    response = httpx.get(f"{stack.url}/healthz/web", timeout=10)
    assert (response.status_code, response.json()) == (200, {"database": "ok"})
    assert "no-cache" in response.headers["Cache-Control"]
    assert response.headers["X-Request-ID"]  # the log lines of a poll name it, as any request's


@pytest.mark.django_db
def test_the_web_stays_in_while_redis_hangs_without_waiting_for_it(client, settings):
    """Redis is shared by every web process, and without it an action is still recorded (its
    doorbell rung by the sweeper once Redis is back): the web check does not ask it, so a Redis
    that never answers costs its polls no timeout."""
    # A check that asked Redis would take a whole timeout at least: a long one, so that the bound
    # below, half of it, leaves a loaded machine's in-process request seconds.
    timeout = 5
    with redis_that_never_answers(settings, timeout):
        began = time.monotonic()
        response = client.get("/healthz/web")
        took = time.monotonic() - began

    assert (response.status_code, response.json()) == (200, {"database": "ok"})
    assert took < timeout / 2, took


@pytest.mark.django_db(transaction=True)
def test_the_database_away_is_the_system_down_and_the_web_too(client, settings):
    settings.RQ_ASYNC = False  # only the database is checked
    with database_away():
        system = client.get("/healthz")
        web = client.get("/healthz/web")

    assert system.status_code == 503 and system.json()["database"] == "down"
    assert (web.status_code, web.json()) == (503, {"database": "down"})
    assert client.get("/healthz/web").status_code == 200
