"""A run whose lease lapsed while its step's refund was in flight (a worker stalled, a long GC):
the sweeper takes the task back and another run claims it while the first one's call is still
under way. The refund is made once; the late run's checkpoint is refused (fenced), and the run
after finds the refund done in the ledger and only checkpoints it. (The provider's answers are
staged; the database, the claims and the sweeper's move are the real ones.)"""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.connectors import http
from ledger.models import Action, ActionStatus, StepStatus, Task, TaskState
from ledger.runner import task_run
from ledger.tasks import task_claim_next, task_expire_leases, task_request
from tests.factories import audit_events, refund_input

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


def test_a_run_that_lost_its_lease_mid_call_checkpoints_nothing_and_the_refund_is_made_once(agent, monkeypatch):
    task, _ = task_request(agent=agent, task_id="t-over", workflow="refund", input=refund_input("ORD-O", "CUST-O"))
    first = task_claim_next("worker-A")
    sent, second_run = [], []

    def provider(method, url, **kwargs):
        if method == "GET":
            return {"order_id": "ORD-O", "customer": "CUST-O", "amount": "100.00"}
        sent.append(kwargs["headers"]["Idempotency-Key"])
        if len(sent) == 1:  # the refund is on its way: worker-A stalls past its task's lease
            Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
            assert task_expire_leases() == 1
            second_run.append(task_run(task_claim_next("worker-B")))
        return {"id": f"eff_{len(sent)}"}

    monkeypatch.setattr(http, "call", provider)
    assert task_run(first) is None  # its checkpoint of the refund is refused

    refund = Action.objects.get(operation_key="t-over:call_refund_api:v1")
    assert (refund.status, refund.attempts, refund.external_ref) == (ActionStatus.SUCCEEDED, 1, "eff_1")
    # worker-B found the refund pending under worker-A's claim: deferred, no attempt spent.
    [deferred] = second_run
    assert (deferred.state, deferred.attempts) == (TaskState.QUEUED, 1)
    assert task.steps.get(name="call_refund_api").status == StepStatus.PENDING

    Task.objects.filter(pk=task.pk).update(next_attempt_at=timezone.now())
    done = task_run(task_claim_next("worker-C"))

    assert done.state == TaskState.SUCCEEDED, done.last_error
    assert sent == ["t-over:call_refund_api:v1", "t-over:notify_customer:v1"]
    assert Action.objects.get(pk=refund.pk).attempts == 1
    assert [e.after["step"] for e in audit_events(done, "step_done")] == ["lookup_order", "call_refund_api", "write_confirmation",
                                                "notify_customer"]
