"""An unknown outcome: "Verify again" says what it does and then what the provider said; an
item the provider did confirm says it waits for the limit, and takes its reference in one click."""

import pytest

from approvals.models import ReviewStatus
from ledger.models import Action, ActionStatus
from tests.browser.conftest import login, status_message
from tests.browser.decisions import effect_at_provider, needs_review_not_found, open_item, refund, unknown, verify

pytestmark = pytest.mark.browser


def test_verify_again_is_not_reported_resolved_and_the_page_shows_what_the_provider_said(
        stack, page, people, agent, api):
    action = refund(agent, 1, "40.00")
    item = needs_review_not_found(action)
    reference = effect_at_provider(api, action)  # the lost call had gone through after all
    stack.start_worker()

    login(page, "alice")
    page.goto(f"/review/{item.pk}/")
    with page.expect_navigation():
        page.locator("#verify-button").click()
    told = status_message(page)
    assert "resolved" not in told and "verify" in told
    assert page.locator("#decided").inner_text().startswith("Sent back to verify")

    # The note polls until the executor has asked the provider, then says what it found.
    page.wait_for_selector("#verified-status", timeout=20_000)
    assert page.locator("#verified-status").inner_text().strip() == "succeeded"
    assert "verified at the provider" in page.locator("#verification").inner_text()
    assert Action.objects.get(pk=action.pk).external_ref == reference


def test_a_confirmed_effect_over_the_limit_says_so_and_takes_the_reported_reference_in_one_click(
        page, people, agent, api, limit):
    action = refund(agent, 2, "600.00")  # over the limit of 500.00: approved, then the call was lost
    action.approve(actor="system:tests")
    unknown(Action.objects.get(pk=action.pk))
    reference = effect_at_provider(api, action)
    action = verify(action)
    assert action.status == ActionStatus.NEEDS_REVIEW  # found, but over its limit
    item = open_item(action)

    login(page, "alice")
    page.goto(f"/review/{item.pk}/")
    why = page.locator("#why").inner_text()
    assert "outcome unproven" not in why
    assert "verified, but 600.00 EUR is above the limit of 500.00" in why
    assert page.locator(".evidence__head .badge", has_text="found at the provider").count() == 1

    button = page.locator("#use-reference-1")
    assert reference in button.inner_text()
    with page.expect_navigation():
        button.click()
    action.refresh_from_db()
    assert (action.status, action.external_ref) == (ActionStatus.SUCCEEDED, reference)
    assert not action.review_items.filter(status=ReviewStatus.OPEN).exists()
    assert f"{action.operation_key}: marked succeeded" in status_message(page)
