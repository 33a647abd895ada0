"""Tasks run by real workers: resume from the checkpoint, capped retries, the dead-letter queue."""

from decimal import Decimal

import pytest

from approvals.decisions import review_edit
from approvals.models import Limit, ReviewItem
from dlq.models import DeadLetter
from ledger.actions import action_request
from ledger.api.serializers import ActionRequestSerializer
from ledger.models import Action, ActionType, Confirmation, Task, TaskState
from ledger.recipients import TARGET_LENGTH, email_recipient
from ledger.runner import drain_tasks
from ledger.tasks import task_request
from ledger.workflows.refund import CUSTOMERS_AT, RefundInput, default_recipient
from tests.conftest import wait_until
from tests.factories import (agent_api, audit_events, message_body, person, post_task, refund_input,
                             refund_task_body, sandbox, sandbox_list, sandbox_order)


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


def test_a_customer_whose_lower_case_would_not_fit_the_confirmation_is_refused_before_anything_runs():
    """Without `notify` the confirmation goes to <customer in lower case>@customers.surety.example:
    "İ" is one character and its lower case two, so a customer of 230 of them passed the length
    check and its message's target (485 characters) failed the last step, after the refund, on
    every retry, until the task was dead-lettered."""
    customer = "İ" * (TARGET_LENGTH - len(CUSTOMERS_AT))
    refused = RefundInput(data=refund_input("ORD-1", customer))
    assert not refused.is_valid()
    assert "customer" in refused.errors
    assert RefundInput(data=refund_input("ORD-1", "i" * (TARGET_LENGTH - len(CUSTOMERS_AT)))).is_valid()


def test_a_refund_edited_down_is_confirmed_and_told_to_the_customer_at_the_amount_refunded(stack, client, settings):
    """A person edits the task's over-limit refund of 900.00 down to 400.00: the provider refunds
    400.00, and the confirmation and the customer's message say 400.00, not the 900.00 the task
    asked for. (Drained here, against the sandbox provider the stack serves.)"""
    settings.DRAIN_LANES = 1
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    sandbox_order(client, "ORD-E", "C-E", amount="1000.00")
    task, _ = task_request(agent=client.agent, task_id="refund-edited", workflow="refund",
                           input=refund_input("ORD-E", "C-E", amount="900.00"))
    drain_tasks()
    assert Task.objects.get(pk=task.pk).state == TaskState.WAITING
    original = Action.objects.get(task=task)
    review_edit(ReviewItem.objects.get(action=original, status="open"), user=person("alice", "approvers"),
                changes={"amount": "400.00"}, reason="only the damaged item", fingerprint=original.params_fingerprint())
    drain_tasks()

    task.refresh_from_db()
    assert task.state == TaskState.SUCCEEDED, task.last_error
    [refund] = sandbox_list(client, "refunds", order_id="ORD-E")
    assert Decimal(refund["amount"]) == Decimal("400.00")
    assert Confirmation.objects.get(task=task).amount == Decimal("400.00")
    [message] = sandbox_list(client, "messages", operation_key="refund-edited:notify_customer:v1")
    assert "refunded 400.00 EUR" in message["body"], message["body"]
    assert Action.objects.get(task=task, action_type=ActionType.SEND_MESSAGE).params["body"] == message["body"]


def test_the_confirmation_to_notify_is_recorded_with_its_domain_as_the_api_records_it(stack, client, settings):
    """The notify step records its message as the API records a recipient (ledger.recipients
    .email_recipient: the domain in lower case): recorded as written, the agent's own message of
    the same type for the same decision to that address, through the API, was a second message."""
    settings.DRAIN_LANES = 1
    sandbox_order(client, "ORD-N", "C-N")
    task, _ = task_request(agent=client.agent, task_id="refund-notify", workflow="refund",
                           input={**refund_input("ORD-N", "C-N"), "notify": "Ada@Customers.EXAMPLE"})
    drain_tasks()
    assert Task.objects.get(pk=task.pk).state == TaskState.SUCCEEDED
    notified = Action.objects.get(task=task, action_type=ActionType.SEND_MESSAGE)
    assert notified.target == "Ada@customers.example"

    # The same message as the API would record it for the agent (its target normalised).
    action_request(agent=client.agent, operation_key="direct-key", action_type="send_message",
                   target=email_recipient("Ada@Customers.EXAMPLE"), decision_id=task.task_id,
                   params=notified.params)

    assert Action.objects.filter(action_type=ActionType.SEND_MESSAGE).count() == 1


def test_a_notify_address_whose_domain_in_lower_case_would_not_fit_a_target_is_refused_before_anything_runs():
    """notify_customer records the address with its domain in lower case, which may be longer
    ("İ" is "i̇"): refused at intake, not on the last step after the refund."""
    notify = "a@" + ".".join(["\u0130" * 50] * 4) + ".com"
    refused = RefundInput(data={**refund_input("ORD-1", "C-1"), "notify": notify})
    assert not refused.is_valid()
    assert "notify" in refused.errors


def test_a_notify_address_the_mail_cannot_be_sent_to_is_refused_as_such_not_as_too_long():
    """Django's rule takes a domain IDNA refuses (a label of Latin and Hebrew letters): the mail
    cannot be sent to it, and the refusal says so (it said the address was too long)."""
    refused = RefundInput(data={**refund_input("ORD-1", "C-1"), "notify": "ada@a\u05d0.example"})
    assert not refused.is_valid()
    assert refused.errors["notify"] == ["Not an e-mail address the mail can be sent to."]


# Taken, refused as not an address, refused as too long once its domain is in lower case (the
# last one both).
ADDRESSES = ["ada@example.com", "Ada@Customers.EXAMPLE", "a@localhost", "not-an-email", "a@b@example.com",
             "a b@example.com", "a@" + ".".join(["\u0130" * 50] * 4) + ".com", "a b@" + "\u0130" * 200 + ".com"]


@pytest.mark.parametrize("address", ADDRESSES)
def test_notify_takes_the_addresses_the_api_takes_as_a_message_recipient(address):
    """One rule for an e-mail recipient (ledger.recipients.email_recipient_checked): the refund's
    intake repeated the API's in pieces of its own, free to drift from it."""
    api = ActionRequestSerializer(data=message_body(target=address)).is_valid()
    assert RefundInput(data={**refund_input("ORD-1", "C-1"), "notify": address}).is_valid() == api


@pytest.mark.parametrize("customer", ["CUST-17", "ACME Corp", "a@b", "i" * (TARGET_LENGTH - len(CUSTOMERS_AT)),
                                      "i" * (TARGET_LENGTH - len(CUSTOMERS_AT) + 1), "\u0130" * 200])
def test_without_notify_a_customer_is_taken_when_the_api_takes_its_confirmations_recipient(customer):
    api = ActionRequestSerializer(data=message_body(target=default_recipient(customer))).is_valid()
    assert RefundInput(data=refund_input("ORD-1", customer)).is_valid() == api
