"""The pages fit their screen: at 1440x900 the policies page and the analytics' overdue table
are not cut; on a 390 px phone no page scrolls sideways (a table scrolls inside its own box),
an item's Decision panel comes near the top, and the overview's overdue bar leaves a card's
text uncovered."""

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from approvals.models import Limit, ReviewItem
from tests.browser.conftest import PASSWORD
from tests.browser.test_every_page import demo_ledger
from tests.browser.test_queue_layout import PHONE, WIDE, at

pytestmark = pytest.mark.browser

PHONE_PAGES = ["/dlq/", "/dlq/{entry}/", "/incidents/", "/ledger/", "/policies/", "/delegations/", "/agents/", "/audit/", "/"]


def cut(page):
    """How far the page reaches past the window's right edge (0 if it fits), and the elements
    that do so outside a table's own scrolling box."""
    return page.evaluate("""() => ({
        overflow: document.documentElement.scrollWidth - window.innerWidth,
        past: [...document.querySelectorAll('body *')].filter(e => e.checkVisibility()
                  && !e.closest('.visually-hidden, .table-wrap') && e.getBoundingClientRect().right > innerWidth + 1)
              .map(e => `${e.tagName.toLowerCase()}#${e.id}.${[...e.classList].join('.')}`).slice(0, 5),
    })""")


def test_policies_and_the_analytics_fit_1440_px(pages, agent, limit, shot):
    demo_ledger(agent)
    Limit.limit_set(actor="system:tests", reason="every column filled", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("1000.00"),
                    daily_customer_total=Decimal("5000.00"), approval_expires_after_hours=24,
                    first_tier="approvals-oncall@surety.example", next_tier="finance-leads@surety.example",
                    escalate_after_hours=2)
    get_user_model().objects.create_superuser("root", password=PASSWORD)  # the Edit column too
    page = at(pages, WIDE, "root")
    for path, name in (("/policies/", "policies"), ("/analytics/", "analytics")):
        page.goto(path)
        assert cut(page) == {"overflow": 0, "past": []}, path
        for wrap in page.locator(".table-wrap").all():  # nor cut inside a table's box
            assert wrap.evaluate("w => w.scrollWidth <= w.clientWidth + 1"), (path, wrap.inner_html()[:200])
        shot(page, f"{name}-1440")


def test_no_page_scrolls_sideways_on_a_phone(pages, agent, limit, shot):
    demo = demo_ledger(agent)
    get_user_model().objects.create_superuser("root", password=PASSWORD)  # every form and button
    for username in ("aldo", "olga", "root"):
        page = at(pages, PHONE, username)
        for path in PHONE_PAGES:
            page.goto(path.format(entry=demo["entry"].pk))
            assert cut(page) == {"overflow": 0, "past": []}, (username, path)
    shot(page, "overview-phone")


def test_the_decision_panel_comes_near_the_top_on_a_phone(pages, agent, limit, shot):
    demo = demo_ledger(agent)
    page = at(pages, PHONE)
    for item in ("approval", "held", "unknown"):
        page.goto(f"/review/{demo[item].pk}/")
        top = page.locator("#decision-title").bounding_box()["y"]
        assert top < PHONE["height"], (item, top)  # on the first screen, not two screens down
    shot(page, "review-phone-decision")


def test_the_overdue_bar_leaves_a_cards_first_letters_uncovered(pages, agent, limit, shot):
    demo = demo_ledger(agent)
    ReviewItem.objects.filter(pk=demo["approval"].pk).update(deadline=timezone.now())  # overdue now
    for viewport in (WIDE, PHONE):
        page = at(pages, viewport)
        page.goto("/approvals/")
        first_cell = page.locator(f'.queue-row.is-overdue[data-id="{demo["approval"].pk}"] td').first
        bar, gap = first_cell.evaluate("""td => {
            const range = document.createRange(); range.selectNodeContents(td);
            const text = [...range.getClientRects()].find(r => r.width > 0);
            const width = (getComputedStyle(td).boxShadow.match(/(\\d+)px 0px 0px(?: 0px)? inset/) || [0, 0])[1];
            const card = parseFloat(getComputedStyle(td.parentElement).borderLeftWidth);
            return [Number(width) || card, Number(width) ? text.left - td.getBoundingClientRect().left : 99];
        }""")
        assert bar >= 3 and gap >= bar + 2, (viewport, bar, gap)  # a bar, and the text starts clear of it
        shot(page, f"approvals-overdue-{viewport['width']}")
