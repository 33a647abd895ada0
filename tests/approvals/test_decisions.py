"""Limits at intake, and people deciding review items: four eyes, two approvers, one winner."""

import threading
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.utils import timezone

from approvals.decisions import AlreadyDecided, DecisionRefused, review_decide
from approvals.models import Limit, ReviewItem, ReviewKind
from approvals.policies import verdict_for
from ledger.actions import _lock_subjects, action_request
from ledger.models import Action, ActionStatus, AuditEvent
from tests.factories import another_transaction, make_action, make_agent, person

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def people():
    users = {name: person(name, "approvers") for name in ("olga", "alice", "bob")}
    agent, _ = make_agent("billing-bot")
    agent.owner = users["olga"]
    agent.save(update_fields=["owner"])
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"),
                    dual_approval_above=Decimal("5000.00"), daily_customer_total=Decimal("2000.00"))
    return users, agent


def refund(agent, key, amount, order, customer="CUST-1"):
    params = {"amount": amount, "currency": "EUR"}
    return action_request(agent=agent, operation_key=key, action_type="refund", target=order, customer=customer,
                          params=params)[0]


def test_the_policy_is_pure_and_reads_in_one_place():
    limit = Limit(action_type="refund", currency="EUR", max_amount=Decimal("500"),
                  dual_approval_above=Decimal("5000"), daily_customer_total=Decimal("2000"))
    assert verdict_for(limit, Decimal("500")).approvals_needed == 0
    assert verdict_for(limit, Decimal("500.01")).approvals_needed == 1
    assert verdict_for(limit, Decimal("5000.01")).approvals_needed == 2
    assert verdict_for(limit, Decimal("100"), customer_total_today=Decimal("1950")).approvals_needed == 1
    assert verdict_for(None, Decimal("1e9")).approvals_needed == 0


def test_an_over_limit_refund_waits_for_approval_with_a_deadline(people):
    _, agent = people
    action = refund(agent, "r1", "750.00", "ORD-1")
    assert action.status == "awaiting_approval"
    item = ReviewItem.objects.get(action=action)
    assert item.kind == ReviewKind.APPROVAL and item.status == "open" and item.approvals_needed == 1
    assert item.limit_snapshot["max_amount"] == "500.00"
    assert (item.deadline - item.created_at).total_seconds() == pytest.approx(4 * 3600, abs=5)


def test_the_agents_owner_cannot_approve_four_eyes(people):
    users, agent = people
    item = ReviewItem.objects.get(action=refund(agent, "r1", "750.00", "ORD-1"))
    with pytest.raises(DecisionRefused, match="four eyes"):
        review_decide(item, user=users["olga"], decision="approve", reason="mine")
    item.refresh_from_db()
    assert item.status == "open"


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_person_without_the_authority_is_refused_by_the_decision_itself(people, decision):
    """Not only by the page: a caller without one (a command, a script) is held to it too."""
    _, agent = people
    item = ReviewItem.objects.get(action=refund(agent, "r1", "750.00", "ORD-1"))
    nobody = get_user_model().objects.create_user("nobody", password="x")
    events = AuditEvent.objects.count()
    with pytest.raises(PermissionDenied, match="you may not decide refund items"):
        review_decide(item, user=nobody, decision=decision, reason="looks fine")
    item.refresh_from_db()
    assert item.status == "open" and Action.objects.get(pk=item.action_id).status == "awaiting_approval"
    assert AuditEvent.objects.count() == events and not item.approvals.exists()


def test_a_reject_needs_a_reason(people):
    users, agent = people
    item = ReviewItem.objects.get(action=refund(agent, "r1", "750.00", "ORD-1"))
    with pytest.raises(DecisionRefused, match="reason"):
        review_decide(item, user=users["alice"], decision="reject", reason="  ")
    review_decide(item, user=users["alice"], decision="reject", reason="duplicate claim")
    item.action.refresh_from_db()
    assert item.action.status == "rejected"
    event = AuditEvent.objects.get(verb="rejected", object_type="ledger.action")
    assert event.actor == "user:alice" and event.reason == "duplicate claim"


def test_above_the_second_threshold_two_different_approvers_are_needed(people):
    users, agent = people
    action = refund(agent, "r-big", "7500.00", "ORD-2")
    item = ReviewItem.objects.get(action=action)
    assert item.approvals_needed == 2
    review_decide(item, user=users["alice"], decision="approve", reason="checked")
    action.refresh_from_db()
    assert action.status == "awaiting_approval"
    with pytest.raises(DecisionRefused, match="someone else"):
        review_decide(item, user=users["alice"], decision="approve", reason="checked again")
    review_decide(item, user=users["bob"], decision="approve", reason="agreed")
    action.refresh_from_db()
    item.refresh_from_db()
    assert action.status == "queued" and item.status == "approved"


def test_two_approvers_at_once_one_wins_and_the_other_is_told_who(people):
    users, agent = people
    item = ReviewItem.objects.get(action=refund(agent, "r1", "750.00", "ORD-1"))
    outcomes = {}
    barrier = threading.Barrier(2)

    def decide(name):
        barrier.wait()
        try:
            review_decide(item, user=users[name], decision="approve", reason=name)
            outcomes[name] = "won"
        except AlreadyDecided as exc:
            outcomes[name] = str(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(n,)) for n in ("alice", "bob")]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(outcomes.values())[-1] == "won"
    loser = next(v for v in outcomes.values() if v != "won")
    winner = next(k for k, v in outcomes.items() if v == "won")
    assert f"already approved by user:{winner}" in loser
    assert AuditEvent.objects.filter(verb="approve", object_type="approvals.reviewitem").count() == 1


def test_a_customers_daily_total_sends_the_next_refund_to_approval(people):
    _, agent = people
    for i in range(4):  # 4 x 450.00 succeed: each settled before the next, so none is held
        action = refund(agent, f"d{i}", "450.00", f"ORD-D{i}", customer="CUST-9")
        assert action.status == "queued"
        settled(action, f"re_{i}")
    fifth = refund(agent, "d4", "450.00", "ORD-D4", customer="CUST-9")  # 2,250.00 today > 2,000.00
    assert fifth.status == "awaiting_approval"
    assert ReviewItem.objects.get(action=fifth).why == "the customer's total today would be 2250.00 EUR, above 2000.00"
    other_customer = refund(agent, "d5", "450.00", "ORD-D5", customer="CUST-10")
    assert other_customer.status == "queued"


def settled(action, ref):
    claimed = action.claim(owner="host:test")
    return claimed.mark_succeeded(actor="system:executor", claim=claimed.fence, external_ref=ref)


def test_a_failure_that_may_be_retried_counts_in_the_daily_total_and_one_failed_for_good_does_not(people):
    """Its retry runs on the verdict it was recorded under: left out of the total meanwhile, a
    refund asked for the customer after it passed the total, and both ran."""
    _, agent = people
    for customer, retryable in (("CUST-F", True), ("CUST-G", False)):
        for i in range(3):
            settled(refund(agent, f"{customer}-{i}", "450.00", f"ORD-{customer}-{i}", customer=customer), f"re_{i}")
        failed = refund(agent, f"{customer}-3", "450.00", f"ORD-{customer}-3", customer=customer).claim(owner="t")
        failed.mark_failed(actor="system:executor", claim=failed.fence, code="x", message="x", retryable=retryable)
    # 1,350.00 settled, 450.00 that may still be refunded, and 450.00 more: 2,250.00, above 2,000.00.
    waits = refund(agent, "CUST-F-4", "450.00", "ORD-CUST-F-4", customer="CUST-F")
    assert waits.status == "awaiting_approval"
    assert ReviewItem.objects.get(action=waits).why == "the customer's total today would be 2250.00 EUR, above 2000.00"
    assert refund(agent, "CUST-G-4", "450.00", "ORD-CUST-G-4", customer="CUST-G").status == "queued"


def test_a_released_refund_counts_its_own_amount_once_in_the_daily_total(people):
    users, agent = people
    for i in (2, 3):
        settled(refund(agent, f"r{i}", "450.00", f"ORD-R{i}", customer="CUST-R"), f"re_r{i}")
    first = refund(agent, "r0", "450.00", "ORD-R0", customer="CUST-R").claim(owner="host:test")
    held = refund(agent, "r1", "400.00", "ORD-R0", customer="CUST-R")  # the order has a call in flight
    assert held.status == "held"
    first.mark_succeeded(actor="system:executor", claim=first.fence, external_ref="re_r0")
    # Released by the system when the first one settled. Today: 1,350.00 settled + its own
    # 400.00 = 1,750.00, under the 2,000.00 a day: its own amount, already in the ledger, once.
    assert held.__class__.objects.get(pk=held.pk).status == "queued"


def test_a_policy_change_is_audited_and_applies_to_new_actions(people):
    _, agent = people
    before = refund(agent, "p1", "600.00", "ORD-P1", customer="C-P1")
    Limit.limit_set(actor="system:tests", action_type="refund", currency="EUR", max_amount=Decimal("1000.00"),
                    reason="raised for the sale")
    after = refund(agent, "p2", "600.00", "ORD-P2", customer="C-P2")
    assert before.status == "awaiting_approval" and after.status == "queued"
    event = AuditEvent.objects.filter(verb="limit_set").latest("id")
    assert event.before["max_amount"] == "500.00" and event.after["max_amount"] == "1000.00"
    assert event.reason == "raised for the sale"


def test_an_outcome_the_provider_reported_cannot_be_marked_failed(people):
    users, agent = people
    action = refund(agent, "u1", "20.00", "ORD-U1")
    action.claim(owner="w")
    action.mark_unknown(actor="system:tests", claim=action.fence, verify_at=timezone.now(), evidence={"code": "timeout"})
    action.mark_needs_review(actor="system:tests", evidence={"found": True, "verification": {"matches": ["re_1"]}})
    item = ReviewItem.objects.get(action=action, status="open")
    with pytest.raises(DecisionRefused, match="reported the effect"):
        review_decide(item, user=users["alice"], decision="mark_failed", reason="no refund seen")


def test_two_first_saves_of_one_limit_at_once_both_land_and_neither_fails():
    """The other save inserts the limit and has not committed when this one looks: this one
    finds no row, inserts, waits on the unique constraint, and then changes the other's."""

    def other_save():
        Limit.limit_set(actor="system:other", reason="the tests' policy",
                        action_type="refund", currency="GBP", max_amount=Decimal("100.00"))

    with another_transaction(other_save, commit_when_waited_on=True) as other:
        mine = Limit.limit_set(actor="system:tests", reason="the tests' policy",
                               action_type="refund", currency="GBP", max_amount=Decimal("250.00"))

    assert other.waited is True
    assert Limit.objects.get(action_type="refund", currency="GBP").max_amount == Decimal("250.00") == mine.max_amount
    events = AuditEvent.objects.filter(verb="limit_set", object_id=str(mine.pk)).order_by("id")
    assert [(e.actor, e.before and e.before["max_amount"], e.after["max_amount"]) for e in events] == [
        ("system:other", None, "100.00"), ("system:tests", "100.00", "250.00")]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises every writer")
def test_the_daily_total_is_summed_under_the_customers_lock(people):
    """Another request for the customer holds the locks and ends with a settled refund: the
    total must count it, or this refund would slip under the daily limit (2000.00)."""
    _, agent = people

    def another_request_recorded_and_settled():
        _lock_subjects("ORD-A", "CUST-1")
        make_action(agent, ActionStatus.SUCCEEDED, key="earlier", target="ORD-A", customer="CUST-1", amount="1950.00")

    with another_transaction(another_request_recorded_and_settled, commit_when_waited_on=True) as other:
        action = refund(agent, "later", "100.00", "ORD-9", customer="CUST-1")

    assert other.waited is True  # this request, for the customer's lock
    assert action.status == "awaiting_approval"


@pytest.mark.parametrize("decision", ["approve", "reject", "release", "limit"])
def test_every_decision_without_a_reason_is_refused_and_changes_nothing(people, decision):
    users, agent = people
    if decision == "release":  # held behind an earlier refund still in flight on the same order
        refund(agent, "r0", "20.00", "ORD-1")
    item = ReviewItem.objects.get(action=refund(agent, "r1", "750.00" if decision != "release" else "30.00", "ORD-1"))
    events = AuditEvent.objects.count()
    if decision == "limit":
        with pytest.raises(ValueError, match="a reason is required"):
            Limit.limit_set(actor=users["alice"], reason="  ", action_type="refund", currency="EUR",
                            max_amount=Decimal("1.00"))
        assert Limit.objects.get(currency="EUR").max_amount == Decimal("500.00")
    else:
        with pytest.raises(DecisionRefused, match=f"a reason is required to {decision}"):
            review_decide(item, user=users["alice"], decision=decision, reason="  ")
    item.refresh_from_db()
    assert item.status == "open" and AuditEvent.objects.count() == events
    assert item.action.status == ("held" if decision == "release" else "awaiting_approval")


def test_the_page_shows_the_refusal_of_a_decision_without_a_reason(people, client):
    users, agent = people
    item = ReviewItem.objects.get(action=refund(agent, "r1", "750.00", "ORD-1"))
    client.force_login(get_user_model().objects.create_superuser("root", password="x"))
    page = client.post(f"/review/{item.pk}/decide", {"decision": "approve", "reason": " ",
                                                      "fingerprint": item.action.params_fingerprint()}, follow=True)
    assert "Not done: a reason is required to approve" in page.content.decode()
    item.refresh_from_db()
    assert item.status == "open"
    policies = client.post("/policies/", {"action_type": "refund", "currency": "EUR", "max_amount": "1.00",
                                           "review_deadline_hours": 4, "reason": " "})
    assert policies.status_code == 200 and "This field is required" in policies.content.decode()
    assert Limit.objects.get(currency="EUR").max_amount == Decimal("500.00")
