"""The approvals queue from the keyboard: j/k to move, Enter to open, a to approve."""


import pytest

from approvals.models import ReviewItem, ReviewStatus
from ledger.actions import action_request
from ledger.models import ActionStatus
from tests.browser.conftest import login, status_message
from tests.factories import audit_events

pytestmark = pytest.mark.browser


def awaiting_approval(agent, n, amount):
    action, _ = action_request(agent=agent, operation_key=f"refund:ORD-K{n}:full:dec-k{n}", action_type="refund",
                               target=f"ORD-K{n}", customer=f"CUST-K{n}", params={"amount": amount, "currency": "EUR"})
    assert action.status == ActionStatus.AWAITING_APPROVAL
    return ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)


def test_keyboard_approve_works(page, agent, limit):
    first, second = awaiting_approval(agent, 1, "600.00"), awaiting_approval(agent, 2, "900.00")
    login(page, "alice")
    page.goto("/approvals/")
    assert page.locator("#keyboard-hint").is_visible()
    selected = page.locator('.queue-row[aria-selected="true"]')

    page.keyboard.press("j")
    assert selected.get_attribute("data-id") == str(first.pk)
    page.keyboard.press("j")
    assert selected.get_attribute("data-id") == str(second.pk)
    page.keyboard.press("k")
    assert selected.get_attribute("data-id") == str(first.pk)
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert page.url.endswith(f"/review/{first.pk}/")

    # a asks for the reason (a prompt) and, answered, takes the decision.
    page.once("dialog", lambda dialog: dialog.accept("the order was checked"))
    with page.expect_navigation():
        page.keyboard.press("a")
    # The decision is taken and the page moves on to the next item in the queue's order.
    assert page.url.endswith(f"/review/{second.pk}/")
    assert f"{first.action.operation_key}: approved" in status_message(page)
    first.refresh_from_db()
    assert first.status == ReviewStatus.APPROVED and first.decided_by_label == "user:alice"
    assert first.action.status == ActionStatus.QUEUED  # approved; no worker runs in this test
    assert audit_events(first, "approve").filter(actor="user:alice").get().reason == "the order was checked"
    assert ReviewItem.objects.get(pk=second.pk).status == ReviewStatus.OPEN
