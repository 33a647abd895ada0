"""Bulk work on the dead-letter queue: a preview count, then a confirmation with a reason."""

import pytest

from dlq.models import DeadLetter, EntryStatus
from ledger.models import Task, TaskState
from tests.browser.conftest import login, status_message
from tests.factories import dead_letter

pytestmark = pytest.mark.browser


def test_a_bulk_discard_shows_the_count_and_needs_a_confirmation_and_a_reason(page, people, agent, shot):
    entries = [dead_letter(agent, f"bulk-{n}") for n in range(3)]
    login(page, "olga")
    page.goto("/dlq/")
    assert page.locator(".queue-row").count() == 3

    form = page.locator("#bulk-form")
    form.locator("select[name=op]").select_option("discard")
    with page.expect_navigation():
        form.get_by_role("button", name="Preview").click()
    assert page.locator("#bulk-count").inner_text().strip() == "3"
    assert DeadLetter.objects.filter(status=EntryStatus.OPEN).count() == 3  # a preview changes nothing
    shot(page, "bulk-confirm")

    # The browser refuses an empty reason (it is required) ...
    reason = page.locator("textarea[name=reason]")
    url = page.url
    page.locator("#bulk-confirm").click()
    assert reason.evaluate("el => el.validity.valueMissing") is True
    assert page.url == url
    # ... and so does the server, when a request gets past the browser without one.
    reason.evaluate("el => el.removeAttribute('required')")
    with page.expect_navigation():
        page.locator("#bulk-confirm").click()
    assert "reason is required" in status_message(page)
    assert DeadLetter.objects.filter(status=EntryStatus.OPEN).count() == 3

    page.locator("textarea[name=reason]").fill("duplicates of a refund already made by hand")
    with page.expect_navigation():
        page.locator("#bulk-confirm").click()
    assert "discard: 3 of 3" in status_message(page)

    for entry in entries:
        entry.refresh_from_db()
        assert entry.status == EntryStatus.DISCARDED and entry.decided_by == "user:olga"
        assert entry.note == "duplicates of a refund already made by hand"
    assert set(Task.objects.values_list("state", flat=True)) == {TaskState.CANCELLED}
