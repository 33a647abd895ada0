"""What a decision needs at hand on the item's page: the agent's reason, the customer's total
today, labels in words, and times that name their zone."""

from decimal import Decimal

import pytest

from approvals.models import Limit
from tests.browser.conftest import login
from tests.browser.decisions import open_item, refund

pytestmark = pytest.mark.browser


def test_the_item_shows_the_agents_reason_and_the_customers_total_today(page, people, agent):
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"),
                    daily_customer_total=Decimal("1000.00"))
    for n, amount in ((1, "300.00"), (2, "450.00")):  # settled earlier today
        earlier = refund(agent, n, amount, customer="CUST-CTX")
        earlier.claim(owner="tests:executor")
        earlier.mark_succeeded(actor="system:executor", claim=earlier.fence, external_ref=f"re_ctx{n}")
    item = open_item(refund(agent, 3, "400.00", customer="CUST-CTX", reason="charged twice for order 3"))
    login(page, "alice")
    page.goto(f"/review/{item.pk}/")
    assert "charged twice for order 3" in page.locator("#rationale").inner_text()
    today = page.locator("#customer-today").inner_text()
    assert "1150.00 EUR" in today and "1000.00 a day" in today
    assert page.locator("#action-status").inner_text().strip() == "awaiting approval"
    assert page.locator("time.reltime").first.get_attribute("title").endswith("UTC")
    # Read out after the relative time too: a screen reader, a keyboard or a touch reaches no tooltip.
    exact = page.locator("time.reltime + .visually-hidden").first.text_content().strip()
    assert exact.startswith("(20") and exact.endswith(" UTC)"), exact


def test_the_filters_name_their_time_zone(page, people):
    login(page, "aldo")
    page.goto("/audit/")
    assert "(UTC)" in page.locator("label[for=f-since]").inner_text()
    page.goto("/ledger/")
    assert "(UTC)" in page.locator("label[for=f-until]").inner_text()
