"""ledger.outages: a database outage is one warning in the log, and one more when it ends;
a request that meets it is answered 503 with Retry-After (ledger.api.unavailable); a sweeper
step that fails keeps none of the others from running unless the database itself is gone."""

import logging
import time

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from console import ledger_views
from ledger import outages, sweeper
from tests.conftest import _database_url, free_port
from tests.factories import a_real_deadlock, database_away, post_action_in_process, refund_body


@pytest.fixture
def refused():
    """A real connection error: nothing listens on the port."""
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{free_port()}/surety", connect_timeout=2)
    return caught.value


def test_an_outage_is_logged_once_however_often_it_fails_and_once_more_when_it_ends(refused, caplog, django_db_blocker):
    outage = outages.Outage("drain of actions", logging.getLogger("surety.tests"))

    # failed() drops this thread's broken connection: an earlier test on this worker may have
    # left one open, which Django asks for its autocommit state before closing it.
    with caplog.at_level(logging.WARNING, logger="surety.tests"), django_db_blocker.unblock():
        waits = [outage.failed(refused) for _ in range(8)]
        outage.answered()
        outage.answered()

    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("drain of actions: the database is unreachable (OperationalError: connection failed")
    assert messages[1].startswith("drain of actions: back after")
    assert messages[1].endswith("without the database (8 failed attempts)")
    assert waits == sorted(waits) and waits[0] == outages.BACKOFF_FIRST_SECONDS
    assert waits[-1] == outages.BACKOFF_MAX_SECONDS


def test_a_refused_connection_is_a_lost_one_and_a_statement_error_is_not(refused):
    assert outages.database_unreachable(refused) and outages.connection_lost(refused)
    deadlock = psycopg.errors.DeadlockDetected("deadlock detected")
    assert outages.database_unreachable(deadlock) and not outages.connection_lost(deadlock)
    assert not outages.database_unreachable(psycopg.errors.UniqueViolation("duplicate key"))


def ended_for_idling(setting):
    """The error of a real session PostgreSQL ended after `setting` (200 ms) of idling: outside a
    transaction (idle_session_timeout, 57P05) or inside one (idle_in_transaction_session_timeout,
    25P03, an InternalError to psycopg)."""
    session = psycopg.connect(_database_url(), autocommit=setting == "idle_session_timeout")
    try:
        session.execute(f"SET {setting} = '200ms'")
        time.sleep(1)
        with pytest.raises(psycopg.Error) as caught:
            session.execute("SELECT 1")
        return caught.value
    finally:
        session.close()


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's idle timeouts")
@pytest.mark.parametrize("setting", ["idle_session_timeout", "idle_in_transaction_session_timeout"])
def test_a_session_the_server_ended_for_idling_is_a_lost_connection(setting):
    """Sent again on a new connection it goes through: an intake retries it, a drain lane gives its run
    back, a request meeting it twice is told 503, not 500."""
    ended = ended_for_idling(setting)
    assert outages.connection_lost(ended) and outages.database_unreachable(ended), ended.sqlstate


def staged_steps(error):
    """A pass's steps, the second of which fails with `error`; and the names of those that ran."""
    ran = []

    def failing():
        raise error

    return [("before", lambda: ran.append("before")), ("failing", failing), ("after", lambda: ran.append("after"))], ran


@pytest.mark.parametrize("error", [ValueError("one bad row"),
                                   psycopg.errors.QueryCanceled("canceling statement due to statement timeout")])
def test_a_sweeper_step_that_fails_keeps_none_of_the_others_from_running(error, settings, db, monkeypatch, caplog):
    """A bug or one bad row in a step, or a statement the database refuses, failed the pass where
    it met it, every pass: the apps' steps after it, the audit chain's seal and the next partitions
    never ran. The pass now runs them all, then fails with it (sweep_forever: a bug ends the
    process for its supervisor, a database error is waited out)."""
    settings.RQ_ASYNC = False
    steps, ran = staged_steps(error)
    monkeypatch.setattr(sweeper, "partitions_extend", lambda: ran.append("partitions_made") or 0)  # the last step
    with pytest.raises(type(error)) as raised:
        sweeper.sweep_once(steps)
    assert raised.value is error
    assert ran == ["before", "after", "partitions_made"]
    assert "step failing failed; the pass ran the others" in caplog.text  # the error raised, named


def test_a_statement_the_database_refuses_in_the_doorbells_look_ends_no_pass(settings, db, monkeypatch):
    """The look for work to ring the drains for ran outside the steps: a statement timeout there
    (a role's statement_timeout, a long queue) ended every pass before the apps' steps, the seal
    and the partitions."""
    settings.RQ_ASYNC = False
    timeout = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    steps, ran = staged_steps(None)

    def timed_out():
        raise timeout

    monkeypatch.setattr(sweeper, "action_runnable_exists", timed_out)
    with pytest.raises(psycopg.errors.QueryCanceled):
        sweeper.sweep_once(steps[:1])
    assert ran == ["before"]


def test_a_sweeper_step_that_lost_the_database_ends_the_pass_at_once(refused, settings, db):
    """Every step after it would meet the outage too, each after its own timeout: the pass ends,
    and sweep_forever waits the outage out."""
    settings.RQ_ASYNC = False
    steps, ran = staged_steps(refused)
    with pytest.raises(psycopg.OperationalError):
        sweeper.sweep_once(steps)
    assert ran == ["before"]


def test_an_agent_meeting_a_database_that_is_away_is_told_503_with_retry_after(client, transactional_db):
    with database_away():
        response = post_action_in_process(client, "refund:ORD-1:full:dec-1", refund_body(),
                                          headers={"Authorization": "Bearer checked-in-the-database"})

    assert (response.status_code, response["Content-Type"], response["Retry-After"]) == (
        503, "application/problem+json", str(outages.RETRY_AFTER_SECONDS))
    assert response.json()["code"] == "database_unavailable"


def test_a_person_on_the_dashboard_gets_a_page_that_says_the_ledger_is_out_of_reach(client, transactional_db):
    """Their session's read meets it first (a middleware's): the server's answer to an error no
    view answered, as a server gives it (the test client would raise it instead)."""
    client.raise_request_exception = False
    client.force_login(get_user_model().objects.create_user("ada"))
    with database_away():
        response = client.get("/", headers={"Accept": "text/html"})

    assert response.status_code == 503 and response["Retry-After"] == str(outages.RETRY_AFTER_SECONDS)
    assert "The ledger is out of reach for a moment" in response.content.decode()


@pytest.fixture
def deadlock(django_db_blocker):
    with django_db_blocker.unblock():
        return a_real_deadlock()


@pytest.mark.parametrize("accept, says", [("text/html", "Someone else was changing the same thing"),
                                          ("application/json", '"code":"busy"')])
def test_a_deadlock_is_answered_busy_and_is_no_outage(client, db, deadlock, monkeypatch, caplog, accept, says):
    """The database broke a deadlock by rolling a request's transaction back: it is there, so
    the answer is `503 busy` (send it again), and the log says nothing of an outage. (The view
    that meets it is patched in; the deadlock is PostgreSQL's own.)"""
    client.force_login(get_user_model().objects.create_superuser("ada", password=None))
    def meets_the_deadlock(*args, **kwargs):
        raise deadlock

    monkeypatch.setattr(ledger_views, "overview_cards", meets_the_deadlock)
    with caplog.at_level(logging.WARNING):
        response = client.get("/", headers={"Accept": accept})
    assert (response.status_code, response["Retry-After"]) == (503, "1")
    assert says in response.content.decode().replace(": ", ":")
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="libpq's connection parameters")
def test_a_connection_that_goes_silent_is_given_up_not_waited_on_for_the_kernels_quarter_hour(db):
    """No keepalive timing, no TCP user timeout, no connect timeout: a primary that vanished
    without closing its connections held every sweeper's and lane's statement in recv() for 15
    minutes to 2 hours. The connection the ledger uses carries them (libpq applies them)."""
    connection.ensure_connection()
    given = connection.connection.info.get_parameters()
    assert {name: given.get(name) for name in ("keepalives", "keepalives_idle", "keepalives_interval",
                                               "keepalives_count", "tcp_user_timeout", "connect_timeout")} == {
        "keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5", "keepalives_count": "3",
        "tcp_user_timeout": "15000", "connect_timeout": "5"}
