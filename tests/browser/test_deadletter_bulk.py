"""Bulk work on the dead-letter queue: a redrive's dry run, its run and its report; a discard's
preview count, then a confirmation with a reason."""

import pytest

from dlq.models import BulkRedrive, DeadLetter, EntryStatus
from ledger.models import Task, TaskState
from tests.browser.conftest import login, status_message
from tests.factories import dead_letter, failed_task_entry, sandbox_order, settled

pytestmark = pytest.mark.browser


def test_a_bulk_redrive_lists_its_dry_run_then_runs_and_leaves_a_report(page, people, agent, api, stack, shot):
    entries = []
    for n in range(3):
        sandbox_order(api, f"ORD-BULK-{n}", f"CUST-BULK-{n}")
        entries.append(dead_letter(agent, f"bulk-{n}", order=f"ORD-BULK-{n}", customer=f"CUST-BULK-{n}",
                                   done={"lookup_order": {"order_id": f"ORD-BULK-{n}"}}))
    final = failed_task_entry(agent, "bulk-final")
    stack.start_worker()
    stack.start_worker()
    login(page, "olga")
    page.goto("/dlq/")

    form = page.locator("#bulk-form")
    form.locator("select[name=op]").select_option("redrive")
    with page.expect_navigation():
        form.get_by_role("button", name="Preview").click()
    # The dry run: every entry, and what it would do; nothing has moved.
    rows = page.locator(".run-item")
    assert rows.count() == 4
    for entry in entries:
        row = page.locator(f'.run-item[data-entry="{entry.pk}"]')
        assert "resumes at step 2, call_refund_api" in row.inner_text()
    assert "a failed task is final" in page.locator(f'.run-item[data-entry="{final.pk}"]').inner_text()
    assert page.locator("#start-run").inner_text().strip() == "Redrive 3 entries"
    assert DeadLetter.objects.filter(status=EntryStatus.OPEN).count() == 4
    shot(page, "dry-run")

    # Too fast for the connectors: a clear error, nothing started.
    page.fill("#id_rate", "600")
    page.fill("#id_reason", "the provider is back")
    with page.expect_navigation():
        page.locator("#start-run").click()
    assert "At most 60.00 entries per minute" in page.locator("#start-form").inner_text()
    assert BulkRedrive.objects.get().status == "planned"
    shot(page, "rate-refused")

    page.fill("#id_rate", "60")
    with page.expect_navigation():
        page.locator("#start-run").click()
    assert "started at 60" in status_message(page)
    # The page follows the run and shows its report once it ends.
    page.locator("#run-status", has_text="finished").wait_for(timeout=30_000)
    counts = page.locator("#run-counts")
    assert counts.locator('[data-outcome="redriven"]').inner_text() == "3"
    assert counts.locator('[data-outcome="skipped"]').inner_text() == "1"
    assert page.locator("#run-by").inner_text() == "olga" and page.locator("#run-reason").inner_text() == \
        "the provider is back"
    shot(page, "report")

    for entry in entries:
        assert settled(entry.task, seconds=60).state == TaskState.SUCCEEDED
    # The report stays, linked from the queue.
    page.goto("/dlq/")
    with page.expect_navigation():
        page.locator("#bulk-redrives-link").click()
    with page.expect_navigation():
        page.locator("#redrive-runs .row-link").first.click()
    assert page.locator(".run-item").count() == 4
    assert page.console_errors == []


def test_a_bulk_discard_lists_the_entries_and_needs_a_confirmation_and_a_reason(page, people, agent, shot):
    entries = [dead_letter(agent, f"bulk-{n}") for n in range(3)]
    login(page, "olga")
    page.goto("/dlq/")
    assert page.locator(".queue-row").count() == 3

    form = page.locator("#bulk-form")
    form.locator("select[name=op]").select_option("discard")
    with page.expect_navigation():
        form.get_by_role("button", name="Preview").click()
    assert page.locator("#bulk-count").inner_text().strip() == "3"
    listed = page.locator("#bulk-entries tbody tr").all_inner_texts()  # what goes, not only how many
    assert [line.split()[0] for line in listed] == [f"#{entry.pk}" for entry in entries]
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
