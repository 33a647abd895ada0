"""A failed action whose dead letter a person discards, alone or as its task's, says so in its own
row: `"given_up": true` beside `"retryable": false` in its error, audited `given_up` with their
reason, whatever the error said before. Before, only a failure that could have been retried was
marked (made not retryable); one already failed for good (a declined refund) read the same after
its discard as while its entry was open and a person could still retry it from there, so its agent
could not tell a retry that may come from none (the client read the entry from the action's
evidence record to learn it). Given up, it is never retried, a person's retry included."""

from decimal import Decimal

import pytest
from django.test import Client

from approvals.intake import customer_total_today
from dlq.entries import deadletter_discard
from dlq.models import DeadLetter, EntryStatus
from ledger.actions import action_done_by_hand, action_request, action_retry, action_retry_by_person
from ledger.audit import actor_label
from ledger.models import Action, ActionStatus, Booking, InvalidTransition
from tests.factories import (attempt_failed, audit_events, dead_lettered_with_a_declined_step, make_agent_on, open_entry,
                             person, post_action_in_process)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

KEY = "refund:ORD-G1:full:dec-1"
SLOT = {"service": "massage", "start": "2026-09-10T10:00:00Z", "end": "2026-09-10T11:00:00Z"}


@pytest.fixture
def billing(client, settings):
    settings.MAX_ATTEMPTS = 1  # a failure that may be retried opens its entry at once
    return make_agent_on(client)


@pytest.fixture
def olga():
    return person("olga", "operators")


def refund(agent, key=KEY, order="ORD-G1"):
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target=order, customer="CUST-G",
                               decision_id="dec-1", params={"amount": "25.00", "currency": "EUR"})
    return action


def discarded_on_its_page(olga, entry, reason):
    """The person discards the entry from its page, as the dashboard posts it."""
    page = Client()
    page.force_login(olga)
    answer = page.post(f"/dlq/{entry.pk}/discard", {"reason": reason}, follow=True)
    assert answer.status_code == 200 and f"Dead letter #{entry.pk}: discard done" in answer.content.decode()
    return DeadLetter.objects.get(pk=entry.pk)


def given_up(action, olga, reason):
    """What every discarded action shows: failed, not retryable, given up, audited once."""
    action = Action.objects.get(pk=action.pk)
    assert action.status == ActionStatus.FAILED
    assert (action.error["retryable"], action.error["given_up"]) == (False, True)
    assert "done_by_hand" not in action.error
    [event] = audit_events(action, "given_up")
    assert event.actor == actor_label(olga) and reason in event.reason
    assert event.before["error"].get("given_up") is None and event.after["error"]["given_up"] is True
    return action


@pytest.mark.parametrize("retryable", [True, False], ids=["out_of_attempts", "declined"])
def test_a_refund_discarded_on_its_page_says_given_up_to_its_agent(client, billing, olga, retryable):
    action = attempt_failed(refund(billing), retryable=retryable)
    entry = DeadLetter.objects.get(action=action)

    assert discarded_on_its_page(olga, entry, "the customer withdrew the claim").status == EntryStatus.DISCARDED

    declined = given_up(action, olga, "the customer withdrew the claim")
    assert {key: declined.error[key] for key in ("code", "message")} == {
        key: action.error[key] for key in ("code", "message")}  # what it failed of stays said
    # Its agent reads it, and replays its key into it: given up, nothing runs.
    read = client.get(f"/api/v1/actions/{KEY}").json()
    assert (read["status"], read["error"]["retryable"], read["error"]["given_up"]) == ("failed", False, True)
    assert "done_by_hand" not in read["error"]
    again = post_action_in_process(client, KEY, {"action_type": "refund", "target": "ORD-G1", "customer": "CUST-G",
                                                 "decision_id": "dec-1",
                                                 "params": {"amount": "25.00", "currency": "EUR"}})
    assert again.status_code == 200, again.content
    assert again.json()["error"]["given_up"] is True
    # Nothing was done: out of its customer's daily total.
    assert customer_total_today("refund", "EUR", "CUST-G") == Decimal(0)


@pytest.mark.parametrize("retryable", [True, False], ids=["out_of_attempts", "declined"])
def test_an_action_given_up_is_never_retried_a_persons_retry_included(billing, olga, retryable):
    """A person's word lifts a refusal's permanence (`retry_allowed`), not a person's decision to give
    it up, which its agent was told of: it may have asked again under a new decision since."""
    action = attempt_failed(refund(billing), retryable=retryable)
    deadletter_discard(DeadLetter.objects.get(action=action), actor=olga, reason="the customer withdrew the claim")

    with pytest.raises(InvalidTransition, match="gave it up"):
        action_retry_by_person(Action.objects.get(pk=action.pk), actor=olga, reason="the card works again")
    with pytest.raises(InvalidTransition, match="not retryable"):
        action_retry(Action.objects.get(pk=action.pk), actor="system:tests", reason="again")
    given_up(action, olga, "the customer withdrew the claim")
    assert not audit_events(action, "retry_allowed").exists()


def test_a_declined_booking_discarded_says_given_up_and_its_decision_may_be_asked_again(billing, olga):
    """Failed for good, it let its slot and decision go when it failed: the discard marks it and
    changes nothing else."""
    booking, _ = action_request(agent=billing, operation_key="create_booking:ROOM-G:CUST-G:dec-1",
                                action_type="create_booking", target="ROOM-G", customer="CUST-G", decision_id="dec-1",
                                params=SLOT)
    booking = attempt_failed(booking, retryable=False)

    discarded_on_its_page(olga, DeadLetter.objects.get(action=booking), "the customer cancelled")

    given_up(booking, olga, "the customer cancelled")
    assert Booking.objects.get(action=booking).status == Booking.Status.RELEASED
    again, created = action_request(agent=billing, operation_key="create_booking:ROOM-G:CUST-G:dec-1:again",
                                    action_type="create_booking", target="ROOM-G", customer="CUST-G",
                                    decision_id="dec-1", params=SLOT)
    assert created and again.status == ActionStatus.QUEUED


def test_a_task_discarded_marks_each_of_its_failed_actions_given_up(billing, olga):
    task, declined = dead_lettered_with_a_declined_step(billing, "t-g", "CUST-G")

    deadletter_discard(open_entry(task), actor=olga, reason="the customer withdrew")

    given_up(declined, olga, "its task t-g will not run again: the customer withdrew")


def test_a_given_up_action_is_never_then_marked_done_by_hand(client, billing, olga):
    """Given up is as final as done by hand: marking it done by hand afterwards (no page reaches it:
    its entry is closed) leaves it as it is, rather than asking the database to swap the marks,
    which it refuses (ledger.dbrules)."""
    action = attempt_failed(refund(billing), retryable=False)
    discarded_on_its_page(olga, DeadLetter.objects.get(action=action), "the customer withdrew the claim")

    action_done_by_hand(Action.objects.get(pk=action.pk), actor=olga, reason="paid by bank transfer after all")

    given_up(action, olga, "the customer withdrew the claim")
