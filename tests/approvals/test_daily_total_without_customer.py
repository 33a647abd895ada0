"""Refunds that name no customer share one daily total, as if they were one customer (the empty
one): an agent that leaves the customer out does not escape the total (decision 30)."""

import importlib
from datetime import timedelta
from decimal import Decimal

import pytest
from django.apps import apps as django_apps
from django.db import connection
from django.utils import timezone

from approvals.models import Limit, ReviewItem, SummaryDay
from approvals.policies import verdict_for
from approvals.whatif import Proposal, whatif
from ledger.actions import action_request, action_retry_by_person
from ledger.models import Action, ActionStatus
from tests.factories import another_transaction, make_action, make_agent, make_agent_on, person, \
    post_action_in_process, refund_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

LIMIT = dict(action_type="refund", currency="EUR", max_amount=Decimal("500.00"), daily_customer_total=Decimal("1000.00"))


def set_limit():
    Limit.limit_set(actor="system:tests", reason="the tests' policy", **LIMIT)


@pytest.fixture
def agent_client(client):
    make_agent_on(client)
    set_limit()
    return client


def settled(action, ref):
    claimed = action.claim(owner="host:test")
    return claimed.mark_succeeded(actor="system:executor", claim=claimed.fence, external_ref=ref)


def statuses(client, bodies):
    """Each request's status as answered; each one that runs settles before the next is asked."""
    out = []
    for i, body in enumerate(bodies):
        key = f"refund:{body['target']}:{body['decision_id']}"
        answer = post_action_in_process(client, key, body)
        assert answer.status_code == 201, answer.json()
        out.append(answer.json()["status"])
        action = Action.objects.get(operation_key=key)
        if action.status == ActionStatus.QUEUED:
            settled(action, f"re_{i}")
    return out


def without_customer(body):
    del body["customer"]
    return body


def test_leaving_the_customer_out_does_not_escape_the_daily_total(agent_client):
    bodies = [without_customer(refund_body(f"ORD-{i}", amount="450.00", decision=f"dec-{i}")) for i in range(5)]
    assert statuses(agent_client, bodies) == ["queued", "queued", "awaiting_approval", "awaiting_approval",
                                              "awaiting_approval"]
    third = Action.objects.get(operation_key="refund:ORD-2:dec-2")
    assert ReviewItem.objects.get(action=third).why == (
        "the total today of refunds that name no customer would be 1350.00 EUR, above 1000.00")


def test_a_named_customers_total_is_its_own(agent_client):
    """The empty customer is one customer among others: its total and a named one's stay apart."""
    bodies = [without_customer(refund_body(f"ORD-{i}", amount="450.00", decision=f"dec-{i}")) for i in range(2)]
    bodies += [refund_body("ORD-C1", amount="450.00", customer="CUST-1", decision="dec-c1"),
               without_customer(refund_body("ORD-2", amount="450.00", decision="dec-2"))]
    assert statuses(agent_client, bodies) == ["queued", "queued", "queued", "awaiting_approval"]


def test_the_reason_names_whose_total_it_is():
    limit = Limit(**LIMIT)
    assert verdict_for(limit, Decimal("450"), Decimal("900")).reason == (
        "the customer's total today would be 1350.00 EUR, above 1000.00")
    assert verdict_for(limit, Decimal("450"), Decimal("900"), no_customer=True).reason == (
        "the total today of refunds that name no customer would be 1350.00 EUR, above 1000.00")
    assert verdict_for(limit, Decimal("100"), Decimal("900"), no_customer=True).approvals_needed == 0


def test_the_whatif_counts_them_as_the_intake_does(agent_client):
    bodies = [without_customer(refund_body(f"ORD-{i}", amount="450.00", decision=f"dec-{i}")) for i in range(3)]
    assert statuses(agent_client, bodies)[-1] == "awaiting_approval"
    preview = whatif(Proposal(**LIMIT), days=1)
    assert preview["counts"]["current_daily_total"] == preview["counts"]["proposed_daily_total"] == 1
    lower = whatif(Proposal(**{**LIMIT, "daily_customer_total": Decimal("500.00")}), days=1)
    assert lower["counts"]["proposed_daily_total"] == 2
    assert [e["proposed"].reason for e in lower["examples"]] == [
        "the total today of refunds that name no customer would be 900.00 EUR, above 500.00"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises every writer")
def test_two_requests_without_a_customer_at_once_do_not_both_pass():
    """Another request without a customer, on another order, is recorded and not yet committed:
    this one waits for it, and its total counts it (450.00 settled, 450.00 and 450.00: 1350.00).
    Summed without waiting, it would see 900.00 and run too."""
    set_limit()
    agent, _ = make_agent("billing")
    make_action(agent, ActionStatus.SUCCEEDED, key="earlier", target="ORD-S", customer="", amount="450.00")

    def another_request():
        other = action_request(agent=agent, operation_key="other", action_type="refund", target="ORD-A",
                               params={"amount": "450.00", "currency": "EUR"})[0]
        assert other.status == ActionStatus.QUEUED

    with another_transaction(another_request, commit_when_waited_on=True) as other:
        mine = action_request(agent=agent, operation_key="mine", action_type="refund", target="ORD-B",
                              params={"amount": "450.00", "currency": "EUR"})[0]

    assert other.waited is True  # this request, for the turn of the requests without a customer
    assert mine.status == ActionStatus.AWAITING_APPROVAL


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises every writer")
def test_a_failure_for_good_retried_by_a_person_waits_for_a_request_without_a_customer():
    """Failed for good, a refund without a customer is in no total; retried by a person, it is
    asked of the limits again while another request without a customer, on another order, is
    recorded and not yet committed (which did not count it): the retry waits for it and counts it
    (450.00 settled, 450.00 requested, 450.00 retried: 1350.00). Summed without waiting, both ran."""
    set_limit()
    agent, _ = make_agent("billing")
    make_action(agent, ActionStatus.SUCCEEDED, key="earlier", target="ORD-S", customer="", amount="450.00")
    declined = make_action(agent, ActionStatus.FAILED, key="declined", target="ORD-F", customer="", amount="450.00",
                           retryable=False)
    alice = person("alice")

    def another_request():
        other = action_request(agent=agent, operation_key="other", action_type="refund", target="ORD-A",
                               params={"amount": "450.00", "currency": "EUR"})[0]
        assert other.status == ActionStatus.QUEUED

    with another_transaction(another_request, commit_when_waited_on=True) as other:
        retried = action_retry_by_person(declined, actor=alice, reason="the card was replaced")

    assert other.waited is True  # the retry, for the turn of the requests without a customer
    assert retried.status == ActionStatus.AWAITING_APPROVAL


def test_the_migration_has_every_day_summarised_again():
    migration = importlib.import_module("approvals.migrations.0019_no_customer_shares_a_daily_total")
    today = timezone.now().date()
    SummaryDay.objects.bulk_create([SummaryDay(day=today - timedelta(days=i), stale=i == 3) for i in (1, 2, 3)])
    migration.every_summary_stale(django_apps, None)
    assert set(SummaryDay.objects.values_list("stale", flat=True)) == {True}
