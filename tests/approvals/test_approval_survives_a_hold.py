"""An approval is bound to the params a person approved (decision 23), not to the action's place in
the queue: an approved refund held by a request on its order or customer before a worker claimed it
is released to `queued` on that approval, by a person or by the system (decision 18). A print that is
no approval never lets one through: what goes (back) to waiting for approval carries none, and a
failure for good retried by a person is asked of the limits again, as a new request."""

import importlib
from decimal import Decimal

import pytest
from django.apps import apps as django_apps
from django.contrib.auth import get_user_model

from approvals.decisions import DecisionRefused, review_decide
from approvals.models import Limit, ReviewItem, ReviewKind
from dlq.entries import deadletter_redrive
from dlq.models import DeadLetter
from ledger.actions import action_request, action_retry
from ledger.executor import action_claim_next
from ledger.models import Action, ActionStatus
from tests.factories import audit_events, make_agent, person

S = ActionStatus
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def agent():
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("1000.00"))
    return make_agent("billing")[0]


@pytest.fixture
def alice():
    return get_user_model().objects.create_superuser("alice", password=None)


@pytest.fixture
def bob():
    return get_user_model().objects.create_superuser("bob", password=None)


def refund(agent, key, amount, order="ORD-1", customer="C-1"):
    return action_request(agent=agent, operation_key=key, action_type="refund", target=order, customer=customer,
                          decision_id=key, params={"amount": amount, "currency": "EUR"})[0]


def now(action):
    return Action.objects.get(pk=action.pk)


def open_item(action):
    return ReviewItem.objects.get(action=action, status="open")


def approved(agent, alice, key="big", amount="750.00"):
    big = refund(agent, key, amount)
    review_decide(open_item(big), user=alice, decision="approve", reason="the customer's claim is checked")
    big = now(big)
    assert big.status == S.QUEUED
    return big


def settled(action):
    claimed = now(action).claim(owner="tests:1")
    return claimed.mark_succeeded(actor="system:executor", claim=claimed.fence, external_ref=f"re_{action.pk}")


def test_a_persons_release_of_an_approved_refund_queues_it_on_its_approval(agent, alice):
    big = approved(agent, alice)
    refund(agent, "small", "20.00")
    assert now(big).status == S.HELD
    held = open_item(big)
    assert held.kind == ReviewKind.HELD

    review_decide(held, user=alice, decision="release", reason="the order's other refund is separate")

    big = now(big)
    assert big.status == S.QUEUED and big.approved_fingerprint == big.params_fingerprint()
    held.refresh_from_db()
    assert held.status == "resolved" and not ReviewItem.objects.filter(action=big, status="open").exists()
    assert action_claim_next("tests:2").pk == big.pk  # its approval still stands at the claim


def test_both_of_two_approvals_survive_a_hold(agent, alice, bob):
    big = refund(agent, "big", "1500.00")
    review_decide(open_item(big), user=alice, decision="approve", reason="one of two")
    review_decide(open_item(big), user=bob, decision="approve", reason="two of two")
    assert now(big).status == S.QUEUED
    refund(agent, "small", "20.00")

    review_decide(open_item(big), user=bob, decision="release", reason="go")

    assert now(big).status == S.QUEUED
    assert not ReviewItem.objects.filter(action=big, status="open").exists()


def test_the_systems_release_of_an_approved_refund_queues_it_on_its_approval(agent, alice):
    running = refund(agent, "running", "10.00", order="ORD-2", customer="C-2").claim(owner="tests:1")
    big = approved(agent, alice)
    # In flight on ORD-2 (running) and C-1 (big, not started): both wait with it.
    small = refund(agent, "small", "20.00", order="ORD-2")
    assert now(small).status == S.HELD and now(big).status == S.HELD

    running.mark_succeeded(actor="system:executor", claim=running.fence, external_ref="re_running")
    assert now(small).status == S.QUEUED and now(big).status == S.HELD  # small goes first, big behind it
    settled(small)

    big = now(big)
    assert big.status == S.QUEUED
    assert audit_events(big, "released").get().actor == "system:intake"
    assert not ReviewItem.objects.filter(action=big, status="open").exists()
    assert ReviewItem.objects.get(action=big, kind=ReviewKind.HELD).status == "closed"


def test_an_approved_failure_retried_and_held_on_its_way_back_keeps_its_approval(agent, alice):
    big = approved(agent, alice).claim(owner="tests:1")
    big.mark_failed(actor="system:executor", claim=big.fence, code="timeout", message="try again", retryable=True)
    small = refund(agent, "small", "20.00")
    assert now(small).status == S.QUEUED

    action_retry(now(big), actor="system:tests", reason="a task's retry")
    assert now(big).status == S.HELD
    settled(small)

    assert now(big).status == S.QUEUED
    assert not ReviewItem.objects.filter(action=big, status="open").exists()


def test_a_failure_for_good_retried_by_a_person_is_approved_again(agent, alice):
    """Failed for good, it left the customer's daily total: a person's retry asks the limits again,
    as a new request, and its old approval no longer lets it through, held on the way or not."""
    big = approved(agent, alice).claim(owner="tests:1")
    big.mark_failed(actor="system:executor", claim=big.fence, code="declined", message="card blocked",
                    retryable=False)
    small = refund(agent, "small", "20.00")

    deadletter_redrive(DeadLetter.objects.get(action=big, status="open"), actor=person("olga", "operators"),
                       reason="the card issuer lifted its block")
    assert now(big).status == S.HELD and now(big).approved_fingerprint == ""
    settled(small)

    assert now(big).status == S.AWAITING_APPROVAL
    assert open_item(big).kind == ReviewKind.APPROVAL


def test_a_release_to_approval_carries_no_print_and_one_of_two_approvals_is_no_approval(agent, alice, bob):
    big = refund(agent, "big", "1500.00")
    review_decide(open_item(big), user=alice, decision="approve", reason="one of two")
    assert now(big).status == S.AWAITING_APPROVAL and now(big).approved_fingerprint == ""
    refund(agent, "small", "20.00")
    assert now(big).status == S.HELD

    review_decide(open_item(big), user=alice, decision="release", reason="go")
    big = now(big)
    assert big.status == S.AWAITING_APPROVAL and big.approved_fingerprint == ""
    assert open_item(big).kind == ReviewKind.APPROVAL and open_item(big).approvals_needed == 2

    refund(agent, "third", "30.00")  # holds it again before anyone approved it
    assert now(big).status == S.HELD
    review_decide(open_item(big), user=bob, decision="release", reason="go")
    assert now(big).status == S.AWAITING_APPROVAL and open_item(big).approvals_needed == 2


def test_the_first_of_two_approvals_survives_a_hold(agent, alice, bob):
    """Held between its two approvals and released to wait for them again, it waits on the item that
    holds the first (reopened): the second approver finishes it, and the first may not approve twice."""
    big = refund(agent, "big", "1500.00")
    first = open_item(big)
    review_decide(first, user=alice, decision="approve", reason="one of two")
    refund(agent, "small", "20.00")
    assert now(big).status == S.HELD

    review_decide(open_item(big), user=bob, decision="release", reason="the small one is another matter")

    assert open_item(big).pk == first.pk and [a.user for a in open_item(big).approvals.all()] == [alice]
    with pytest.raises(DecisionRefused, match="four eyes"):
        review_decide(open_item(big), user=alice, decision="approve", reason="again")
    review_decide(open_item(big), user=bob, decision="approve", reason="two of two")
    big = now(big)
    assert big.status == S.QUEUED and big.approved_fingerprint == big.params_fingerprint()
    assert audit_events(first, "reopened").count() == 1


def test_params_changed_after_the_approval_are_approved_again(agent, alice):
    big = approved(agent, alice)
    refund(agent, "small", "20.00")
    Action.objects.filter(pk=big.pk).update(params={"amount": "900.00", "currency": "EUR"})

    review_decide(open_item(big), user=alice, decision="release", reason="go")

    big = now(big)
    assert big.status == S.AWAITING_APPROVAL and big.approved_fingerprint == ""
    assert open_item(big).kind == ReviewKind.APPROVAL


def test_the_migration_drops_the_print_a_release_to_approval_left_before(agent, alice):
    """Before, a person's release to awaiting approval wrote their print there; a later hold and
    release would take it for an approval. Migration 0047 drops it from every such row."""
    dropped = importlib.import_module("ledger.migrations.0047_no_print_while_awaiting_approval")
    big = refund(agent, "big", "750.00")
    Action.objects.filter(pk=big.pk).update(approved_fingerprint=big.params_fingerprint())  # as written before
    assert now(big).has_approval()

    dropped.forward(django_apps, None)

    assert now(big).approved_fingerprint == "" and not now(big).has_approval()
