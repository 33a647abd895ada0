"""Late workers and ended tasks: nothing is carried out behind an operator's back."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger import clock, executor
from ledger.actions import action_request, action_retry
from ledger.connectors.base import Effect
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


class Recorder:
    """A provider that only counts the calls made to it."""

    name = "recorder"
    verifiable = False

    def __init__(self):
        self.calls = []

    def perform(self, action):
        self.calls.append(action.operation_key)
        return Effect(external_ref="re_recorded", result={})

    def find_effect(self, action):
        raise AssertionError("a first attempt is not looked up")


@pytest.mark.parametrize(("left", "called"), [(6, False), (20, True)], ids=["too little lease left", "enough"])
def test_a_call_starts_only_with_connector_timeout_and_its_margin_of_lease_left(agent, monkeypatch, settings, left,
                                                                                called):
    """A worker that stalled between its claim and its call, with 6 s of its lease left where a call
    may take CONNECTOR_TIMEOUT (5 s) and the margin (2 s), does not start it: another worker may take
    the action over before the call could end. It leaves the action pending under its claim, for the
    sweeper. With time enough left, it calls."""
    settings.CONNECTOR_TIMEOUT, settings.LEASE_MARGIN_SECONDS, settings.LEASE_SECONDS = 5, 2, 30
    requested, _ = action_request(agent=agent, operation_key=f"refund:ORD-L{left}:full:dec-1", action_type="refund",
                                  target=f"ORD-L{left}", params={"amount": "5.00", "currency": "EUR"})
    action = action_claim_next("stalled", only=requested.pk)
    action.lease_expires_at = clock.now() + timedelta(seconds=left)
    Action.objects.filter(pk=action.pk).update(lease_expires_at=action.lease_expires_at)
    provider = Recorder()
    monkeypatch.setattr(executor, "connector_for_action", lambda action: provider)

    executor.action_run_claimed(action)

    row = Action.objects.get(pk=action.pk)
    assert provider.calls == ([action.operation_key] if called else [])
    assert (row.status, row.attempts) == ("succeeded" if called else "pending", 1)
    if not called:
        assert (row.fence, row.lease_owner) == (action.fence, "stalled")
