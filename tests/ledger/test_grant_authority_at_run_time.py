"""A grant's authority holds where the work runs, not only where it is asked: a task's step
action obeys the agent's grant for its action type as a direct request does (shadow: recorded
`shadow`, never executed, the task fails `shadow`; none: `forbidden`), and a revoke, or a
grant shadow again, stops actions already queued when a worker claims them."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.actions import action_request
from ledger.executor import action_claim_next
from ledger.grants import agent_grant, agent_revoke, capability
from ledger.models import Action, ActionStatus, Capability, Task, TaskState
from ledger.runner import task_run
from ledger.tasks import task_claim_next, task_request
from tests.conftest import wait_until
from tests.factories import (
    api_client, audit_events, make_agent, make_grants_live, post_action, post_task, refund_body, refund_input,
    refund_task_body, sandbox_list, sandbox_order, settled,
)

REFUND = Capability.Kind.ACTION_TYPE, "refund"


def test_a_refund_task_under_a_shadow_grant_never_reaches_the_provider_and_fails_shadow(stack):
    agent, token = make_agent("scout", grants=("refund", "send_message"), live=False)
    client = api_client(stack.url, token)
    sandbox_order(client, "ORD-S1", "CUST-S1")
    assert post_task(client, "refund-s1", refund_task_body("ORD-S1", customer="CUST-S1")).status_code == 201
    stack.start_worker()

    task = settled(Task.objects.get(task_id="refund-s1"))
    assert (task.state, task.attempts, task.last_error["code"]) == (TaskState.FAILED, 1, "shadow")
    steps = client.get("/api/v1/tasks/refund-s1").json()["steps"]
    assert steps["lookup_order"]["status"] == "done"
    assert steps["call_refund_api"]["status"] == "failed"
    assert steps["call_refund_api"]["error"]["code"] == "shadow"
    assert "never executed" in steps["call_refund_api"]["error"]["message"]
    assert [steps[s]["status"] for s in ("write_confirmation", "notify_customer")] == ["pending", "pending"]
    action = Action.objects.get(operation_key="refund-s1:call_refund_api:v1")
    assert (action.status, action.attempts) == (ActionStatus.SHADOW, 0)
    time.sleep(1)  # the worker had its chance
    assert sandbox_list(client, "refunds", order_id="ORD-S1") == []
    assert not Action.objects.filter(task=task, action_type="send_message").exists()


def test_the_same_task_under_live_grants_refunds_once(stack):
    agent, token = make_agent("scout", grants=("refund", "send_message"))
    client = api_client(stack.url, token)
    sandbox_order(client, "ORD-S2", "CUST-S2")
    post_task(client, "refund-s2", refund_task_body("ORD-S2", customer="CUST-S2"))
    stack.start_worker()
    assert settled(Task.objects.get(task_id="refund-s2")).state == TaskState.SUCCEEDED
    assert len(sandbox_list(client, "refunds", order_id="ORD-S2")) == 1


def test_a_workflow_grant_gives_no_authority_over_its_steps_action_types(db, settings):
    settings.SANDBOX_BASE_URL = "http://127.0.0.1:9/sandbox/v1"  # never reached: the look-up is done below
    agent, _ = make_agent("flow-only", grants=())
    agent_grant(agent, capability(Capability.Kind.WORKFLOW, "refund"), actor="system:tests", reason="tests")
    task, _ = task_request(agent=agent, task_id="refund-f1", workflow="refund", input=refund_input("ORD-F1", "C-F1"))
    task.steps.filter(name="lookup_order").update(status="done", result={"order_id": "ORD-F1"})

    task = task_run(task_claim_next("tests:1", only=task.pk))
    assert (task.state, task.last_error["code"]) == (TaskState.FAILED, "forbidden")
    assert not Action.objects.filter(task=task).exists()


def test_a_step_never_takes_an_action_recorded_outside_its_task(db, settings):
    """Task ids are often guessable (`task:refund:<order>:<decision>`), and so its steps' keys:
    another agent that records the step's key first, with the very params, must not have its
    action taken for the task's (its grant, its approvals, its reference)."""
    settings.SANDBOX_BASE_URL = "http://127.0.0.1:9/sandbox/v1"  # never reached: the look-up is done below
    agent, other = make_agent("billing", grants=("refund",))[0], make_agent("squatter", grants=("refund",))[0]
    task, _ = task_request(agent=agent, task_id="refund-q1", workflow="refund", input=refund_input("ORD-Q1", "C-Q1"))
    task.steps.filter(name="lookup_order").update(status="done", result={"order_id": "ORD-Q1"})
    squatted, _ = action_request(agent=other, operation_key="refund-q1:call_refund_api:v1", action_type="refund",
                                 target="ORD-Q1", customer="C-Q1", decision_id="refund-q1",
                                 params={"amount": "25.00", "currency": "EUR"})

    task = task_run(task_claim_next("tests:1", only=task.pk))
    assert (task.state, task.last_error["code"]) == (TaskState.FAILED, "idempotency_key_reused")
    assert "outside this task" in task.last_error["message"]
    assert Action.objects.get(pk=squatted.pk).task_id is None and not Action.objects.filter(task=task).exists()


@pytest.mark.parametrize("first", ["direct", "another task"])
def test_one_refund_per_order_and_decision_holds_across_tasks_and_direct_requests(db, settings, first):
    """A restarted model that asks for a decision's refund once directly and once as a task (or
    as two tasks, under two scopes) refunded twice: a task's refund was keyed by its task alone.
    Carrying the decision in its input, it is that decision's one refund."""
    settings.SANDBOX_BASE_URL = "http://127.0.0.1:9/sandbox/v1"  # never reached: the look-up is done below
    agent, _ = make_agent("billing", grants=("refund",))
    refund = {**refund_input("ORD-D1", "C-D1"), "decision_id": "dec-1"}
    if first == "direct":
        action_request(agent=agent, operation_key="refund:ORD-D1:dec-1", action_type="refund", target="ORD-D1",
                       customer="C-D1", decision_id="dec-1", params={"amount": "25.00", "currency": "EUR"})
    else:
        earlier, _ = task_request(agent=agent, task_id="task:refund:ORD-D1:full:dec-1", workflow="refund",
                                  input=refund)
        earlier.steps.filter(name="lookup_order").update(status="done", result={"order_id": "ORD-D1"})
        task_run(task_claim_next("tests:1", only=earlier.pk))
    task, _ = task_request(agent=agent, task_id="task:refund:ORD-D1:dec-1", workflow="refund", input=refund)
    task.steps.filter(name="lookup_order").update(status="done", result={"order_id": "ORD-D1"})

    task = task_run(task_claim_next("tests:1", only=task.pk))
    assert (task.state, task.last_error["code"]) == (TaskState.FAILED, "idempotency_key_reused")
    assert Action.objects.filter(action_type="refund", target="ORD-D1").count() == 1
    # The other way round, a direct request for the decision is answered with the refund made.
    again, created = action_request(agent=agent, operation_key="refund:ORD-D1:v2:dec-1", action_type="refund",
                                    target="ORD-D1", customer="C-D1", decision_id="dec-1",
                                    params={"amount": "25", "currency": "EUR"})
    assert not created and again.operation_key != "refund:ORD-D1:v2:dec-1"


def test_a_step_whose_action_succeeded_before_a_revoke_goes_on_from_it(db, settings, jobs_to_test_redis):
    settings.SANDBOX_BASE_URL = "http://127.0.0.1:9/sandbox/v1"  # the refund is settled below, by hand
    agent, _ = make_agent("billing", grants=("refund", "send_message"))
    task, _ = task_request(agent=agent, task_id="refund-v1", workflow="refund", input=refund_input("ORD-V1", "C-V1"))
    task.steps.filter(name="lookup_order").update(status="done", result={"order_id": "ORD-V1"})
    task = task_claim_next("tests:1", only=task.pk)
    # The step's refund succeeded, and its worker stopped before the step was checkpointed done.
    action, _ = action_request(agent=agent, operation_key="refund-v1:call_refund_api:v1", action_type="refund",
                               target="ORD-V1", customer="C-V1", params={"amount": "25.00", "currency": "EUR"},
                               task=task, decision_id=task.task_id)
    claimed = action_claim_next("tests:1", only=action.pk)
    claimed.mark_succeeded(actor="system:tests", external_ref="re_v1", result={"id": "re_v1"}, claim=claimed.fence)
    agent_revoke(agent, capability(*REFUND), actor="system:tests", reason="the agent misbehaved")

    task = task_run(task)
    step = task.steps.get(name="call_refund_api")
    assert (step.status, step.result["external_ref"]) == ("done", "re_v1")
    # It went on from the refund: the confirmation was written from its reference.
    assert task.steps.get(name="write_confirmation").result["external_ref"] == "re_v1"
    assert Action.objects.filter(task=task, action_type="refund").count() == 1


@pytest.fixture
def queued_refund(stack):
    """A live agent's refund, recorded by the API and queued while no worker runs yet."""
    agent, token = make_agent("billing", grants=("refund",))
    client = api_client(stack.url, token)
    answer = post_action(client, "refund:ORD-R1:full:dec-1", refund_body("ORD-R1", customer="CUST-R1"))
    assert answer.json()["status"] == "queued", answer.text
    return agent, client, Action.objects.get(operation_key="refund:ORD-R1:full:dec-1")


def test_a_revoke_cancels_an_action_already_queued_before_it_reaches_the_provider(stack, queued_refund):
    agent, client, action = queued_refund
    agent_revoke(agent, capability(*REFUND), actor="system:tests", reason="the agent misbehaved")
    stack.start_worker()

    action = wait_until(lambda: (a := Action.objects.get(pk=action.pk)).status != ActionStatus.QUEUED and a,
                        message="the worker to take the action")
    assert (action.status, action.attempts) == (ActionStatus.CANCELLED, 0)
    event = audit_events(action, "cancelled").get()
    assert event.actor == "system:executor" and event.reason.startswith("grant revoked")
    assert sandbox_list(client, "refunds", order_id="ORD-R1") == []
    assert client.get("/api/v1/actions/refund:ORD-R1:full:dec-1").json()["status"] == "cancelled"


def test_a_grant_shadow_again_past_its_review_date_cancels_what_it_had_queued(stack, queued_refund):
    agent, client, action = queued_refund
    make_grants_live(agent, until=timezone.now() - timedelta(seconds=1))  # its review date has passed
    stack.start_worker()

    action = wait_until(lambda: (a := Action.objects.get(pk=action.pk)).status != ActionStatus.QUEUED and a,
                        message="the worker to take the action")
    assert action.status == ActionStatus.CANCELLED
    assert audit_events(action, "cancelled").get().reason.startswith("grant not live")
    assert sandbox_list(client, "refunds", order_id="ORD-R1") == []


def test_the_claims_grant_check_costs_no_statement_while_the_agents_grants_are_unchanged(db, jobs_to_test_redis):
    agent, _ = make_agent("billing", grants=("refund",))
    keys = [f"refund:ORD-Q{n}:full:dec-{n}" for n in range(3)]
    for n, key in enumerate(keys):
        action_request(agent=agent, operation_key=key, action_type="refund", target=f"ORD-Q{n}",
                       params={"amount": "5.00", "currency": "EUR"})
    action_claim_next("tests:1")  # the first claim of this agent reads its grant once
    for _ in keys[1:]:
        with CaptureQueriesContext(connection) as claim:
            assert action_claim_next("tests:1").status == ActionStatus.PENDING
        looked_up = [q["sql"] for q in claim.captured_queries if "guardian" in q["sql"] or "ledger_grant" in q["sql"]]
        assert looked_up == [], looked_up
        assert not [q for q in claim.captured_queries if "ledger_agent" in q["sql"] and "ledger_action" not in q["sql"]]
