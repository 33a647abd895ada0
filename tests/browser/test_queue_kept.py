"""The approvals queue as a person filtered it stays so: after their session ended during its
refresh and they signed in again, and after they rejected a row from it."""

import pytest

from approvals.models import ReviewStatus
from ledger.models import Action
from tests.browser.conftest import PASSWORD, login, request_refund, status_message
from tests.browser.decisions import open_item

pytestmark = pytest.mark.browser

QUEUE = "/approvals/?status=open&action_type=refund"


def test_signing_in_again_after_the_queues_refresh_found_the_session_ended_shows_the_queue_as_filtered(
        page, api, limit):
    request_refund(api, "refund:ORD-S1:full:dec-1", "ORD-S1", "600.00", "CUST-S1")
    login(page, "alice")
    page.goto(QUEUE)
    page.context.clear_cookies()  # the session ends
    with page.expect_navigation(url="**/accounts/login/**"):
        # The rows' refresh, as its every-15-seconds trigger sends it.
        page.evaluate("htmx.ajax('GET', location.pathname + location.search, "
                      "{target: '#queue-rows', swap: 'outerHTML'})")
    page.fill("#id_login", "alice")
    page.fill("#id_password", PASSWORD)
    with page.expect_navigation():
        page.locator("#id_password").press("Enter")
    assert page.url.endswith(QUEUE)
    assert page.locator("#f-action-type").input_value() == "refund"


def test_a_row_rejected_from_the_filtered_queue_returns_to_it_filtered(page, api, limit):
    request_refund(api, "refund:ORD-S2:full:dec-2", "ORD-S2", "600.00", "CUST-S2")
    item = open_item(Action.objects.get(operation_key="refund:ORD-S2:full:dec-2"))
    login(page, "alice")
    page.goto(QUEUE)
    row = page.locator(f'.queue-row[data-id="{item.pk}"]')
    row.locator("summary", has_text="Reject").click()
    row.locator("input[name=reason]").fill("a duplicate of ORD-S1")
    with page.expect_navigation():
        row.get_by_role("button", name="Reject", exact=True).click()
    assert page.url.endswith(QUEUE)
    assert "rejected" in status_message(page)
    item.refresh_from_db()
    assert item.status == ReviewStatus.REJECTED
    assert not page.console_errors
