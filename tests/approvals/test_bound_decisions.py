"""Every decision is taken on the params the person saw: the page carries their fingerprint,
a decision on params that changed since is refused, and an approval (each of two) or a release
is bound to them, for the executor to hold the action to."""

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from approvals.decisions import DecisionRefused, held_group_decide, review_decide
from approvals.models import Limit, ReviewItem
from ledger.actions import action_request
from ledger.executor import action_claim_next
from ledger.models import Action, ActionStatus
from tests.factories import audit_events, make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]
CHANGED = "the parameters changed since you opened this page"


@pytest.fixture
def people():
    users = {name: get_user_model().objects.create_user(name, password="x", is_staff=True, is_superuser=True)
             for name in ("alice", "bob")}
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("1000.00"))
    return users, make_agent("billing-bot")[0]


def refund(agent, n, amount, order=None):
    action, _ = action_request(agent=agent, operation_key=f"refund:ORD-B{n}:full:dec-{n}", action_type="refund",
                               target=order or f"ORD-B{n}", params={"amount": amount, "currency": "EUR"})
    return action, ReviewItem.objects.filter(action=action, status="open").first()


def change_params(action, amount):
    Action.objects.filter(pk=action.pk).update(params={"amount": amount, "currency": "EUR"})


def test_an_approval_is_bound_to_the_params_seen_and_audited_with_them(people):
    users, agent = people
    action, item = refund(agent, 1, "750.00")
    seen = action.params_fingerprint()
    review_decide(item, user=users["alice"], decision="approve", reason="fine", fingerprint=seen)
    action.refresh_from_db()
    item.refresh_from_db()
    assert action.approved_fingerprint == seen == action.fingerprint and item.decided_fingerprint == seen
    assert audit_events(action, "approved").get().after["approved_fingerprint"] == seen
    assert audit_events(item, "approve").get().after["decided_fingerprint"] == seen
    # What was approved is what the executor claims.
    assert action_claim_next("tests:worker", only=action.pk).status == ActionStatus.PENDING


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_decision_on_params_changed_since_the_page_opened_is_refused(people, decision):
    users, agent = people
    action, item = refund(agent, 2, "750.00")
    seen = action.params_fingerprint()
    change_params(action, "700.00")
    with pytest.raises(DecisionRefused, match=CHANGED):
        review_decide(item, user=users["alice"], decision=decision, reason="fine", fingerprint=seen)
    item.refresh_from_db()
    assert item.status == "open" and Action.objects.get(pk=action.pk).status == ActionStatus.AWAITING_APPROVAL


def test_a_queued_action_whose_params_changed_after_approval_goes_back_to_a_person(people):
    users, agent = people
    action, item = refund(agent, 3, "750.00")
    review_decide(item, user=users["alice"], decision="approve", reason="fine", fingerprint=action.params_fingerprint())
    change_params(action, "7500.00")
    assert action_claim_next("tests:worker", only=action.pk) is None
    action.refresh_from_db()
    assert action.status == ActionStatus.AWAITING_APPROVAL and action.attempts == 0
    again = ReviewItem.objects.get(action=action, status="open")
    assert "changed after it was approved" in again.why
    # 7500.00 would be sent, above the two-approver line: one person's approval is not enough.
    assert again.approvals_needed == 2
    seen = action.params_fingerprint()
    review_decide(again, user=users["bob"], decision="approve", reason="seen", fingerprint=seen)
    assert Action.objects.get(pk=action.pk).status == ActionStatus.AWAITING_APPROVAL
    assert action_claim_next("tests:worker", only=action.pk) is None
    # Approved again by a second person, on the params as they are now, it runs.
    review_decide(again, user=users["alice"], decision="approve", reason="seen too", fingerprint=seen)
    assert action_claim_next("tests:worker", only=action.pk).status == ActionStatus.PENDING


def test_a_second_approval_of_other_params_than_the_first_is_refused(people):
    users, agent = people
    action, item = refund(agent, 4, "1500.00")
    review_decide(item, user=users["alice"], decision="approve", reason="fine", fingerprint=action.params_fingerprint())
    change_params(action, "1400.00")
    with pytest.raises(DecisionRefused, match="changed after the first approval"):
        review_decide(item, user=users["bob"], decision="approve", reason="fine",
                      fingerprint=Action.objects.get(pk=action.pk).params_fingerprint())
    assert item.approvals.count() == 1


def test_a_release_from_a_held_group_is_bound_to_the_params_seen(people):
    users, agent = people
    first, _ = refund(agent, 5, "20.00", order="ORD-G")
    held, held_item = refund(agent, 6, "30.00", order="ORD-G")  # both held now: one group
    change_params(held, "35.00")
    with pytest.raises(DecisionRefused, match=CHANGED):
        held_group_decide(held_item, user=users["alice"], release=held.pk, reason="go",
                          fingerprint=held.params_fingerprint())
    seen = Action.objects.get(pk=held.pk).params_fingerprint()
    held_group_decide(held_item, user=users["alice"], release=held.pk, reason="go", fingerprint=seen)
    held.refresh_from_db()
    assert held.status == ActionStatus.QUEUED and held.approved_fingerprint == seen
    assert Action.objects.get(pk=first.pk).status == ActionStatus.REJECTED


def test_the_page_carries_the_print_and_a_form_without_it_approves_nothing(people, client):
    users, agent = people
    action, item = refund(agent, 7, "750.00")
    client.force_login(users["alice"])
    page = client.get(f"/review/{item.pk}/").content.decode()
    assert f'name="fingerprint" value="{action.params_fingerprint()}"' in page
    refused = client.post(f"/review/{item.pk}/decide", {"decision": "approve", "reason": "fine"}, follow=True)
    assert "the page did not say which parameters you saw" in refused.content.decode()
    change_params(action, "700.00")
    stale = client.post(f"/review/{item.pk}/decide", {"decision": "approve", "reason": "fine",
                                                      "fingerprint": action.params_fingerprint()}, follow=True)
    assert CHANGED in stale.content.decode()
    item.refresh_from_db()
    assert item.status == "open"


def test_params_changed_to_a_currency_without_a_limit_need_two_approvers(people):
    users, agent = people
    action, item = refund(agent, 8, "750.00")
    review_decide(item, user=users["alice"], decision="approve", reason="fine", fingerprint=action.params_fingerprint())
    Action.objects.filter(pk=action.pk).update(params={"amount": "7500.00", "currency": "USD"})
    assert action_claim_next("tests:worker", only=action.pk) is None
    assert ReviewItem.objects.get(action=action, status="open").approvals_needed == 2


def test_params_changed_above_the_second_threshold_before_any_approval_need_two_approvers(people):
    """Opened for 750.00 (one approver), changed behind the ledger's back to 7500.00 before anyone
    decided: an approval on the params as they are now is one of two, as the executor's look asks
    of params changed after an approval, never one person's alone."""
    users, agent = people
    action, item = refund(agent, 9, "750.00")
    assert item.approvals_needed == 1
    change_params(action, "7500.00")
    seen = Action.objects.get(pk=action.pk).params_fingerprint()
    review_decide(item, user=users["alice"], decision="approve", reason="seen", fingerprint=seen)
    assert Action.objects.get(pk=action.pk).status == ActionStatus.AWAITING_APPROVAL
    item.refresh_from_db()
    assert (item.status, item.approvals_needed, item.approvals.count()) == ("open", 2, 1)
    assert audit_events(item, "approvals_needed_raised").get().after == {"approvals_needed": 2}
    with pytest.raises(DecisionRefused, match="someone else"):
        review_decide(item, user=users["alice"], decision="approve", reason="again", fingerprint=seen)
    review_decide(item, user=users["bob"], decision="approve", reason="seen too", fingerprint=seen)
    assert Action.objects.get(pk=action.pk).status == ActionStatus.QUEUED


def test_the_page_says_when_the_params_ask_for_another_amount_than_the_one_recorded(people, client):
    """The headline is the amount recorded with the request; params changed since are what the
    provider would be sent, and the page says so beside it."""
    users, agent = people
    action, item = refund(agent, 9, "750.00")
    client.force_login(users["alice"])
    assert 'id="asked-otherwise"' not in client.get(f"/review/{item.pk}/").content.decode()
    change_params(action, "7500.00")
    page = client.get(f"/review/{item.pk}/").content.decode()
    assert 'id="asked-otherwise"' in page and "<strong>7500.00 EUR</strong>" in page


def test_the_page_says_when_the_params_ask_for_another_currency_spelling_as_the_review_counts_it(people, client):
    """Params changed to "eur" are not the currency recorded, for the intake's verdict (two
    approvers): the page says they ask otherwise, as the verdict reads them."""
    users, agent = people
    action, item = refund(agent, 10, "750.00")
    Action.objects.filter(pk=action.pk).update(params={**action.params, "currency": "eur"})
    client.force_login(users["alice"])
    assert 'id="asked-otherwise"' in client.get(f"/review/{item.pk}/").content.decode()
