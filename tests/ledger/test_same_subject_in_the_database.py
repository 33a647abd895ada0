"""The same-object rule is held by the database (migration 0014), on PostgreSQL and on SQLite
(`make test` runs this module on both): whatever inserts an action that would start while
another one is in flight on its target or customer, the row is stored `held`. The
requests racing for one order are in test_same_object_hold.py."""

import threading

import pytest
from django.db import connection, transaction

from ledger.actions import _lock_subjects
from ledger.compiled import insert
from ledger.models import IN_FLIGHT_STATUSES, Action, ActionStatus
from tests.factories import another_waits_for_a_lock, make_agent

S = ActionStatus
pytestmark = pytest.mark.django_db


def required_in(status):
    """What the database asks of a row in `status` (migration 0013, and a succeeded's reference)."""
    now = "2026-09-10T10:00:00+00:00"
    return {S.QUEUED: {"next_attempt_at": now}, S.UNKNOWN: {"next_attempt_at": now},
            S.PENDING: {"lease_expires_at": now}, S.SUCCEEDED: {"external_ref": "re_1"}}.get(status, {})


def stored(agent, key, status, target="ORD-1", customer=""):
    action = insert(Action(operation_key=key, fingerprint="f" * 64, action_type="refund", target=target,
                           customer=customer, params={}, agent=agent, status=status, **required_in(status)),
                    stored=("status", "next_attempt_at"))
    assert Action.objects.get(pk=action.pk).status == action.status  # what insert read back is what is stored
    return action


@pytest.mark.parametrize("other", S.values)
def test_a_new_action_is_stored_held_while_another_is_in_flight_on_its_target(other):
    agent, _ = make_agent("billing")
    stored(agent, "other", other)

    new = stored(agent, "new", S.QUEUED)
    waiting = stored(agent, "waiting", S.AWAITING_APPROVAL, target="ORD-1")

    held = other in IN_FLIGHT_STATUSES
    assert new.status == (S.HELD if held else S.QUEUED)
    assert (new.next_attempt_at is None) == held
    assert waiting.status == S.HELD  # `new` itself is in flight by now, whatever `other` was


def test_the_customer_counts_as_well_and_an_empty_customer_does_not():
    agent, _ = make_agent("billing")
    stored(agent, "first", S.PENDING, target="ORD-1", customer="CUST-1")

    assert stored(agent, "same-customer", S.QUEUED, target="ORD-2", customer="CUST-1").status == S.HELD
    assert stored(agent, "no-customer-a", S.QUEUED, target="ORD-3").status == S.QUEUED
    assert stored(agent, "no-customer-b", S.QUEUED, target="ORD-4").status == S.QUEUED


def test_rows_stored_in_other_statuses_are_left_as_they_are():
    agent, _ = make_agent("billing")
    stored(agent, "first", S.QUEUED)
    for status in set(S.values) - {S.QUEUED, S.AWAITING_APPROVAL}:
        assert stored(agent, f"as-{status}", status).status == status


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises every writer")
def test_an_insert_waits_for_the_locks_python_takes_on_the_same_subjects():
    agent, _ = make_agent("billing")
    locked, waited = threading.Event(), []

    def hold_the_customer():
        with transaction.atomic():
            _lock_subjects("ORD-1", "CUST-9")
            locked.set()
            waited.append(another_waits_for_a_lock())
        connection.close()

    holder = threading.Thread(target=hold_the_customer)
    holder.start()
    assert locked.wait(5)
    stored(agent, "new", S.QUEUED, target="ORD-2", customer="CUST-9")  # another order, the same customer
    holder.join(10)

    assert waited == [True]
