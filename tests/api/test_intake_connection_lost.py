"""An intake whose connection the database ended midway is run again on a fresh connection:
the agent gets its action (201), recorded once, not a 500 or even a 503.

Another transaction holds the order's lock, so the intake waits inside its transaction; the
database then ends the intake's connection (`pg_terminate_backend`, what a failover or a
restarted pooler does) and lets the lock go. Real PostgreSQL, real connections."""

import json
import threading

import pytest
from django.db import connection, transaction

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
