"""Decision analytics in a browser: an auditor opens it from the navigation; its charts are SVG
drawn by the server, which the CSP lets through without a script or an inline style."""

import pytest

from tests.approvals.test_analytics import plant
from tests.browser.conftest import login

pytestmark = pytest.mark.browser


def test_an_auditor_reads_the_decision_analytics(page, people, shot):
    plant(people["alice"], people["bob"])
    login(page, "aldo")
    with page.expect_navigation():
        page.get_by_role("link", name="Analytics").click()
    assert page.locator("h1").inner_text() == "Decision analytics"
    assert page.locator("#decided-count").inner_text() == "7"
    bars = page.locator("#chart-decisions rect")
    assert bars.count() >= 2 and bars.first.bounding_box()["height"] > 0  # drawn, not only written
    assert page.locator("#chart-median circle").count() >= 2
    queue = page.locator("#times-per-queue tbody tr").first.inner_text()
    assert queue.split("\t")[:4] == ["approval", "4", "2.5 h", "3.7 h"]
    assert "40 %" in page.locator("#overdue-per-queue").inner_text()
    assert page.locator("#times-per-approver").inner_text().count("alice") == 1
    assert page.locator("#rates-per-agent tbody tr").count() == 2
    assert not page.console_errors, page.console_errors  # the CSP refused nothing
    shot(page, "analytics")
