"""A held action whose look after its holder's settle never came (the settle met its subjects
busy and left the look for after its commit; the worker was killed then, or the database went
away during it) is looked at by the sweeper's next pass, as that look would have gone: released
once nothing holds it (decision 18). One that waits on purpose is left as it is."""

import pytest
from django.db import connection

from console.sweeper import sweep_once
from ledger import actions
from ledger.actions import action_request
from ledger.models import Action, ActionStatus
from tests.approvals.test_held_groups import settled_while_its_customer_is_busy
from tests.factories import audit_events, make_agent

S = ActionStatus


@pytest.fixture
def agent(db, jobs_to_test_redis):
    return make_agent("billing")[0]


def refund(agent, key, order, customer, **kwargs):
    return action_request(agent=agent, operation_key=key, action_type="refund", target=order, customer=customer,
                          params={"amount": "25.00", "currency": "EUR"}, **kwargs)[0]


def status(action):
    return Action.objects.get(pk=action.pk).status


@pytest.mark.django_db(transaction=True)
def test_a_held_action_whose_look_after_the_settle_failed_is_released_by_the_next_pass(agent, monkeypatch):
    """r1 settles while an intake for the same customer (shadow: it holds nothing) has the
    customer's lock, so r2 is left for the look after the commit; the database drops that very
    connection as the look begins (its own backend terminated). r2 stays held with nothing in
    flight on its order or customer, until the sweeper's pass."""
    first = Action.objects.get(pk=refund(agent, "r1", "ORD-1", "CUST-1").pk).claim(owner="host:tests")
    second = refund(agent, "r2", "ORD-2", "CUST-1")
    assert status(second) == S.HELD
    looks = []
    look_again = actions._look_again

    def blip(*args):
        looks.append(args)
        with connection.cursor() as cursor:  # the database drops the connection at that moment
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return look_again(*args)

    monkeypatch.setattr(actions, "_look_again", blip)
    settled_while_its_customer_is_busy(agent, first)
    monkeypatch.undo()
    connection.close()  # the one the database dropped
    assert len(looks) == 1
    assert (status(first), status(second)) == (S.SUCCEEDED, S.HELD)  # nothing holds it; nothing looks at it

    assert sweep_once()["held_looked_again"] == 1
    assert status(second) == S.QUEUED
    [released] = audit_events(second, "released")
    assert released.reason == "r1 is succeeded: nothing else holds it"
    assert not sweep_once().get("held_looked_again")


@pytest.mark.django_db
def test_a_held_action_kept_for_a_retry_or_for_a_person_is_left_as_it_is(agent):
    """What a failure that may be retried held waits for its retry, and the rest of a group a
    person let one out of waits for the person: the pass looks at neither (and says nothing of them)."""
    first = Action.objects.get(pk=refund(agent, "r1", "ORD-1", "CUST-1").pk).claim(owner="host:tests")
    second = refund(agent, "r2", "ORD-2", "CUST-1")
    first.mark_failed(actor="system:executor", code="timeout", message="later", retryable=True, claim=first.fence)
    assert status(second) == S.HELD

    assert not sweep_once().get("held_looked_again")
    assert (status(second), list(audit_events(second, "still_held"))) == (S.HELD, [])
