"""A dead-lettered task given up in the queue (discarded) or done by hand (resolved) never runs
again, and nothing else runs a task's action: the actions it had not started are cancelled with it,
and its failed ones are failed for good (given up, or done by hand: tests/dlq/test_done_by_hand.py).
Left queued, one counted as in flight on its order and customer for good, and every later action on
them was held for a person."""

import threading
import time
from decimal import Decimal

import pytest
from django.db import connection, transaction

from approvals.intake import customer_total_today
from dlq.entries import deadletter_discard, deadletter_redrive, deadletter_resolve
from ledger.actions import action_request
from ledger.audit import actor_label
from ledger import clock
from ledger.executor import action_claim_next, action_verify
from ledger.models import Action, ActionStatus, Task
from ledger.runner import task_run
from ledger.tasks import task_claim_next, task_request
from tests.factories import (api_client, audit_events, open_entry, person, refund_input, sandbox_list,
                             sandbox_order)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


def refund_in_its_call(agent, task_id, order, customer):
    """A refund task whose worker is in the refund's call: the task and its action, both claimed."""
    task, _ = task_request(agent=agent, task_id=task_id, workflow="refund", input=refund_input(order, customer))
    task.claim(owner="tests:1")
    action, _ = action_request(agent=agent, operation_key=f"{task_id}:call_refund_api:v1", action_type="refund",
                               target=order, customer=customer, decision_id=task_id, task=task,
                               params={"amount": "25.00", "currency": "EUR"})
    return task, action.claim(owner="tests:1")


def dead_lettered(task):
    """The task out of attempts: the sweeper found its worker gone."""
    task.refresh_from_db()
    task.mark_dead_lettered(actor="system:sweeper", claim=task.fence,
                            error={"code": "worker_lost", "message": "the lease lapsed", "retryable": True})


def given_up(task, decide):
    """A person discards the task's dead letter, or resolves it as done by hand."""
    olga = person("olga", "operators")
    if decide == "discard":
        deadletter_discard(open_entry(task), actor=olga, reason="refunded by hand")
    else:
        deadletter_resolve(open_entry(task), actor=olga, note="refunded by hand, ticket 8812")
    return olga


def dead_lettered_with_its_call_verified_absent(agent):
    """The worker was killed in the refund's call on the task's last attempt: the sweeper
    dead-lettered the task, and verification found no refund, so the action is queued again."""
    task, action = refund_in_its_call(agent, "t-1", "ORD-9", "CUST-9")
    dead_lettered(task)
    action.requeue(actor="system:executor", claim=action.fence, reason="verified absent at the provider")
    return task, action


def unknown(action):
    return action.mark_unknown(actor="system:sweeper", claim=action.fence, verify_at=clock.now(),
                               evidence={"lease_expired": True})


@pytest.mark.parametrize("decide", ["discard", "resolve"])
def test_a_task_given_up_cancels_what_it_had_not_started_and_holds_nothing(agent, decide):
    task, action = dead_lettered_with_its_call_verified_absent(agent)
    olga = given_up(task, decide)

    action.refresh_from_db()
    assert action.status == ActionStatus.CANCELLED
    [cancelled] = audit_events(action, "cancelled")
    assert "t-1" in cancelled.reason and cancelled.actor == actor_label(olga)
    later, _ = action_request(agent=agent, operation_key="refund:ORD-10:full:dec-1", action_type="refund",
                              target="ORD-10", customer="CUST-9", decision_id="dec-1",
                              params={"amount": "5.00", "currency": "EUR"})
    assert later.status == ActionStatus.QUEUED
    assert action_claim_next("tests:2").pk == later.pk


@pytest.mark.parametrize("attempts_left", [True, False], ids=["attempts_left", "its_last_attempt"])
@pytest.mark.parametrize("decide", ["discard", "resolve"])
def test_an_action_of_a_task_given_up_verified_absent_afterwards_fails_rather_than_waits_queued(
        stack, agent, settings, decide, attempts_left):
    """The other order: the task is given up while its call's outcome is still unknown, and only
    then does verification find no refund. Queued again, the action would never run (a resolved
    task stays dead-lettered, with no entry to redrive it; a discarded one is cancelled) and would
    hold its order and customer for good: it fails for good instead, and what it held goes on.
    Resolved, the person did it by hand: done by hand, as a failure before the resolve is (it
    stays in its customer's daily total), on its last attempt too; discarded, given up."""
    if not attempts_left:
        settings.MAX_ATTEMPTS = 1
    task, action = refund_in_its_call(agent, "t-2", "ORD-8", "CUST-8")
    unknown(action)
    dead_lettered(task)
    given_up(task, decide)

    held, _ = action_request(agent=agent, operation_key="refund:ORD-8:full:dec-2", action_type="refund",
                             target="ORD-8", customer="CUST-88", decision_id="dec-2",
                             params={"amount": "5.00", "currency": "EUR"})
    assert held.status == ActionStatus.HELD  # behind the unknown one
    action_verify(action_claim_next("tests:2", only=action.pk))  # the stack's sandbox holds no such refund
    action.refresh_from_db()
    # Discarded (cancelled) or resolved by hand (dead-lettered, its entry closed), the task never runs
    # again: failed for good, and what it held goes on.
    assert (action.status, action.error["code"], action.error["retryable"]) == (
        ActionStatus.FAILED, "task_not_running", False)
    assert action.is_done_by_hand == (decide == "resolve")
    # Discarded, a person gave it up: the action says so, as one failed before the discard does,
    # and so does its task's checkpoint.
    assert action.error.get("given_up", False) == (decide == "discard")
    assert Task.objects.get(pk=task.pk).last_error.get("given_up", False) == (decide == "discard")
    assert customer_total_today("refund", "EUR", "CUST-8") == (Decimal("25.00") if decide == "resolve" else 0)
    assert Action.objects.get(pk=held.pk).status == ActionStatus.QUEUED
    later, _ = action_request(agent=agent, operation_key="refund:ORD-11:full:dec-1", action_type="refund",
                              target="ORD-11", customer="CUST-8", decision_id="dec-1",
                              params={"amount": "5.00", "currency": "EUR"})
    assert later.status == ActionStatus.QUEUED


def test_a_dead_lettered_tasks_action_that_failed_while_it_waited_is_retried_when_it_is_redriven(stack, agent):
    """Verified absent while its task waited in the queue, the action failed as retryable rather
    than queued: redriven, the task's runner tries it again, and the refund is made once."""
    provider = api_client(stack.url, agent.token)
    sandbox_order(provider, "ORD-7", "CUST-7")
    task, action = refund_in_its_call(agent, "t-3", "ORD-7", "CUST-7")
    unknown(action)
    dead_lettered(task)
    action_verify(action_claim_next("tests:2", only=action.pk))
    action.refresh_from_db()
    assert (action.status, action.error["code"]) == (ActionStatus.FAILED, "task_not_running")

    deadletter_redrive(open_entry(task), actor=person("olga", "operators"), reason="the provider is back")
    task_run(task_claim_next("tests:3", only=task.pk))
    action.refresh_from_db()
    assert action.status == ActionStatus.SUCCEEDED
    assert Task.objects.get(pk=task.pk).state == "succeeded"
    assert len(sandbox_list(provider, "refunds", order_id="ORD-7")) == 1


@pytest.mark.parametrize("decide", ["discard", "resolve"])
def test_a_failed_action_of_a_task_given_up_lets_go_of_what_it_held(agent, decide):
    """A task's action failed (its runner may retry it) and kept another agent's refund on the same
    customer held for that retry. The task given up, no retry comes: the held one goes on."""
    task, action = dead_lettered_with_its_call_verified_absent(agent)
    action.claim(owner="tests:2")
    other, _ = action_request(agent=agent, operation_key="refund:ORD-12:full:dec-1", action_type="refund",
                              target="ORD-12", customer="CUST-9", decision_id="dec-1",
                              params={"amount": "5.00", "currency": "EUR"})
    assert other.status == ActionStatus.HELD
    action.refresh_from_db()
    action.mark_failed(actor="system:executor", code="connect_failed", message="never reached the provider",
                       retryable=True, claim=action.fence)
    assert Action.objects.get(pk=other.pk).status == ActionStatus.HELD

    given_up(task, decide)

    assert Action.objects.get(pk=other.pk).status == ActionStatus.QUEUED
    assert Action.objects.get(pk=action.pk).status == ActionStatus.FAILED


@pytest.mark.parametrize("decide", ["discard", "resolve"])
@pytest.mark.parametrize("stopped", ["dead_lettered", "failed"])
def test_a_failed_refund_of_a_task_given_up_is_failed_for_good(agent, stopped, decide):
    """The task's refund failed as one its runner may retry, then the task stopped: out of attempts,
    or failed for good. Given up (discarded, or done by hand), the task never runs again, and
    nothing else retries its action: left `retryable`, its agent read that it may still run. It is
    failed for good instead. Discarded, it leaves the customer's daily total (it counted there for
    nothing, sending their later refunds to approvers), as a standalone action discarded does
    (action_give_up); done by hand, the person refunded the customer, and it stays counted
    (action_done_by_hand)."""
    task, action = refund_in_its_call(agent, "t-5", "ORD-14", "CUST-14")
    action.mark_failed(actor="system:executor", code="provider_unavailable", message="503", retryable=True,
                       claim=action.fence)
    task.refresh_from_db()
    if stopped == "dead_lettered":
        dead_lettered(task)
    else:
        task.mark_failed(actor="system:runner", claim=task.fence,
                         error={"code": "order_not_found", "message": "no such order", "retryable": False})
    assert customer_total_today("refund", "EUR", "CUST-14") == Decimal("25.00")

    olga = given_up(task, decide)

    action.refresh_from_db()
    assert (action.status, action.error["retryable"]) == (ActionStatus.FAILED, False)
    [gave_up] = audit_events(action, "given_up" if decide == "discard" else "done_by_hand")
    assert gave_up.actor == actor_label(olga) and "t-5" in gave_up.reason
    assert customer_total_today("refund", "EUR", "CUST-14") == (Decimal(0) if decide == "discard" else Decimal("25.00"))


@pytest.mark.django_db(transaction=True)
def test_a_discard_committing_while_the_action_is_verified_absent_leaves_its_failure_for_good(stack, agent):
    """The task's state was read without a lock: a discard that had moved the task (its entry with
    it) but not committed yet was not seen, and the action failed as one a person may still
    redrive under a task that never runs again, keeping what it held for good. The read waits for
    the discard's commit now."""
    task, action = refund_in_its_call(agent, "t-4", "ORD-13", "CUST-13")
    unknown(action)
    dead_lettered(task)
    claimed = action_claim_next("tests:2", only=action.pk)
    moved, done = threading.Event(), threading.Event()

    def discard_slowly():
        try:
            with transaction.atomic():
                Task.objects.select_for_update().get(pk=task.pk)
                given_up(task, "discard")
                moved.set()
                time.sleep(1)
        finally:
            done.set()
            connection.close()

    threading.Thread(target=discard_slowly).start()
    assert moved.wait(10)
    action_verify(claimed)  # the stack's sandbox holds no such refund
    assert done.wait(10)
    action.refresh_from_db()
    assert (action.status, action.error["code"], action.error["retryable"]) == (
        ActionStatus.FAILED, "task_not_running", False)
