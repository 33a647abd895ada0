"""The seed incident: a refund task's worker is SIGKILLed after the refund went out.

A fresh worker must resume from the checkpoint (never "start the task" again), and the
provider must hold exactly one refund and one message per operation key. The sandbox's own
idempotency is off, so only the ledger stands between a lost worker and a second refund.
Recovery is the sweeper's job: it runs here in the test process, as `sweep_once()` passes.
"""

import pytest
from django.db import connection, transaction

from ledger.models import Action, Confirmation, StepStatus, Task, TaskStep
from tests.conftest import wait_until
from tests.factories import (agent_api, audit_events, sandbox, sandbox_list, sandbox_order, sandbox_without_idempotency,
                             sessions_waiting_for_a_lock, settled, start_refund_task)

ORDER, CUSTOMER = "ORD-8841", "CUST-17"
RECIPIENT = f"{CUSTOMER.lower()}@customers.surety.example"
STEPS = ["lookup_order", "call_refund_api", "write_confirmation", "notify_customer"]


@pytest.fixture
def client(stack):
    client = agent_api(stack.url, grants=("refund", "send_message"))
    sandbox_without_idempotency(client)
    sandbox_order(client, ORDER, CUSTOMER)
    return client


def step_statuses(task):
    return dict(TaskStep.objects.filter(task=task).order_by("position").values_list("name", "status"))


def provider_effects(client):
    return sandbox_list(client, "refunds", order_id=ORDER), sandbox_list(client, "messages", recipient=RECIPIENT)


def assert_succeeded_once(client, task):
    """The checkpoint is complete and every effect happened exactly once."""
    row = settled(task, seconds=40)
    assert row.state == "succeeded", (row.state, row.last_error)
    assert step_statuses(row) == dict.fromkeys(STEPS, StepStatus.DONE)
    refunds, messages = provider_effects(client)
    refund_action = Action.objects.get(operation_key=f"{task.task_id}:call_refund_api:v1")
    notify_action = Action.objects.get(operation_key=f"{task.task_id}:notify_customer:v1")
    assert [r["id"] for r in refunds] == [refund_action.external_ref]
    assert [r["operation_key"] for r in refunds] == [refund_action.operation_key]
    assert [m["id"] for m in messages] == [notify_action.external_ref]
    assert [m["operation_key"] for m in messages] == [notify_action.operation_key]
    confirmation = Confirmation.objects.get(task=row)
    assert confirmation.external_ref == refund_action.external_ref
    # Every step was checkpointed once: nothing done was redone by the second worker.
    assert sorted(e.after["step"] for e in audit_events(row, "step_done")) == sorted(STEPS)
    assert audit_events(row, "lease_expired"), "the sweeper never took the task back from the dead worker"
    return row


def test_a_worker_killed_right_after_the_refund_went_out_resumes_at_write_confirmation(stack, client):
    # Hold the confirmation table so the worker stops exactly between its checkpoint of
    # call_refund_api and write_confirmation's own write: the window of the seed incident.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE ledger_confirmation IN ACCESS EXCLUSIVE MODE")
        task = start_refund_task(client, "refund-8841")
        doomed = stack.start_worker()
        wait_until(lambda: step_statuses(task)["call_refund_api"] == StepStatus.DONE, seconds=20, interval=0.02,
                   message="call_refund_api to be checkpointed")
        wait_until(lambda: sessions_waiting_for_a_lock("ledger_confirmation") == 1, seconds=10, interval=0.02,
                   message="the worker to block in write_confirmation")
        assert step_statuses(task) == {"lookup_order": "done", "call_refund_api": "done",
                                       "write_confirmation": "pending", "notify_customer": "pending"}
        stack.kill_worker(doomed)
    # The lock is gone; the dead worker's half-done transaction rolls back with its connection.

    refunds, messages = provider_effects(client)
    assert len(refunds) == 1 and messages == []
    before_resume = Task.objects.get(pk=task.pk)
    assert before_resume.state == "running" and before_resume.attempts == 1

    stack.start_worker()
    row = assert_succeeded_once(client, task)

    # The fresh worker started at write_confirmation: after the lease was taken back, only
    # the last two steps were checkpointed, and the refund action was claimed only once.
    events = list(audit_events(row))
    taken_back = next(i for i, e in enumerate(events) if e.verb == "lease_expired")
    assert [e.after["step"] for e in events[taken_back:] if e.verb == "step_done"] == STEPS[2:]
    assert [e.after["step"] for e in events[:taken_back] if e.verb == "step_done"] == STEPS[:2]
    assert Action.objects.get(operation_key="refund-8841:call_refund_api:v1").attempts == 1
    assert row.attempts == 2


def test_a_worker_killed_after_the_refund_succeeded_but_before_its_checkpoint_does_not_call_again(stack, client):
    # Hold the call_refund_api step row: the worker gets the refund done (provider and
    # ledger), then blocks writing the step's checkpoint, and dies there.
    with transaction.atomic():
        task = start_refund_task(client, "refund-unchecked")
        TaskStep.objects.select_for_update().get(task=task, name="call_refund_api")
        doomed = stack.start_worker()
        wait_until(lambda: sessions_waiting_for_a_lock("ledger_taskstep") == 1, seconds=20, interval=0.02,
                   message="the worker to block checkpointing call_refund_api")
        action = Action.objects.get(operation_key="refund-unchecked:call_refund_api:v1")
        assert action.status == "succeeded" and action.attempts == 1
        assert step_statuses(task)["call_refund_api"] == StepStatus.PENDING
        stack.kill_worker(doomed)

    assert len(provider_effects(client)[0]) == 1
    stack.start_worker()
    row = assert_succeeded_once(client, task)
    # The fresh worker found the action succeeded in the ledger and only checkpointed it.
    action.refresh_from_db()
    assert action.attempts == 1
    assert audit_events(action, "claimed").count() == 1
    events = list(audit_events(row))
    taken_back = next(i for i, e in enumerate(events) if e.verb == "lease_expired")
    assert [e.after["step"] for e in events[taken_back:] if e.verb == "step_done"] == STEPS[1:]


def test_a_worker_killed_as_soon_as_the_refund_is_checkpointed_leaves_one_refund(stack, client):
    # The message call stalls, so the worker is surely still busy with the task when killed.
    sandbox(client, "POST", "faults", json={"target": RECIPIENT, "fault": "timeout_after_commit", "times": 1})
    task = start_refund_task(client, "refund-race")
    doomed = stack.start_worker()
    wait_until(lambda: step_statuses(task)["call_refund_api"] == StepStatus.DONE, seconds=20, interval=0.01,
               message="call_refund_api to be checkpointed")
    stack.kill_worker(doomed)
    assert Task.objects.get(pk=task.pk).state == "running"

    stack.start_worker()
    assert_succeeded_once(client, task)
    assert Action.objects.get(operation_key="refund-race:call_refund_api:v1").attempts == 1


def test_a_worker_killed_while_the_message_is_in_flight_is_verified_not_resent(stack, client, settings):
    # The provider commits the message, then stalls 3 s; this worker would wait up to 4 s,
    # so it is certainly inside notify_customer, after the refund and the confirmation.
    sandbox(client, "POST", "faults", json={"target": RECIPIENT, "fault": "timeout_after_commit", "times": 1})
    task = start_refund_task(client, "refund-stall")
    doomed = stack.start_worker(CONNECTOR_TIMEOUT=4, LEASE_SECONDS=6)
    wait_until(lambda: provider_effects(client)[1], seconds=20, interval=0.05,
               message="the message to be committed at the provider")
    assert step_statuses(task)["write_confirmation"] == StepStatus.DONE
    notify = Action.objects.get(operation_key="refund-stall:notify_customer:v1")
    assert notify.status == "pending"
    stack.kill_worker(doomed)

    # The sweeper must wait for the dead worker's lease plus its connector timeout.
    settings.CONNECTOR_TIMEOUT = 4
    settings.LEASE_SECONDS = 6
    stack.start_worker()
    assert_succeeded_once(client, task)
    notify = Action.objects.get(pk=notify.pk)
    assert notify.status == "succeeded" and notify.attempts == 1
    assert any("lease_expired" in e for e in notify.evidence)
    assert audit_events(notify, "succeeded").filter(reason="verified at the provider").exists()
