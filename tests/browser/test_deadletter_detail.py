"""A dead-letter entry's page: redrive puts the task back on its way, from its checkpoint."""

import pytest

from dlq.models import DeadLetter, EntryStatus
from ledger.models import Task
from ledger.tasks import task_request
from tests.browser.conftest import login, status_message
from tests.conftest import wait_until
from tests.factories import open_entry, sandbox, sandbox_order, start_refund_task

pytestmark = pytest.mark.browser


def task_state(api, task_id):
    return api.get(f"/api/v1/tasks/{task_id}").json()["state"]


def test_a_deadletter_redrive_from_the_page_completes_the_task(stack, page, people, agent, api, shot):
    # Every refund call answers 500 until the faults are cleared: three attempts, then the queue.
    sandbox_order(api, "ORD-DL1", "CUST-DL1")
    sandbox(api, "POST", "faults", json={"target": "ORD-DL1", "fault": "error_500", "times": 100})
    start_refund_task(api, "refund-dl1", order="ORD-DL1", customer="CUST-DL1")
    # One provider call per task attempt (the task keeps its three): the queue is reached in
    # about a third of the time, and the retries themselves are tested in tests/ledger. Still
    # nine calls, each verified after CONNECTOR_TIMEOUT: about 30 s alone, more beside a full
    # run (45 s was met once), so the wait allows 90.
    stack.start_worker(MAX_ATTEMPTS=1)
    wait_until(lambda: task_state(api, "refund-dl1") == "dead_lettered", seconds=90, interval=0.2,
               message="the task to be dead-lettered")
    entry = DeadLetter.objects.get(task__task_id="refund-dl1", status=EntryStatus.OPEN)
    assert sandbox(api, "DELETE", "faults").status_code < 300

    login(page, "olga")  # operators may work the dead-letter queue
    page.goto("/dlq/")
    with page.expect_navigation():
        page.locator(".queue-row", has_text="refund-dl1").locator("a.row-link").click()
    assert page.url.endswith(f"/dlq/{entry.pk}/")
    shot(page, "deadletter-detail")
    page.locator("#redrive-reason").fill("the provider is back")
    with page.expect_navigation():
        page.locator("#redrive-form").get_by_role("button", name="Redrive").click()
    assert "redrive done" in status_message(page)

    wait_until(lambda: task_state(api, "refund-dl1") == "succeeded", seconds=30, interval=0.2,
               message="the redriven task to succeed")
    entry.refresh_from_db()
    assert entry.status == EntryStatus.REDRIVEN and entry.decided_by == "user:olga"
    assert len(sandbox(api, "GET", "refunds", params={"order_id": "ORD-DL1"}).json()["data"]) == 1
    page.goto(f"/tasks/{Task.objects.get(task_id='refund-dl1').pk}/")
    assert page.locator("#task-state").inner_text().strip() == "succeeded"
    shot(page, "task-detail")


def test_the_checkpoint_lists_the_steps_in_the_order_they_run(page, people, agent):
    task, _ = task_request(agent=agent, task_id="refund-order", workflow="refund",
                           input={"order_id": "ORD-O1", "amount": "25.00", "currency": "EUR", "customer": "CUST-O1"})
    task.claim(owner="tests:runner")
    entry = open_entry(task.mark_dead_lettered(actor="system:tests", error={"code": "x", "message": "boom", "retryable": True}))
    login(page, "olga")
    page.goto(f"/dlq/{entry.pk}/")
    shown = [name.split(". ", 1)[1] for name in page.locator(".steps__name").all_inner_texts()]
    assert shown == list(task.steps.order_by("position").values_list("name", flat=True))
