"""Never silent: a standalone action a person marks failed ("confirmed absent" at the provider,
from the unknown-outcome queue) after an attempt of several is in no queue the executor works (it
never runs a failed action): it gets its dead-letter entry and alert, where it can be redriven."""

import pytest

from dlq.bulk import ACTION_FAILED_AGAIN
from dlq.entries import deadletter_redrive
from dlq.models import Alert, DeadLetter
from ledger.actions import action_request
from ledger.executor import action_claim_next, action_run_claimed
from ledger.models import ActionStatus, AuditEvent
from tests.factories import confirmed_absent, make_agent, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


def test_a_failure_a_person_confirmed_after_one_attempt_gets_its_entry_and_can_be_redriven():
    agent, _ = make_agent("billing")
    action, _ = action_request(agent=agent, operation_key="refund:ORD-U:full:dec-1", action_type="refund",
                               target="ORD-U", customer="CUST-U", params={"amount": "20.00", "currency": "EUR"})
    action = confirmed_absent(action)
    assert (action.status, action.error["retryable"], action.attempts) == (ActionStatus.FAILED, True, 1)
    assert action_claim_next("tests:2") is None  # nothing runs it again by itself

    entry = DeadLetter.objects.get(action=action, status="open")
    assert Alert.objects.filter(dead_letter=entry).exists()
    deadletter_redrive(entry, actor=person("olga", "operators"), reason="the customer still waits")
    action.refresh_from_db()
    assert action.status == ActionStatus.QUEUED


def test_a_redrive_whose_look_cannot_tell_goes_to_a_person_on_its_claim(settings):
    """Redriven while the provider cannot be asked: the look before its call cannot tell, and the
    action goes to a person at once (it was left pending under its claim, refused as a late write,
    until the sweeper took the lease back), and the run's spike brake sees it fail again."""
    agent, _ = make_agent("billing")
    action, _ = action_request(agent=agent, operation_key="refund:ORD-U3:full:dec-1", action_type="refund",
                               target="ORD-U3", customer="CUST-U3", params={"amount": "20.00", "currency": "EUR"})
    action.claim(owner="tests:1")
    action.mark_failed(actor="system:executor", claim=action.fence, code="connect_failed", message="no route",
                       retryable=True)
    deadletter_redrive(DeadLetter.objects.get(action=action, status="open"), actor=person("olga", "operators"),
                       reason="the provider is back")
    settings.SANDBOX_BASE_URL = "http://127.0.0.1:9"  # nothing listens: the look cannot tell
    action_run_claimed(action_claim_next("tests:2", only=action.pk))

    action.refresh_from_db()
    assert action.status == ActionStatus.NEEDS_REVIEW and action.evidence[-1]["found"] is None
    assert AuditEvent.objects.filter(ACTION_FAILED_AGAIN, object_type="ledger.action", object_id=str(action.pk)).exists()
