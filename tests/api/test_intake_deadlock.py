"""An intake the database picks to break a deadlock is run again, not answered 500.

Found by the schema fuzzer: three refunds of one order in a second while a worker settled the
first. The intake takes the order's lock (on insert) and then locks the actions it holds; a
transaction that settles an action locks its row and then the order's lock. Here another
transaction plays the settling one on its own connection, against the real PostgreSQL."""

import json
import threading

import pytest
from django.db import connection, transaction

from ledger.models import Action
from tests.conftest import wait_until
from tests.factories import make_action, make_agent_on, refund_body, sessions_waiting_for_a_lock

pytestmark = pytest.mark.django_db(transaction=True)


def settle_like_a_worker(action, locked, error):
    """Lock the action's row, wait until the intake waits for it, then take the order's lock."""
    try:
        with transaction.atomic():
            Action.objects.select_for_update().get(pk=action.pk)
            locked.set()
            wait_until(lambda: sessions_waiting_for_a_lock("ledger_action"), seconds=10,
                       message="the intake to wait for the action's row")
            with connection.cursor() as cursor:
                cursor.execute("SELECT ledger_lock_subjects(%s, %s)", [action.target, action.customer])
    except BaseException as exc:  # noqa: BLE001 (raised in the test's thread)
        error.append(exc)
    finally:
        connection.close()


def test_an_intake_rolled_back_by_a_deadlock_is_run_again(client):
    agent = make_agent_on(client)
    in_flight = make_action(agent, "queued", key="refund:ORD-7:first", target="ORD-7")
    locked, error = threading.Event(), []
    other = threading.Thread(target=settle_like_a_worker, args=(in_flight, locked, error))
    other.start()
    assert locked.wait(10)

    response = client.post("/api/v1/actions", data=json.dumps(refund_body("ORD-7", customer="")),
                           content_type="application/json", headers={"Idempotency-Key": "refund:ORD-7:second"})
    other.join(30)

    assert not error, error
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "held"
    assert Action.objects.filter(operation_key="refund:ORD-7:second").count() == 1
