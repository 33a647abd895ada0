"""Held groups: the item says when what held it has settled, the overview's card opens the held
items, and "Next item" follows the queue's order, equal deadlines included."""

import pytest

from approvals.models import ReviewKind
from ledger.models import ActionStatus
from tests.browser.conftest import login
from tests.browser.decisions import open_item, refund, same_deadline

pytestmark = pytest.mark.browser


def held_behind(agent, n):
    """Two refunds for one order: the first claimed by a worker (its call may be under way),
    the second held behind it."""
    first = refund(agent, n, "20.00", order=f"ORD-H{n}", customer=f"CUST-H{n}")
    first.claim(owner="tests:executor")
    second = refund(agent, n + 100, "30.00", order=f"ORD-H{n}", customer=f"CUST-H{n}")
    assert (first.status, second.status) == (ActionStatus.PENDING, ActionStatus.HELD)
    return first, open_item(second)


def test_a_held_item_says_its_sibling_settled_once_it_has(page, people, agent):
    first, item = held_behind(agent, 1)
    login(page, "alice")
    page.goto(f"/review/{item.pk}/")
    assert first.operation_key in page.locator("#why").inner_text()
    assert "pending" in page.locator("#why").inner_text()

    first.mark_succeeded(actor="system:executor", claim=first.fence, external_ref="re_h1")
    page.reload()
    # Released by the ledger once nothing else was in flight (or, if a person must still
    # decide, told that what held it has settled): never "in flight" as if it still were.
    why = page.locator("#why").inner_text()
    assert why.startswith("No longer held: the action is queued") or why.startswith("Nothing is in flight"), why


def test_the_held_groups_card_opens_only_held_items(page, people, agent, limit):
    _, held = held_behind(agent, 2)
    over = open_item(refund(agent, 3, "900.00"))
    assert (held.kind, over.kind) == (ReviewKind.HELD, ReviewKind.APPROVAL)
    login(page, "alice")
    page.goto("/")
    with page.expect_navigation():
        page.locator('.queue-card[data-queue="held"]').click()
    shown = page.locator(".queue-row").evaluate_all("rows => rows.map(r => r.dataset.id)")
    assert shown == [str(held.pk)]
    page.goto("/")
    with page.expect_navigation():
        page.locator('.queue-card[data-queue="approval"]').click()
    assert page.locator(".queue-row").evaluate_all("rows => rows.map(r => r.dataset.id)") == [str(over.pk)]


def test_next_item_does_not_skip_items_with_the_same_deadline(page, people, agent, limit):
    items = [open_item(refund(agent, 10 + n, "700.00")) for n in range(3)]
    same_deadline(*items)
    login(page, "alice")
    page.goto(f"/review/{items[0].pk}/")
    for following in items[1:]:
        with page.expect_navigation():
            page.locator("#next-item").click()
        assert page.url.endswith(f"/review/{following.pk}/")
    assert page.locator("#next-item").count() == 0
