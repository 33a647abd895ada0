"""The approvals queue refreshes its rows every 15 seconds. A person working it with the keyboard
(Tab, not j/k) stays where they were: on the row's link, or on its "Reject…", after each refresh,
and that row is the one selected, where j/k go on from. Their focus was dropped to the page's start
(and a screen reader's reading with it), and the selection left on a row clicked before."""

import pytest

from ledger.models import Action
from tests.browser.conftest import login, request_refund
from tests.browser.decisions import open_item

pytestmark = pytest.mark.browser

# The row holding the keyboard's focus, the element that has it, and the row selected (j/k go on from it).
FOCUSED = ("[document.activeElement.closest('.queue-row')?.dataset.id, document.activeElement.tagName, "
           "document.querySelector('.queue-row[aria-selected=true]')?.dataset.id]")


def refreshed(page):
    """The rows' refresh, as its every-15-seconds trigger sends it, swapped in."""
    page.evaluate("document.getElementById('queue-rows').dataset.before = 'yes'")
    page.evaluate("htmx.ajax('GET', location.pathname + location.search, {target: '#queue-rows', swap: 'outerHTML'})")
    page.wait_for_function("document.getElementById('queue-rows') && !document.getElementById('queue-rows').dataset.before")
    page.wait_for_timeout(100)  # htmx settles the swap


def test_the_queues_refresh_keeps_the_keyboard_focus_where_it_was(page, api, limit):
    for n, amount in ((1, "600.00"), (2, "700.00")):
        request_refund(api, f"refund:ORD-F{n}:full:dec-{n}", f"ORD-F{n}", amount, f"CUST-F{n}")
    first, second = (str(open_item(Action.objects.get(operation_key=f"refund:ORD-F{n}:full:dec-{n}")).pk)
                     for n in (1, 2))
    login(page, "alice")
    page.goto("/approvals/")
    page.locator(f'.queue-row[data-id="{second}"] td[data-label="Status"]').click()  # selects the row

    page.locator(f'.queue-row[data-id="{second}"] a.row-link').focus()
    page.keyboard.press("Shift+Tab")  # a keyboard user's way back up the list: the row above's Reject…
    assert page.evaluate(FOCUSED) == [first, "SUMMARY", first]
    refreshed(page)
    assert page.evaluate(FOCUSED) == [first, "SUMMARY", first]

    page.keyboard.press("Tab")
    assert page.evaluate(FOCUSED) == [second, "A", second]
    refreshed(page)
    assert page.evaluate(FOCUSED) == [second, "A", second]
    page.keyboard.press("k")
    assert page.evaluate(FOCUSED) == [first, "A", first]
    assert not page.console_errors
