"""A refund that failed for good left its customer's daily total; retried on a person's word from
the dead-letter queue, it is asked of the limits again, as a new request: over them now, a person
approves it first."""

from decimal import Decimal

import pytest

from approvals.intake import customer_total_today
from approvals.models import Limit, ReviewItem, ReviewKind
from dlq.entries import deadletter_redrive
from dlq.models import DeadLetter
from ledger.actions import action_request
from ledger.executor import action_claim_next
from ledger.models import ActionStatus
from tests.factories import make_agent, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def agent():
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), daily_customer_total=Decimal("600.00"))
    return make_agent("billing")[0]


def refund(agent, order, amount="400.00"):
    action, _ = action_request(agent=agent, operation_key=f"refund:{order}:full:dec-1", action_type="refund",
                               target=order, customer="CUST-1", params={"amount": amount, "currency": "EUR"})
    assert action.status == ActionStatus.QUEUED
    return action.claim(owner="tests:1")


def declined(agent, order, amount="400.00"):
    """Refused by the provider for good: its dead letter is the way to retry it."""
    action = refund(agent, order, amount)
    action.mark_failed(actor="system:executor", claim=action.fence, code="declined", message="card blocked",
                       retryable=False)
    return action, DeadLetter.objects.get(action=action, status="open")


def test_a_failure_for_good_redriven_over_the_customers_total_waits_for_an_approver(agent):
    first, entry = declined(agent, "ORD-1")
    second = refund(agent, "ORD-2")  # the first did not count: 400 of 600
    second.mark_succeeded(actor="system:executor", claim=second.fence, external_ref="re_2")

    deadletter_redrive(entry, actor=person("olga", "operators"), reason="the card issuer lifted its block")

    first.refresh_from_db()
    assert first.status == ActionStatus.AWAITING_APPROVAL and first.approved_fingerprint == ""
    item = ReviewItem.objects.get(action=first, status="open")
    assert item.kind == ReviewKind.APPROVAL and "total" in item.why
    assert action_claim_next("tests:2") is None
    assert customer_total_today("refund", "EUR", "CUST-1") == Decimal("800.00")


def test_a_failure_for_good_redriven_within_the_limits_is_queued(agent):
    first, entry = declined(agent, "ORD-3", amount="100.00")
    deadletter_redrive(entry, actor=person("olga", "operators"), reason="the card issuer lifted its block")
    first.refresh_from_db()
    assert first.status == ActionStatus.QUEUED
    assert action_claim_next("tests:2").pk == first.pk
