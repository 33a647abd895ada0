"""Two approvals: the first approver is done, and is told so; the agent's owner is told why
they may not decide (they did not request it: their agent did)."""

import pytest

from approvals.decisions import review_decide
from approvals.models import ReviewStatus
from tests.browser.conftest import login, status_message
from tests.browser.decisions import dual_limit, open_item, refund

pytestmark = pytest.mark.browser


def waiting_for_me(page, kind):
    page.goto("/")
    return int(page.locator(f'.queue-card[data-queue="{kind}"] .mine strong').inner_text())


def test_the_first_of_two_approvers_sees_no_approve_and_nothing_waiting_for_them(pages, agent, people):
    dual_limit()
    item = open_item(refund(agent, 1, "1500.00"))
    assert item.approvals_needed == 2

    alice = login(pages.new(), "alice")
    assert waiting_for_me(alice, "approval") == 1
    alice.goto(f"/review/{item.pk}/")
    alice.locator("#reason").fill("checked the order")
    with alice.expect_navigation():
        alice.locator("#approve-button").click()
    assert "a second approver is needed" in status_message(alice)
    assert alice.url.endswith(f"/review/{item.pk}/")
    assert alice.locator("#approved-by-me").is_visible()
    assert alice.locator("#approve-button").count() == 0
    assert waiting_for_me(alice, "approval") == 0

    bob = login(pages.new(), "bob")
    assert waiting_for_me(bob, "approval") == 1
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN and item.approvals.count() == 1


def test_a_key_press_approving_above_the_two_approver_threshold_asks_first(page, agent, people):
    dual_limit()
    item = open_item(refund(agent, 2, "1500.00"))
    login(page, "alice")
    page.goto(f"/review/{item.pk}/")
    asked = []

    def dismiss(dialog):
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.keyboard.press("a")
    page.wait_for_timeout(300)
    assert asked and "two-approver threshold" in asked[0] and "1500.00 EUR" in asked[0]
    assert item.approvals.count() == 0  # dismissed: nothing recorded
    assert page.evaluate("document.activeElement.id") == "reason"  # the reason field waits instead

    page.keyboard.press("Escape")
    page.once("dialog", lambda dialog: dialog.accept("checked the order"))
    with page.expect_navigation():
        page.keyboard.press("a")
    assert item.approvals.get().reason == "checked the order"


def test_the_agents_owner_is_told_they_are_responsible_for_the_agent_not_that_they_requested_it(page, agent):
    dual_limit()
    item = open_item(refund(agent, 3, "1500.00"))
    login(page, "olga")
    page.goto(f"/review/{item.pk}/")
    note = page.locator("#four-eyes").inner_text()
    assert "You requested this" not in note
    assert "responsible for billing-bot" in note


def test_the_second_approver_is_asked_naming_who_approved_first_and_that_theirs_is_the_second(page, agent, people):
    dual_limit()
    item = open_item(refund(agent, 4, "1500.00"))
    review_decide(item, user=people["alice"], decision="approve", reason="checked the order")
    login(page, "bob")
    page.goto(f"/review/{item.pk}/")

    asked = page.locator("#approve-button").get_attribute("data-confirm")
    assert "alice approved first" in asked and "a second, different person" in asked
    assert "someone else must approve too" not in asked
