"""Never silent, for tasks too: a task that fails with an error no retry will change (its refund
was declined) gets a dead-letter entry and an alert in the same transaction, with its checkpoint
and the decline in the alert's text; the agent's owner is mailed; a failed task is final, so its
entry is resolved or discarded, never redriven, and the page says so."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client
from guardian.shortcuts import assign_perm

from dlq.alerts import channels
from dlq.entries import deadletter_discard, deadletter_redrive, deadletter_resolve
from dlq.models import Alert, DeadLetter, EntryStatus
from ledger.access import WORK_DLQ
from ledger.models import Capability, InvalidTransition, Task
from tests.conftest import wait_until
from tests.factories import (api_client, audit_events, dead_letter, make_agent, post_task, refund_task_body, sandbox,
                             sandbox_order, settled)

E = EntryStatus
User = get_user_model()


@pytest.fixture
def agent(stack):
    owner = User.objects.create_user(username="oona", email="oona@surety.example", password=None)
    agent, token = make_agent("billing", grants=("refund", "send_message"), owner=owner)
    agent.token = token
    return agent


@pytest.fixture
def operator(stack):
    """olga, an operator granted the dead-letter permission on the refund workflow (a task's
    entry is worked with the permission on its workflow)."""
    call_command("setup_roles", verbosity=0)
    user = User.objects.create_user(username="olga", password=None)
    user.groups.add(Group.objects.get(name="operators"))
    capability, _ = Capability.objects.get_or_create(kind=Capability.Kind.WORKFLOW, name="refund")
    assign_perm(f"ledger.{WORK_DLQ}", user, capability)
    return user


def declined_task(stack, agent, task_id, order):
    """A refund task whose refund the sandbox provider declines, run by a real worker."""
    client = api_client(stack.url, agent.token)
    sandbox_order(client, order, "CUST-17")
    assert sandbox(client, "POST", "faults", json={"target": order, "fault": "decline", "times": 1}).status_code in (200, 201)
    assert post_task(client, task_id, refund_task_body(order=order)).status_code == 201
    stack.start_worker()
    return settled(Task.objects.get(task_id=task_id))


def test_a_declined_refund_task_ends_failed_with_an_open_entry_an_alert_and_the_owner_mailed(stack, agent):
    task = declined_task(stack, agent, "refund-declined", "ORD-TDEC")
    assert task.state == "failed" and task.attempts == 1
    assert task.last_error["code"] == "declined" and task.last_error["retryable"] is False

    [entry] = DeadLetter.objects.filter(task=task)
    assert entry.status == E.OPEN and entry.action is None and entry.attempts == 1
    assert entry.last_error == task.last_error
    assert entry.snapshot["state"] == "failed" and entry.snapshot["steps"]["lookup_order"]["status"] == "done"
    [opened] = audit_events(entry, "dead_letter_opened")
    assert opened.actor == "system:runner"
    [alert] = entry.alerts.all()
    assert "refund-declined" in alert.subject
    for text in ("Task: refund-declined", "Workflow: refund", "State: failed", "Checkpoint:", "lookup_order: done",
                 "call_refund_api: failed", "declined", "not retryable"):
        assert text in alert.body, (text, alert.body)

    # The worker delivers it: to operations, and to the agent's owner (a decline is theirs to see to).
    delivered = wait_until(lambda: Alert.objects.filter(pk=alert.pk, delivered_at__isnull=False).first(),
                           message="the alert to be delivered")
    deliveries = {d.channel: d for d in delivered.deliveries.all()}
    assert set(deliveries) == {"email", "owner"} and all(d.ok for d in deliveries.values())
    assert deliveries["owner"].detail == "mailed to oona@surety.example"


def test_a_dead_lettered_task_is_still_for_operations_only_and_may_be_redriven(stack, agent, operator):
    # Out of attempts on a retryable error: not the owner's to fix, and a redrive may resume it.
    entry = dead_letter(agent, "refund-out-of-attempts")
    assert channels(entry.alerts.get()) == ["email"]
    assert entry.redrive_refusal == ""
    deadletter_redrive(entry, actor=operator, reason="the provider is back")
    assert DeadLetter.objects.get(pk=entry.pk).status == EntryStatus.REDRIVEN
    assert Task.objects.get(pk=entry.task_id).state == "queued"


def test_a_failed_tasks_entry_is_not_redriven_but_resolved_with_a_reason(stack, agent, operator):
    task = declined_task(stack, agent, "refund-final", "ORD-TFIN")
    entry = DeadLetter.objects.get(task=task)
    assert entry.redrive_refusal

    with pytest.raises(InvalidTransition, match="a failed task is final"):
        deadletter_redrive(entry, actor=operator, reason="try again")
    assert DeadLetter.objects.get(pk=entry.pk).status == E.OPEN
    assert Task.objects.get(pk=task.pk).state == "failed" and not audit_events(task, "redriven")

    # The page offers no redrive and says why; resolve and discard stay.
    browser = Client()
    browser.force_login(operator)
    page = browser.get(f"/dlq/{entry.pk}/").content.decode()
    assert 'id="no-redrive"' in page and "a failed task is final" in page and 'id="redrive-form"' not in page
    assert 'id="resolve-form"' in page and 'id="discard-form"' in page
    refused = browser.post(f"/dlq/{entry.pk}/redrive", {"reason": "try again"}, follow=True)
    assert "a failed task is final" in refused.content.decode()

    with pytest.raises(ValueError, match="by hand"):
        deadletter_resolve(entry, actor=operator, note="  ")
    resolved = deadletter_resolve(entry, actor=operator, note="refunded by hand, ticket 8812")
    assert resolved.status == E.RESOLVED and resolved.decided_by == "user:olga"
    assert resolved.note == "refunded by hand, ticket 8812"
    [decision] = audit_events(resolved, "resolved")
    assert decision.reason == "refunded by hand, ticket 8812"
    assert Task.objects.get(pk=task.pk).state == "failed"


def test_a_failed_tasks_entry_is_discarded_and_the_task_stays_failed(stack, agent, operator):
    task = declined_task(stack, agent, "refund-give-up", "ORD-TGIV")
    discarded = deadletter_discard(DeadLetter.objects.get(task=task), actor=operator, reason="customer withdrew")
    assert discarded.status == E.DISCARDED
    assert Task.objects.get(pk=task.pk).state == "failed"
