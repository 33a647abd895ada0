"""Bulk redrive from the dead-letter page, through the real stack (the gunicorn server with its
sandbox provider, RQ workers): the dry run changes nothing; the run, with a rate and a reason,
redrives each entry, audited; every task resumes from its checkpoint; and an effect whose outcome was unknown is never sent again
in bulk: the executor asks the provider first and settles it with what the provider holds. The
sandbox's own idempotency is off, so only the ledger stands between a redrive and a second refund."""

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from dlq.models import BulkRedrive, DeadLetter, EntryStatus
from ledger.actions import action_request
from ledger.models import Action, ActionStatus
from tests.conftest import wait_until
from tests.factories import (agent_api, audit_events, dead_letter, make_agent, sandbox, sandbox_list, sandbox_order,
                             sandbox_without_idempotency, settled)

REASON = "the provider is back; the runbook says redrive"


@pytest.fixture
def operator(stack, client):
    client.force_login(get_user_model().objects.create_superuser("olga", password=None))
    return client


def unknown_after_commit(client, task, order, customer):
    """The task's refund step as a worker left it when its call timed out: the refund committed
    at the provider, the action `unknown` in the ledger."""
    key = task.steps.get(name="call_refund_api").idempotency_key
    action, _ = action_request(agent=task.agent, operation_key=key, action_type="refund", target=order,
                               customer=customer, params={"amount": "25.00", "currency": "EUR"}, task=task,
                               decision_id=task.task_id)
    committed = sandbox(client, "POST", "refunds", json={"order_id": order, "amount": "25.00", "currency": "EUR",
                                                         "metadata": {"operation_key": key}})
    assert committed.status_code == 201, committed.text
    Action.objects.filter(pk=action.pk).update(status=ActionStatus.UNKNOWN, attempts=1, next_attempt_at=timezone.now())
    return key, committed.json()["id"]


def test_a_bulk_redrive_resumes_each_task_and_never_sends_an_unknown_outcome_again(stack, operator):
    agent, _ = make_agent("billing")
    client = agent_api(stack.url, "provider-client")
    sandbox_without_idempotency(client)
    tasks = {}
    for n in range(3):
        order, customer = f"ORD-BULK-{n}", f"CUST-BULK-{n}"
        sandbox_order(client, order, customer)
        tasks[order] = dead_letter(agent, f"bulk-{n}", order=order, customer=customer).task
    unknown_key, committed_ref = unknown_after_commit(client, tasks["ORD-BULK-1"], "ORD-BULK-1", "CUST-BULK-1")

    preview = operator.post("/dlq/bulk", {"op": "redrive", "workflow": "refund"})
    run = BulkRedrive.objects.get()
    assert preview.status_code == 302 and run.items.count() == 3
    assert DeadLetter.objects.filter(status=EntryStatus.OPEN).count() == 3  # a dry run changes nothing

    stack.start_worker()
    stack.start_worker()
    done = operator.post(f"/dlq/redrives/{run.pk}/start", {"rate": "60", "reason": REASON})
    assert done.status_code == 302
    wait_until(lambda: BulkRedrive.objects.filter(pk=run.pk, status="finished").exists(), 30, message="the run")
    for entry in DeadLetter.objects.all():
        assert entry.status == EntryStatus.REDRIVEN and entry.decided_by == "user:olga" and entry.note == REASON
        [event] = audit_events(entry.task, "redriven")
        assert event.reason == REASON

    for order, task in tasks.items():
        assert settled(task, seconds=60).state == "succeeded", order
        [refund] = sandbox_list(client, "refunds", order_id=order)
        assert refund["operation_key"] == task.steps.get(name="call_refund_api").idempotency_key

    # The unknown outcome was looked up, found and taken as it stood, not sent a second time.
    verified = Action.objects.get(operation_key=unknown_key)
    assert verified.external_ref == committed_ref and verified.attempts == 1
    assert verified.evidence[-1]["found"] is True
    assert [r["id"] for r in sandbox_list(client, "refunds", operation_key=unknown_key)] == [committed_ref]
