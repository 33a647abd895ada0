"""After a decision the page goes on to the next item of the queue the person came from: a
held item's next is held, never an approval that falls between them by deadline; the mixed
approvals list goes on in its own order; an unknown outcome's next is an unknown outcome."""

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ReviewItem
from tests.browser.conftest import login, status_message
from tests.browser.decisions import needs_review_not_found, open_item, refund
from tests.browser.test_held_groups import held_behind

pytestmark = pytest.mark.browser


def in_order(*items):
    """Deadlines one minute apart, in the order given."""
    start = timezone.now() + timedelta(hours=1)
    for n, item in enumerate(items):
        ReviewItem.objects.filter(pk=item.pk).update(deadline=start + timedelta(minutes=n))


def opened_from(page, queue_path, first, second):
    """As alice, the queue's row of `first` opened; its Next item is `second`."""
    login(page, "alice")
    page.goto(queue_path)
    with page.expect_navigation():
        page.locator(f'.queue-row[data-id="{first.pk}"] .row-link').click()
    assert page.locator("#next-item").get_attribute("href").startswith(f"/review/{second.pk}/")


def decide(page, button):
    page.locator("#reason").fill("checked")
    with page.expect_navigation():
        page.locator(button).click()


def test_a_held_items_next_item_is_held_not_an_approval_between_them(page, people, agent, limit):
    _, first = held_behind(agent, 1)
    approval = open_item(refund(agent, 50, "900.00"))
    _, second = held_behind(agent, 2)
    in_order(first, approval, second)
    opened_from(page, "/approvals/?kind=held", first, second)
    decide(page, "#release-button")
    assert page.url.split("?")[0].endswith(f"/review/{second.pk}/")
    assert first.action.operation_key in status_message(page)

    # The whole approvals list, opened as such, goes on in its own order, approvals included.
    page.goto(f"/review/{second.pk}/?queue=approvals")
    assert page.locator("#next-item").count() == 0
    page.goto(f"/review/{approval.pk}/?queue=approvals")
    assert page.locator("#next-item").get_attribute("href").startswith(f"/review/{second.pk}/")


def test_an_unknown_outcomes_next_item_is_the_next_unknown_outcome(page, people, agent, limit):
    first = needs_review_not_found(refund(agent, 60, "40.00"))
    approval = open_item(refund(agent, 61, "900.00"))
    second = needs_review_not_found(refund(agent, 62, "40.00"))
    in_order(first, approval, second)
    opened_from(page, "/unknown/", first, second)
    page.locator("#mark-failed summary").click()
    page.locator("#confirm-absent").check()
    decide(page, "#mark-failed-button")
    assert page.url.split("?")[0].endswith(f"/review/{second.pk}/")
