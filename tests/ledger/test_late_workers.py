"""Late workers and ended tasks: nothing is carried out behind an operator's back."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.actions import action_request, action_retry
from ledger.executor import action_claim_next
from ledger.models import Action, StaleClaim, Task, TaskStep
from ledger.runner import _checkpoint
from ledger.tasks import task_expire_leases, task_request

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]

INPUT = {"order_id": "ORD-1", "amount": "25.00", "currency": "EUR", "customer": "CUST-1"}


def test_a_worker_that_stalled_past_the_dead_letter_cannot_checkpoint(agent):
    task, _ = task_request(agent=agent, task_id="t-1", workflow="refund", input=INPUT)
    Task.objects.filter(pk=task.pk).update(attempts=2)
    task.refresh_from_db()
    task.claim(owner="stalled")
    stale_claim = task.fence
    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert task_expire_leases() == 1
    assert Task.objects.get(pk=task.pk).state == "dead_lettered"
    step = TaskStep.objects.get(task=task, name="lookup_order")
    with pytest.raises(StaleClaim):
        _checkpoint(task, stale_claim, step, lambda: {"late": True})
    assert TaskStep.objects.get(pk=step.pk).status == "pending"


def test_the_drain_does_not_attempt_an_action_of_a_task_that_is_not_running(agent):
    task, _ = task_request(agent=agent, task_id="t-2", workflow="refund", input=INPUT)
    action, _ = action_request(agent=agent, operation_key="t-2:call_refund_api:v1", action_type="refund",
                               target="ORD-1", params={"amount": "25.00", "currency": "EUR"}, task=task)
    assert action.status == "queued"
    assert action_claim_next("drain") is None  # the task is queued, not running
    task.claim(owner="runner")
    assert action_claim_next("drain").pk == action.pk


def test_a_retry_while_another_action_is_in_flight_for_the_same_order_is_held(agent):
    first, _ = action_request(agent=agent, operation_key="k-1", action_type="refund", target="ORD-9",
                              params={"amount": "5.00", "currency": "EUR"})
    first.claim(owner="w")
    first.mark_failed(actor="system:tests", claim=first.fence, code="timeout", message="t", retryable=True)
    second, _ = action_request(agent=agent, operation_key="k-2", action_type="refund", target="ORD-9",
                               params={"amount": "5.00", "currency": "EUR"})
    assert second.status == "queued"  # a failed action is not in flight
    retried = action_retry(Action.objects.get(pk=first.pk), actor="system:tests", reason="retry")
    assert retried.status == "held"
