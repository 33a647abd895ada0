"""The queues fit a 1440 px screen with the deadline and status in view, become cards on a
phone, and an item's nested evidence and long values stay readable at a phone's width."""

import pytest

from tests.browser.conftest import login
from tests.browser.decisions import needs_review_not_found, open_item, refund

pytestmark = pytest.mark.browser

WIDE = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
LONG_URL = "https://provider.example/v1/refunds/lookup?operation_key=" + "refund%3AORD-" + "9" * 120
ANSWER = {"status": 504, "body": {"error": {"message": "x" * 200}}}
NESTED = {"lookup": "by operation key",
          "request": {"url": LONG_URL, "headers": {"accept": "application/json"}, "answer": ANSWER}}


def at(pages, viewport, username="alice"):
    page = pages.new()
    page.set_viewport_size(viewport)
    return login(page, username)


def sideways(page):
    """What reaches past the window's right edge, or scrolls sideways in a table: [] if nothing."""
    return page.evaluate("""() => [
        ...[...document.querySelectorAll('.table-wrap')].filter(w => w.scrollWidth > w.clientWidth)
            .map(w => `table-wrap scrolls ${w.scrollWidth - w.clientWidth}px`),
        ...[...document.querySelectorAll('body *')].filter(e => e.checkVisibility() && !e.closest('.visually-hidden')
                                                             && e.getBoundingClientRect().right > window.innerWidth + 1)
            .map(e => `${e.tagName.toLowerCase()}.${[...e.classList].join('.')}`
                      + ` right=${e.getBoundingClientRect().right}`),
    ]""")


@pytest.mark.parametrize("path", ["/approvals/", "/unknown/"])
def test_a_queue_fits_1440_px_with_its_deadline_and_status_first(pages, agent, limit, shot, path):
    for n in range(3):
        action = refund(agent, n, "12345.67", order=f"ORD-{'L' * 40}{n}", customer=f"CUST-{'W' * 30}{n}")
        if path == "/unknown/":
            action.approve(actor="system:tests")
            needs_review_not_found(action)
    page = at(pages, WIDE)
    page.goto(path)
    assert page.locator(".queue-row").count() == 3
    headers = page.locator(".table--queue thead th").all_inner_texts()
    assert [h.strip().lower() for h in headers[:2]] == ["deadline", "status"]
    assert sideways(page) == []
    for header in page.locator(".table--queue thead th").all()[:2]:
        box = header.bounding_box()
        assert box["x"] + box["width"] <= WIDE["width"]
    if path == "/approvals/":  # a row's "Reject…" opened floats over the row, the table keeps its width
        page.locator(".queue-row .row-reject > summary").first.click()
        assert page.locator(".queue-row input[name=reason]").first.is_visible()
        assert sideways(page) == []
        shot(page, "queue-1440-reject-open")
    shot(page, f"queue-1440{path.replace('/', '-')}")


def test_a_queue_is_cards_on_a_phone(pages, agent, limit, shot):
    for n in range(2):
        refund(agent, n, "700.00")
    page = at(pages, PHONE)
    page.goto("/approvals/")
    assert not page.locator(".table--queue thead").is_visible()
    card = page.locator(".queue-row").first.bounding_box()
    assert card["width"] >= PHONE["width"] * 0.8
    assert sideways(page) == []
    shot(page, "queue-phone")


def test_nested_evidence_and_long_urls_stay_readable_on_a_phone(pages, agent, shot):
    action = refund(agent, 7, "40.00", order="ORD-" + "7" * 80)
    action.claim(owner="tests:executor")
    action.mark_unknown(actor="system:executor", claim=action.fence, verify_at=action.created_at, evidence=NESTED)
    action.mark_needs_review(actor="system:verifier", evidence={"verification": NESTED, "found": None})
    item = open_item(action)
    page = at(pages, PHONE)
    page.goto(f"/review/{item.pk}/")
    assert sideways(page) == []
    # Every value of the nested evidence keeps a readable column (it collapsed to one character).
    widths = page.locator(".evidence .data dd").evaluate_all("dds => dds.map(d => d.getBoundingClientRect().width)")
    assert widths and min(widths) >= 120, widths
    shot(page, "review-phone")
