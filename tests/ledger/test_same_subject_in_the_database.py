"""The same-object rule is held by the database (migrations 0014, 0015), on PostgreSQL and on SQLite
(`make test` runs this module on both): whatever inserts an action that would start while
another one is in flight on its target or customer, the row is stored `held`. The
requests racing for one order are in test_same_object_hold.py."""

import pytest
from django.db import IntegrityError, connection, transaction

from ledger.actions import _lock_subjects, action_retry
from ledger.compiled import insert
from ledger.models import IN_FLIGHT_STATUSES, Action, ActionStatus
from tests.factories import another_transaction, make_agent, new_action

S = ActionStatus
pytestmark = pytest.mark.django_db


def stored(agent, key, status, target="ORD-1", customer=""):
    action = insert(new_action(agent, status, key=key, target=target, customer=customer),
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
    with another_transaction(lambda: _lock_subjects("ORD-1", "CUST-9"), commit_when_waited_on=True) as holder:
        stored(agent, "new", S.QUEUED, target="ORD-2", customer="CUST-9")  # another order, the same customer

    assert holder.waited is True


# --- a new attempt (migration 0015): failed -> queued ------------------------------------------

def failed(agent, key, target="ORD-1", customer=""):
    return stored(agent, key, S.FAILED, target=target, customer=customer)  # a retryable failure


@pytest.mark.parametrize("other", S.values)
def test_the_database_refuses_a_new_attempt_while_another_action_is_in_flight(other):
    agent, _ = make_agent("billing")
    retry = failed(agent, "retry", customer="CUST-1")
    stored(agent, "other", other, target="ORD-2", customer="CUST-1")

    if other in IN_FLIGHT_STATUSES - {S.HELD}:  # a held one newer than the failure waits behind it
        with pytest.raises(IntegrityError), transaction.atomic():
            retry.requeue(actor="system:tests", reason="bypassing action_retry")
        assert Action.objects.get(pk=retry.pk).status == S.FAILED
    else:
        retry.requeue(actor="system:tests", reason="nothing in flight")
        assert Action.objects.get(pk=retry.pk).status == S.QUEUED


@pytest.mark.parametrize("held_first", [True, False], ids=["held before it was requested", "held after"])
def test_a_new_attempt_goes_before_the_held_actions_newer_than_it_not_older_ones(held_first):
    """Its failure kept what it held (newer than it): its retry goes on before them. One held since
    before it was requested was not its to hold, and keeps its turn: the attempt is refused."""
    agent, _ = make_agent("billing")
    if held_first:
        stored(agent, "other", S.HELD, target="ORD-2", customer="CUST-1")
    retry = failed(agent, "retry", customer="CUST-1")
    if not held_first:
        stored(agent, "other", S.HELD, target="ORD-2", customer="CUST-1")
    if held_first:
        with pytest.raises(IntegrityError), transaction.atomic():
            retry.requeue(actor="system:tests", reason="bypassing action_retry")
        assert action_retry(retry, actor="system:tests", reason="again").status == S.HELD
    else:
        assert action_retry(retry, actor="system:tests", reason="again").status == S.QUEUED


def test_action_retry_holds_where_the_database_would_refuse():
    agent, _ = make_agent("billing")
    retry = failed(agent, "retry")
    stored(agent, "other", S.PENDING)
    assert action_retry(retry, actor="system:tests", reason="again").status == S.HELD
