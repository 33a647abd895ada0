"""Approvals bound to exact arguments, through the real stack (the gunicorn server with its
sandbox provider, an RQ worker): params changed in the database after approval never reach
the provider; a task whose refund was edited down goes on with the approved version; a task
whose approval expired fails saying so. The agent reads each outcome through the API."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection

from approvals.decisions import review_decide, review_edit
from approvals.models import Limit, ReviewItem, ReviewKind
from approvals.reviews import approval_expire_due
from ledger.models import Action, Task
from tests.conftest import wait_until
from tests.factories import (agent_api, audit_events, person, post_action, post_task, refund_body, refund_task_body,
                             sandbox_list, sandbox_order, settled)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def alice(stack):
    return person("alice", "approvers")


def limit(**extra):
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), **extra)


def open_item(action):
    return ReviewItem.objects.get(action=action, status="open")


def test_params_changed_in_the_database_after_approval_never_reach_the_provider(stack, alice):
    limit()
    client = agent_api(stack.url)
    key = "refund:ORD-RAW:full:dec-1"
    assert post_action(client, key, refund_body("ORD-RAW", amount="900.00")).status_code == 201
    action = Action.objects.get(operation_key=key)
    approved = action.params_fingerprint()
    review_decide(open_item(action), user=alice, decision="approve", reason="known customer", fingerprint=approved)
    # Behind the ledger's back, before any worker ran it.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_action SET params = %s WHERE id = %s",
                       ['{"amount": "9000.00", "currency": "EUR"}', action.pk])
    stack.start_worker()

    action = wait_until(lambda: Action.objects.filter(pk=action.pk, status="awaiting_approval").first(),
                        message="the action to go back for approval")
    assert sandbox_list(client, "refunds", order_id="ORD-RAW") == []  # no provider call
    assert action.attempts == 0 and action.approved_fingerprint == ""
    [lapsed] = audit_events(action, "approval_lapsed")
    assert lapsed.actor == "system:executor" and "not the ones a person approved" in lapsed.reason
    assert action.evidence[-1]["approved_fingerprint"] == approved
    assert action.evidence[-1]["params_fingerprint"] == action.params_fingerprint() != approved
    item = open_item(action)
    assert item.kind == ReviewKind.APPROVAL and "changed after it was approved" in item.why
    assert client.get(f"/api/v1/actions/{key}").json()["status"] == "awaiting_approval"


def test_an_approval_of_unchanged_params_runs_once(stack, alice):
    """The binding's other side: what was approved is what runs."""
    limit()
    client = agent_api(stack.url)
    key = "refund:ORD-OK:full:dec-1"
    assert post_action(client, key, refund_body("ORD-OK", amount="900.00")).status_code == 201
    action = Action.objects.get(operation_key=key)
    review_decide(open_item(action), user=alice, decision="approve", reason="known customer",
                  fingerprint=action.params_fingerprint())
    stack.start_worker()
    answer = wait_until(lambda: (a := client.get(f"/api/v1/actions/{key}").json())["status"] == "succeeded" and a,
                        message="the refund to succeed")
    assert [r["amount"] for r in sandbox_list(client, "refunds", order_id="ORD-OK")] == ["900.00"]
    assert answer["supersedes"] is None and answer["superseded_by"] is None


def waiting_refund_task(stack, client, n):
    """A refund task of 900.00 EUR (over the limit) started, run by a worker until it waits for a person."""
    sandbox_order(client, f"ORD-T{n}", f"CUST-T{n}", amount="1000.00")
    body = refund_task_body(f"ORD-T{n}", amount="900.00", customer=f"CUST-T{n}")
    assert post_task(client, f"refund-t{n}", body).status_code == 201
    stack.start_worker()
    task = Task.objects.get(task_id=f"refund-t{n}")
    return wait_until(lambda: Task.objects.filter(pk=task.pk, state="waiting").first(),
                      message=f"task {task.task_id} to wait for a person")


def test_a_task_whose_refund_was_edited_down_goes_on_with_the_approved_version(stack, alice):
    limit()
    client = agent_api(stack.url)
    task = waiting_refund_task(stack, client, 1)
    original = Action.objects.get(task=task)

    _, version = review_edit(open_item(original), user=alice, changes={"amount": "400.00"},
                             reason="only the damaged item", fingerprint=original.params_fingerprint())

    task = settled(task)
    assert task.state == "succeeded", task.last_error
    [refund] = sandbox_list(client, "refunds", order_id="ORD-T1")
    assert refund["amount"] == "400.00" and refund["metadata"]["operation_key"] == version.operation_key
    step = task.steps.get(name="call_refund_api")
    assert step.idempotency_key == original.operation_key
    assert step.result["operation_key"] == version.operation_key and step.result["external_ref"] == refund["id"]
    checkpoint = client.get("/api/v1/tasks/refund-t1").json()
    assert checkpoint["steps"]["call_refund_api"]["result"]["operation_key"] == version.operation_key


def test_a_task_whose_approval_expired_fails_saying_expiry(stack):
    limit(approval_expires_after_hours=2)
    client = agent_api(stack.url)
    task = waiting_refund_task(stack, client, 2)
    action = Action.objects.get(task=task)
    item = open_item(action)
    assert item.expires_at == pytest.approx(item.created_at + timedelta(hours=2), abs=timedelta(seconds=1))

    assert approval_expire_due(now=item.expires_at - timedelta(seconds=1)) == 0  # not yet
    assert approval_expire_due(now=item.expires_at) == 1

    task = settled(task)
    assert task.state == "failed"
    assert task.last_error["code"] == "approval_expired" and "expired" in task.last_error["message"]
    assert task.dead_letters.get().status == "open"  # a task failed for good has its entry, as a rejected one
    assert sandbox_list(client, "refunds", order_id="ORD-T2") == []
    body = client.get(f"/api/v1/actions/{action.operation_key}").json()
    assert body["status"] == "expired" and body["error"]["code"] == "approval_expired"
    assert body["review"]["by"] == "system:approvals" and "within 2 h" in body["review"]["reason"]
