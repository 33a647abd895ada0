"""A step's failure is recorded whatever its message holds: a provider's answer (or anything
answering in its place) may name a NUL or a lone surrogate, which PostgreSQL's jsonb and text
refuse. Written as it came, the failure's own bookkeeping failed, the run left the task running
until its lease lapsed, and after its attempts the sweeper dead-lettered it as `worker_lost`,
the step's real error lost."""

import json

import pytest

from ledger.connectors import http
from ledger.models import StepStatus, Task, TaskState
from ledger.runner import drain_tasks
from ledger.tasks import task_request
from tests.conftest import answering, thread_server
from tests.factories import audit_events, refund_input

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.mark.parametrize("said, stored", [("no such order\x00", "no such order\ufffd"),
                                          ("no such order\ud800", "no such order\ufffd")])
def test_a_refusal_whose_message_postgresql_cannot_store_fails_the_task_with_it(agent, settings, said, stored):
    settings.DRAIN_LANES = 1
    refused = json.dumps({"error": {"code": "order_refused", "message": said}}).encode()  # JSON's escapes name them
    with thread_server(answering(refused, "application/json", status=400)) as provider:  # the sandbox's wire format
        settings.SANDBOX_BASE_URL = f"{provider.url}/sandbox/v1"
        task, _ = task_request(agent=agent, task_id="t-nul", workflow="refund", input=refund_input("ORD-N", "CUST-N"))
        drain_tasks()

    task.refresh_from_db()
    assert (task.state, task.attempts) == (TaskState.FAILED, 1)
    assert task.last_error["code"] == "order_refused" and task.last_error["message"].endswith(stored)
    step = task.steps.get(name="lookup_order")
    assert step.status == StepStatus.FAILED and step.error["message"].endswith(stored)


def test_a_step_that_crashes_with_a_nul_in_its_message_is_retried_with_it(agent, settings, monkeypatch):
    settings.DRAIN_LANES = 1

    def provider(method, url, **kwargs):
        raise ValueError("an answer of a shape nobody expected: \x00")

    monkeypatch.setattr(http, "call", provider)
    task, _ = task_request(agent=agent, task_id="t-crash", workflow="refund", input=refund_input("ORD-C", "CUST-C"))
    drain_tasks()

    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.attempts, task.last_error["code"]) == (TaskState.QUEUED, 1, "crash")
    assert task.last_error["message"] == "ValueError: an answer of a shape nobody expected: \ufffd"


def test_a_step_its_workflow_no_longer_has_fails_the_run_with_what_is_missing(agent, settings, monkeypatch):
    """A deploy renamed a step while a task waited at it: its run stopped before anything, the
    task sat running until its lease lapsed, and after its attempts the sweeper dead-lettered it as
    `worker_lost`. Its run fails now, saying which step, and goes the way of a retryable failure
    (a deploy may bring the step back; a person redrives it then)."""
    settings.DRAIN_LANES = 1
    task, _ = task_request(agent=agent, task_id="t-renamed", workflow="noop", input={})
    task.steps.filter(name="step_1").update(name="step_0")  # as the workflow was before the deploy
    drain_tasks()

    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.attempts, task.last_error["code"]) == (TaskState.QUEUED, 1, "unknown_step")
    assert task.last_error["step"] == "step_0" and "step_0" in task.last_error["message"]
    assert task.steps.get(name="step_0").status == StepStatus.FAILED


def test_a_step_that_crashes_with_megabytes_in_its_message_records_its_start_bounded(agent, settings, monkeypatch):
    """A step that put a whole answer in its exception: its crash was stored whole in the task's last
    error, its step row, its audit events and its dead letter, and every read of the task carried
    it. It is bounded as a provider's message is (docs/contract.md): its start, and how long it was."""
    settings.DRAIN_LANES, settings.MAX_ATTEMPTS = 1, 1
    said = "an answer of a shape nobody expected: " + "x" * (5 * 1024 * 1024)

    def provider(method, url, **kwargs):
        raise ValueError(said)

    monkeypatch.setattr(http, "call", provider)
    task, _ = task_request(agent=agent, task_id="t-long", workflow="refund", input=refund_input("ORD-L", "CUST-L"))
    drain_tasks()

    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.last_error["code"]) == (TaskState.DEAD_LETTERED, "crash")
    full = f"ValueError: {said}"
    for message in (task.last_error["message"], task.steps.get(name="lookup_order").error["message"],
                    task.dead_letters.get().last_error["message"]):
        assert len(message) <= http.MESSAGE_MAX_CHARS
        assert message.startswith("ValueError: an answer of a shape nobody expected: xxx")
        assert message.endswith(f" … [cut: {len(full)} characters in all]")
    assert all(len(event.reason) <= http.MESSAGE_MAX_CHARS and len(str(event.after)) < 2 * http.MESSAGE_MAX_CHARS
               for event in audit_events(task))
