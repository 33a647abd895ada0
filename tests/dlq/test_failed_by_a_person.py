"""Never silent: a standalone action a person marks failed ("confirmed absent" at the provider,
from the unknown-outcome queue) after an attempt of several is in no queue the executor works (it
never runs a failed action): it gets its dead-letter entry and alert, where it can be redriven."""

import pytest
from django.utils import timezone

from approvals.decisions import review_decide
from approvals.models import ReviewItem
from dlq.entries import deadletter_redrive
from dlq.models import Alert, DeadLetter
from ledger.actions import action_request
from ledger.executor import action_claim_next
from ledger.models import ActionStatus
from tests.factories import make_agent, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


def test_a_failure_a_person_confirmed_after_one_attempt_gets_its_entry_and_can_be_redriven():
    agent, _ = make_agent("billing")
    action, _ = action_request(agent=agent, operation_key="refund:ORD-U:full:dec-1", action_type="refund",
                               target="ORD-U", customer="CUST-U", params={"amount": "20.00", "currency": "EUR"})
    action.claim(owner="tests:1")
    action.mark_unknown(actor="system:executor", claim=action.fence, verify_at=timezone.now(),
                        evidence={"code": "timeout"})
    action.mark_needs_review(actor="system:executor", evidence={"found": None})
    review_decide(ReviewItem.objects.get(action=action, status="open"), user=person("alice", "approvers"),
                  decision="mark_failed", reason="not in the provider's dashboard")
    action.refresh_from_db()
    assert (action.status, action.error["retryable"], action.attempts) == (ActionStatus.FAILED, True, 1)
    assert action_claim_next("tests:2") is None  # nothing runs it again by itself

    entry = DeadLetter.objects.get(action=action, status="open")
    assert Alert.objects.filter(dead_letter=entry).exists()
    deadletter_redrive(entry, actor=person("olga", "operators"), reason="the customer still waits")
    action.refresh_from_db()
    assert action.status == ActionStatus.QUEUED
