"""The overview: its counts follow the ledger live (htmx polls every 3 s), without a reload."""

import pytest

from tests.browser.conftest import login, request_refund

pytestmark = pytest.mark.browser


def count_of(page, status):
    return int(page.locator(f"#live-counts [data-status={status}] .count").inner_text().strip())


def test_live_counts_update_without_a_reload(page, people, api, shot):
    login(page, "alice")
    page.goto("/")
    assert count_of(page, "queued") == 0
    url = page.url
    loads = []
    page.on("load", lambda _: loads.append(page.url))
    # A marker in the page's own JavaScript world disappears with any navigation or reload.
    page.evaluate("window.__stillTheSamePage = true")

    # No worker runs: the two refunds stay queued (different orders and customers, so not held).
    request_refund(api, "refund:ORD-LIVE1:full:dec-1", "ORD-LIVE1", "20.00", "CUST-LIVE1")
    request_refund(api, "refund:ORD-LIVE2:full:dec-2", "ORD-LIVE2", "30.00", "CUST-LIVE2")

    page.wait_for_function(
        "() => document.querySelector('#live-counts [data-status=queued] .count').textContent.trim() === '2'",
        timeout=10_000,
    )
    assert page.url == url
    assert loads == []
    assert page.evaluate("window.__stillTheSamePage") is True
    shot(page, "overview")
