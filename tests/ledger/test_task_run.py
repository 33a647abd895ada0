"""Tasks run by real workers: resume from the checkpoint, capped retries, the dead-letter queue."""

import pytest

from dlq.models import DeadLetter
from ledger.models import Task
from tests.conftest import wait_until
from tests.factories import agent_api, audit_events, post_task, refund_task_body, sandbox, sandbox_order


def settled_task(client, task_id, seconds=30):
    return wait_until(
        lambda: (t := client.get(f"/api/v1/tasks/{task_id}").json())["state"] not in {"queued", "running"} and t,
        seconds=seconds, message=f"task {task_id} to settle",
    )


@pytest.fixture
def client(stack):
    return agent_api(stack.url, grants=("refund", "send_message"))


def test_a_refund_task_runs_every_step_once(stack, client):
    sandbox_order(client, "ORD-8841", "CUST-17")
    created = post_task(client, "refund-8841", refund_task_body())
    assert created.status_code == 201
    assert list(created.json()["steps"]) == ["lookup_order", "call_refund_api", "write_confirmation", "notify_customer"]
    stack.start_worker()
    task = settled_task(client, "refund-8841")
    assert task["state"] == "succeeded"
    assert {name: step["status"] for name, step in task["steps"].items()} == dict.fromkeys(task["steps"], "done")
    assert task["steps"]["call_refund_api"]["idempotency_key"] == "refund-8841:call_refund_api:v1"
    assert len(sandbox(client, "GET", "refunds", params={"order_id": "ORD-8841"}).json()["data"]) == 1
    assert len(sandbox(client, "GET", "messages", params={"operation_key": "refund-8841:notify_customer:v1"}).json()["data"]) == 1


def test_an_unknown_order_fails_at_once_without_retrying(stack, client):
    post_task(client, "refund-404", refund_task_body(order="ORD-NOPE"))
    stack.start_worker()
    task = settled_task(client, "refund-404")
    assert task["state"] == "failed"
    assert task["attempts"] == 1
    assert task["last_error"]["code"] == "unknown_order"


def test_an_order_id_is_looked_up_as_the_order_refunded(stack, client):
    """ORD-8841 exists, "ORD-8841#x" does not: sent as it was written, the look-up asked for the
    first (a URL's fragment is not sent) and the refund went to the second."""
    sandbox_order(client, "ORD-8841", "CUST-17")
    post_task(client, "refund-hash", refund_task_body(order="ORD-8841#x"))
    stack.start_worker()
    task = settled_task(client, "refund-hash")
    assert (task["state"], task["last_error"]["code"]) == ("failed", "unknown_order")
    assert sandbox(client, "GET", "refunds", params={"order_id": "ORD-8841#x"}).json()["data"] == []


def test_a_declined_refund_fails_the_task_without_retrying(stack, client):
    sandbox_order(client, "ORD-9", "CUST-17")
    sandbox(client, "POST", "faults", json={"target": "ORD-9", "fault": "decline", "times": 1})
    post_task(client, "refund-9", refund_task_body(order="ORD-9"))
    stack.start_worker()
    task = settled_task(client, "refund-9")
    assert task["state"] == "failed" and task["attempts"] == 1
    assert task["steps"]["lookup_order"]["status"] == "done"
    assert task["steps"]["call_refund_api"]["status"] == "failed"


def test_three_failures_in_a_row_dead_letter_the_task_with_an_alert(stack, client):
    # Every refund call answers 500: verified absent each time, so each task attempt ends
    # with a retryable failure, and the third one lands in the dead-letter queue.
    sandbox_order(client, "ORD-500", "CUST-17")
    sandbox(client, "POST", "faults", json={"target": "ORD-500", "fault": "error_500", "times": 100})
    post_task(client, "refund-500", refund_task_body(order="ORD-500"))
    stack.start_worker()
    task = settled_task(client, "refund-500", seconds=120)  # 25 s alone, 55 s in a loaded full run
    assert task["state"] == "dead_lettered", task
    assert task["attempts"] == 3
    entry = DeadLetter.objects.get(task__task_id="refund-500")
    assert entry.status == "open" and entry.attempts == 3
    assert entry.snapshot["steps"]["lookup_order"]["status"] == "done"
    alert = entry.alerts.get()
    wait_until(lambda: alert.deliveries.filter(ok=True).exists(), message="the alert's delivery")
    assert audit_events(entry, "dead_letter_opened").exists()
    retries = list(audit_events(Task.objects.get(), "retry_scheduled"))
    assert len(retries) == 2
