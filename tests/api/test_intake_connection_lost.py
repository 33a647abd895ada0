"""An intake whose connection the database ended midway is run again on a fresh connection:
the agent gets its action (201), recorded once, not a 500 or even a 503.

Another transaction holds the order's lock, so the intake waits inside its transaction; the
database then ends the intake's connection (`pg_terminate_backend`, what a failover or a
restarted pooler does) and lets the lock go. Real PostgreSQL, real connections."""

import json
import threading
import time

import pytest
from django.db import connection, transaction

from ledger.api.views import intake_through_transient_failures
from ledger.models import Action
from tests.conftest import wait_until
from tests.factories import make_agent_on, refund_body, sessions_waiting_for_a_lock

pytestmark = pytest.mark.django_db(transaction=True)


def hold_the_order_and_end_the_waiter(target, customer, locked, ended, error):
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT ledger_lock_subjects(%s, %s)", [target, customer])
            locked.set()
            wait_until(lambda: sessions_waiting_for_a_lock("ledger_action"), seconds=10,
                       message="the intake to wait for the order's lock")
            cursor.execute("SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            ended.append(cursor.fetchone()[0])
    except BaseException as exc:  # noqa: BLE001 (raised in the test's thread)
        error.append(exc)
    finally:
        connection.close()


def test_an_intake_whose_connection_was_ended_midway_is_recorded_once_on_a_fresh_one(client):
    make_agent_on(client)
    locked, ended, error = threading.Event(), [], []
    other = threading.Thread(target=hold_the_order_and_end_the_waiter, args=("ORD-9", "CUST-9", locked, ended, error))
    other.start()
    assert locked.wait(10)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        first_backend = cursor.fetchone()[0]

    response = client.post("/api/v1/actions", data=json.dumps(refund_body("ORD-9", customer="CUST-9")),
                           content_type="application/json", headers={"Idempotency-Key": "refund:ORD-9:full:dec-9"})
    other.join(30)

    assert not error, error
    assert ended == [1]
    assert response.status_code == 201, response.content
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != first_backend
    assert Action.objects.filter(operation_key="refund:ORD-9:full:dec-9").count() == 1


def test_an_intake_whose_transaction_the_server_ended_for_idling_is_run_again_on_a_fresh_connection():
    """PostgreSQL ends a session left idle in its transaction past idle_in_transaction_session_timeout
    (25P03), which psycopg and Django raise as an InternalError, not as an OperationalError: the
    connection is gone all the same, and the intake runs again on a fresh one (not a 503)."""
    backends = []

    def intake():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backends.append(cursor.fetchone()[0])
            if len(backends) == 1:
                cursor.execute("SET LOCAL idle_in_transaction_session_timeout = '200ms'")
                time.sleep(1)
                cursor.execute("SELECT 1")
        return "recorded"

    assert intake_through_transient_failures(intake) == "recorded"
    assert len(backends) == 2 and backends[0] != backends[1]
