"""A review item's page: who may decide, what a decision does, and that only one decision wins."""

import pytest

from approvals.models import ReviewItem, ReviewStatus
from ledger.models import Action, ActionStatus
from tests.browser.conftest import csrf_post, login, request_refund, status_message
from tests.conftest import wait_until
from tests.factories import api_client, audit_events, make_agent, sandbox_list

pytestmark = pytest.mark.browser

KEY = "refund:ORD-7001:full:dec-7001"
OWN_KEY = "refund:ORD-7002:full:dec-7002"


@pytest.fixture
def over_limit_refund(api, limit):
    """750.00 EUR against a limit of 500.00: one approver must decide."""
    action = request_refund(api, KEY, "ORD-7001", "750.00", "CUST-7001")
    assert action["status"] == "awaiting_approval"
    return ReviewItem.objects.get(action__operation_key=KEY, status=ReviewStatus.OPEN)


def assert_undecided(item, verb):
    """The item is still open, its action still waits for approval, and no `verb` was audited."""
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN
    assert Action.objects.get(pk=item.action_id).status == ActionStatus.AWAITING_APPROVAL
    assert not audit_events(item, verb).exists()


def decision_button(page, decision):
    return page.locator(f"#decision-form button[name=decision][value={decision}]")


def test_an_approver_approves_an_over_limit_refund_and_the_provider_holds_exactly_one(
        stack, page, over_limit_refund, api, shot):
    item = over_limit_refund
    stack.start_worker()
    login(page, "alice")
    page.goto("/approvals/")
    shot(page, "approvals-queue")
    with page.expect_navigation():
        page.locator(".queue-row", has_text=KEY).locator("a.row-link").click()
    assert page.url.endswith(f"/review/{item.pk}/")
    assert page.locator("#item-status").inner_text().strip() == "open"
    assert page.locator("#action-status").inner_text().strip() == "awaiting approval"
    shot(page, "review-detail")

    page.locator("#reason").fill("the customer was charged twice")
    with page.expect_navigation():
        decision_button(page, "approve").click()
    assert page.locator("#item-status").inner_text().strip() == "approved"

    def action_status_on_page():
        page.reload()
        return page.locator("#action-status").inner_text().strip() == "succeeded"

    wait_until(action_status_on_page, seconds=20, interval=0.5, message="the page to show the action succeeded")
    refunds = sandbox_list(api, "refunds", order_id="ORD-7001")
    assert len(refunds) == 1 and refunds[0]["amount"] == "750.00"
    assert refunds[0]["id"] == Action.objects.get(operation_key=KEY).external_ref
    assert [e.actor for e in audit_events(item, "approve")] == ["user:alice"]
    shot(page, "review-detail-approved")


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_decision_without_a_reason_is_refused(page, over_limit_refund, decision):
    item = over_limit_refund
    login(page, "alice")
    page.goto(f"/review/{item.pk}/")
    decision_button(page, decision).click()  # the reason field is required: the browser asks for it
    assert page.locator("#reason").evaluate("field => field.validity.valueMissing")
    assert page.url.endswith(f"/review/{item.pk}/")
    # Sent anyway (blank once stripped): the server refuses and the page says why.
    forged = csrf_post(page, f"/review/{item.pk}/decide", {"decision": decision, "reason": "  ",
                                                           "fingerprint": item.action.params_fingerprint()})
    assert forged.status == 303
    page.goto(f"/review/{item.pk}/")
    assert f"a reason is required to {decision}" in status_message(page)
    assert page.locator("#item-status").inner_text().strip() == "open"
    assert page.locator("#action-status").inner_text().strip() == "awaiting approval"
    assert_undecided(item, decision)


def test_an_auditor_sees_no_approve_control_and_a_forged_post_answers_403(page, over_limit_refund):
    item = over_limit_refund
    login(page, "aldo")
    page.goto(f"/review/{item.pk}/")
    assert page.locator("#no-permission").is_visible()
    assert page.locator("#decision-form").count() == 0
    assert page.locator("button[value=approve]").count() == 0

    forged = csrf_post(page, f"/review/{item.pk}/decide", {"decision": "approve", "reason": "forged"})
    assert forged.status == 403
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN
    assert Action.objects.get(pk=item.action_id).status == ActionStatus.AWAITING_APPROVAL


def test_an_operator_without_the_approve_permission_gets_403_for_a_forged_post(page, over_limit_refund, people):
    # olga is an operator (and the agent's owner); the permission check comes first.
    item = over_limit_refund
    login(page, "olga")
    page.goto(f"/review/{item.pk}/")
    assert page.locator("button[value=approve]").count() == 0
    forged = csrf_post(page, f"/review/{item.pk}/decide", {"decision": "approve"})
    assert forged.status == 403
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN


def test_the_requester_cannot_approve_their_own_item(stack, pages, over_limit_refund, people):
    # olga, responsible for billing-bot, sees the four-eyes note instead of the form.
    page = login(pages.new(), "olga")
    page.goto(f"/review/{over_limit_refund.pk}/")
    assert page.locator("#four-eyes").is_visible()
    assert page.locator("button[value=approve]").count() == 0

    # An approver responsible for an agent has the permission, and still may not decide its requests.
    alices_bot, token = make_agent("alices-bot")
    alices_bot.owner = people["alice"]
    alices_bot.save(update_fields=["owner"])
    with api_client(stack.url, token) as client:
        request_refund(client, OWN_KEY, "ORD-7002", "600.00", "CUST-7002")
    own = ReviewItem.objects.get(action__operation_key=OWN_KEY, status=ReviewStatus.OPEN)
    page = login(pages.new(), "alice")
    page.goto(f"/review/{own.pk}/")
    assert page.locator("#four-eyes").is_visible()
    assert page.locator("button[value=approve]").count() == 0
    # Forged as a plain form post: refused, back to the item with the reason why.
    seen = own.action.params_fingerprint()  # as the page would carry it
    forged = csrf_post(page, f"/review/{own.pk}/decide", {"decision": "approve", "reason": "mine", "fingerprint": seen})
    assert forged.status == 303 and forged.headers["location"] == f"/review/{own.pk}/"
    page.goto(f"/review/{own.pk}/")
    assert "four eyes" in status_message(page)
    # Forged as an htmx request: 400, and htmx is sent back to the item.
    forged = csrf_post(page, f"/review/{own.pk}/decide", {"decision": "approve", "reason": "mine", "fingerprint": seen},
                       headers={"HX-Request": "true"})
    assert forged.status == 400 and forged.headers["hx-redirect"] == f"/review/{own.pk}/"
    assert_undecided(own, "approve")


def test_two_approvers_racing_make_one_decision_and_the_other_is_told_who_decided(pages, over_limit_refund):
    item = over_limit_refund
    racers = {name: login(pages.new(), name) for name in ("alice", "bob")}
    for page in racers.values():
        page.goto(f"/review/{item.pk}/")
        page.locator("#reason").fill("looks right")
    # Both forms are submitted before either answer arrives.
    with racers["alice"].expect_navigation(), racers["bob"].expect_navigation():
        for page in racers.values():
            page.evaluate("document.querySelector('#decision-form').requestSubmit(document.querySelector('#approve-button'))")

    item.refresh_from_db()
    assert item.status == ReviewStatus.APPROVED
    winner = item.decided_by_label.removeprefix("user:")
    loser = ({"alice", "bob"} - {winner}).pop()
    assert f"{item.action.operation_key}: approved" in status_message(racers[winner])
    assert f"already approved by user:{winner}" in status_message(racers[loser])
    for page in racers.values():
        assert page.locator("#item-status").inner_text().strip() == "approved"
    assert [e.actor for e in audit_events(item, "approve")] == [f"user:{winner}"]
    assert audit_events(item.action, "approved").count() == 1
