"""A task's claim races a person's move: a run that stalled past its lease writes no step
action under a task given up meanwhile, and a resolve by hand settles under the task's lock,
as the executor's verification of the task's action expects."""

from datetime import timedelta

import pytest
from django.utils import timezone

from dlq.entries import deadletter_discard, deadletter_resolve
from ledger import executor, runner
from ledger.actions import action_request
from ledger.connectors.base import Lookup
from ledger.executor import action_claim_next, action_verify
from ledger.models import Action, ActionStatus, StepStatus, Task, TaskStep
from ledger.runner import task_run
from ledger.tasks import task_claim_next, task_expire_leases, task_request
from tests.factories import another_transaction, open_entry, person, refund_input

pytestmark = pytest.mark.usefixtures("jobs_to_test_redis")

REFUND = {"amount": "25.00", "currency": "EUR"}


def given_up_behind_its_back(task):
    """What happens while a worker stalls: its lease lapses, the sweeper dead-letters the task
    (out of attempts), and an operator discards its entry."""
    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert task_expire_leases() == 1
    deadletter_discard(open_entry(Task.objects.get(pk=task.pk)), actor=person("olga", "operators"),
                       reason="refunded by hand")


def later_refund(agent, customer):
    later, _ = action_request(agent=agent, operation_key="refund:ORD-T:full:dec-1", action_type="refund",
                              target="ORD-T", customer=customer, decision_id="dec-1",
                              params={"amount": "5.00", "currency": "EUR"})
    return later


@pytest.mark.django_db
def test_a_stale_run_records_no_step_action_under_a_discarded_task(agent, settings, monkeypatch):
    settings.MAX_ATTEMPTS = 1
    task, _ = task_request(agent=agent, task_id="t-stale", workflow="refund", input=refund_input("ORD-S", "CUST-S"))
    TaskStep.objects.filter(task=task, name="lookup_order").update(status=StepStatus.DONE, result={"order_id": "ORD-S"})
    run = task_claim_next("worker-A")
    real_grant_state = runner.grant_state

    def stall_then_go_on(*args, **kwargs):  # past the run's lease check, before its action is recorded
        given_up_behind_its_back(task)
        return real_grant_state(*args, **kwargs)

    monkeypatch.setattr(runner, "grant_state", stall_then_go_on)
    assert task_run(run) is None
    assert Task.objects.get(pk=task.pk).state == "cancelled"
    later = later_refund(agent, "CUST-S")
    assert not Action.objects.filter(task=task).exists() and later.status == ActionStatus.QUEUED


@pytest.mark.django_db
def test_a_stale_run_does_not_requeue_a_failed_step_action_under_a_discarded_task(agent, settings, monkeypatch):
    settings.MAX_ATTEMPTS = 1
    task, _ = task_request(agent=agent, task_id="t-again", workflow="refund", input=refund_input("ORD-A", "CUST-A"))
    TaskStep.objects.filter(task=task, name="lookup_order").update(status=StepStatus.DONE, result={"order_id": "ORD-A"})
    # The step's action from an earlier attempt, failed retryable: the run retries it.
    failed, _ = action_request(agent=agent, operation_key="t-again:call_refund_api:v1", action_type="refund",
                               target="ORD-A", customer="CUST-A", decision_id="t-again", task=task, params=REFUND)
    failed.claim(owner="tests:1")
    failed.mark_failed(actor="system:tests", claim=failed.fence, code="timeout", message="t", retryable=True)
    run = task_claim_next("worker-A")
    real_latest_version = runner.latest_version

    def stall_then_go_on(action):  # past the run's lease check and its request, before the retry
        given_up_behind_its_back(task)
        return real_latest_version(action)

    monkeypatch.setattr(runner, "latest_version", stall_then_go_on)
    assert task_run(run) is None
    assert Task.objects.get(pk=task.pk).state == "cancelled"
    assert Action.objects.get(pk=failed.pk).status == ActionStatus.FAILED
    assert later_refund(agent, "CUST-A").status == ActionStatus.QUEUED


@pytest.mark.django_db(transaction=True)
def test_a_resolve_committing_while_the_action_is_verified_absent_leaves_its_failure_for_good(agent, monkeypatch):
    task, _ = task_request(agent=agent, task_id="t-r", workflow="refund", input=refund_input("ORD-R", "CUST-R"))
    task.claim(owner="tests:1")
    action, _ = action_request(agent=agent, operation_key="t-r:call_refund_api:v1", action_type="refund",
                               target="ORD-R", customer="CUST-R", decision_id="t-r", task=task, params=REFUND)
    action = action.claim(owner="tests:1")
    action.mark_unknown(actor="system:sweeper", claim=action.fence, verify_at=timezone.now(),
                        evidence={"lease": "lapsed"})
    task.refresh_from_db()
    task.mark_dead_lettered(actor="system:sweeper", claim=task.fence,
                            error={"code": "worker_lost", "message": "the lease lapsed", "retryable": True})
    held, _ = action_request(agent=agent, operation_key="refund:ORD-R2:full:dec-2", action_type="refund",
                             target="ORD-R2", customer="CUST-R", decision_id="dec-2",
                             params={"amount": "5.00", "currency": "EUR"})
    assert held.status == ActionStatus.HELD
    olga = person("olga", "operators")
    claimed = action_claim_next("tests:2", only=action.pk)
    monkeypatch.setattr(executor, "_ask", lambda action, connector=None: (Lookup(found=False), {"found": False}, ""))

    # The resolve commits only once the verification waits for the task's lock.
    def resolve_by_hand():
        deadletter_resolve(open_entry(task), actor=olga, note="refunded by hand, ticket 1")

    with another_transaction(resolve_by_hand, commit_when_waited_on=True) as resolve:
        action_verify(claimed)
    action.refresh_from_db()
    assert (action.status, action.error["retryable"], Action.objects.get(pk=held.pk).status) == (
        ActionStatus.FAILED, False, ActionStatus.QUEUED)
    assert resolve.waited
