"""A task's action whose outcome a person decides after the task stopped for good.

The worker is killed in the refund's call, on the task's only attempt: the sweeper finds the
action's lease lapsed (unknown) and dead-letters the task (`worker_lost`); the look at the provider
fails (the sandbox's `lookup_error`), so the action needs a person. A person then discards the
task's dead letter, or resolves it by hand: an action needing review is not one the give-up lets
go of (ledger.tasks.task_actions_let_go), it is the review's to settle. Later the person at the
review marks it failed ("confirmed absent"). It was left `failed`, `retryable: true`, under a task
that never runs again: its agent read that a retry would come, the refund held behind it stayed
held, and it stayed in its customer's daily total for a retry that never comes. It is failed for
good now, by the rule a verification that finds it absent follows (ledger.executor): given up with
the discard, done by hand with the resolve.

The states are reached through the ledger's own moves (the claim, the sweeper's, the executor's
look against the stack's sandbox, the dead letter's and the review's decisions), without a worker
to kill.

The failure marked while a person redrives the task's dead letter: the decision locked the action,
then the task (to read whether it stopped), the redrive the task, then its actions (entries, tasks,
then actions), and PostgreSQL broke the deadlock by rolling one of them back. The decision takes
the task's lock first now: the redrive waits for it, then redrives a task whose action may be retried."""

import threading
from datetime import timedelta
from decimal import Decimal

import pytest

from approvals import decisions
from approvals.decisions import review_decide
from approvals.intake import customer_total_today
from approvals.models import ReviewItem
from dlq.entries import deadletter_discard, deadletter_redrive, deadletter_resolve
from dlq.models import DeadLetter, EntryStatus
from ledger import clock
from ledger.actions import action_request
from ledger.executor import action_claim_next, action_expire_leases, action_verify
from ledger.models import Action, ActionStatus, Task, TaskState
from ledger.resources import action_resource
from ledger.tasks import task_request
from tests.conftest import wait_until
from tests.factories import (api_client, in_a_thread, open_entry, person, refund_input, sandbox,
                             sessions_waiting_for_a_lock)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

ORDER, CUSTOMER = "ORD-31", "CUST-31"


def needing_review_under_a_dead_lettered_task(stack, agent, settings):
    """The task's one attempt, its worker gone in the refund's call, its outcome a person's to
    decide. The sweeper's move of the task (ledger.tasks.task_expire_leases: out of attempts,
    dead-lettered) is made as it makes it: its lease is told by the database's clock, which the
    test does not move."""
    settings.MAX_ATTEMPTS = 1
    task, _ = task_request(agent=agent, task_id="t-31", workflow="refund", input=refund_input(ORDER, CUSTOMER))
    task = task.claim(owner="tests:1")
    key = "t-31:call_refund_api:v1"
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target=ORDER,
                               customer=CUSTOMER, decision_id="t-31", task=task,
                               params={"amount": "25.00", "currency": "EUR"})
    action.claim(owner="tests:1")
    # The worker is killed in the call. The sweeper: the action's lease lapsed (and the call's
    # timeout after it), and the task's, its one attempt spent.
    lapsed = clock.now() + timedelta(seconds=settings.LEASE_SECONDS + settings.CONNECTOR_TIMEOUT + 1)
    assert action_expire_leases(now=lapsed) == 1
    task.refresh_from_db()
    task.mark_dead_lettered(actor="system:sweeper", claim=task.fence,
                            error={"code": "worker_lost", "message": "the lease lapsed", "retryable": True})
    with api_client(stack.url, agent.token) as provider:  # the look at the provider answers 500
        armed = sandbox(provider, "POST", "faults", json={"target": key, "fault": "lookup_error", "times": 1})
    assert armed.status_code == 201, armed.text
    action_verify(action_claim_next("tests:2", only=action.pk))
    action.refresh_from_db()
    assert action.status == ActionStatus.NEEDS_REVIEW
    return task, action


@pytest.mark.parametrize("decide", ["discard", "resolve", "nothing yet"])
def test_an_action_marked_failed_after_its_task_was_given_up_is_failed_for_good(stack, agent, settings, decide):
    task, action = needing_review_under_a_dead_lettered_task(stack, agent, settings)
    behind, _ = action_request(agent=agent, operation_key="refund:ORD-31:full:dec-9", action_type="refund",
                               target=ORDER, customer="CUST-32", decision_id="dec-9",
                               params={"amount": "5.00", "currency": "EUR"})
    assert behind.status == ActionStatus.HELD  # behind the one whose outcome is not known
    olga = person("olga", "operators")
    if decide == "discard":
        deadletter_discard(open_entry(task), actor=olga, reason="the customer withdrew the claim")
    elif decide == "resolve":
        deadletter_resolve(open_entry(task), actor=olga, note="refunded by bank transfer, ticket 8812")
    assert Action.objects.get(pk=action.pk).status == ActionStatus.NEEDS_REVIEW  # the review's to settle

    review_decide(ReviewItem.objects.get(action=action, status="open"), user=person("alice", "approvers"),
                  decision="mark_failed", reason="not in the provider's dashboard")

    action.refresh_from_db()
    error = action_resource(action)["error"]
    assert (action.status, error["code"]) == (ActionStatus.FAILED, "confirmed_absent")
    if decide == "nothing yet":
        # A person may still redrive the task: its runner retries the refund (looking first).
        assert error["retryable"] is True and "given_up" not in error and "done_by_hand" not in error
        assert Action.objects.get(pk=behind.pk).status == ActionStatus.HELD
        assert customer_total_today("refund", "EUR", CUSTOMER) == Decimal("25.00")
        return
    # Nothing will retry it, and it says so, as the task's checkpoint does.
    assert error["retryable"] is False
    assert error.get("given_up", False) == (decide == "discard") == task_mark(task, "given_up")
    assert error.get("done_by_hand", False) == (decide == "resolve") == task_mark(task, "done_by_hand")
    # What it held goes on.
    assert Action.objects.get(pk=behind.pk).status == ActionStatus.QUEUED
    # Given up, it leaves its customer's daily total; done by hand, the person refunded them.
    assert customer_total_today("refund", "EUR", CUSTOMER) == (Decimal(0) if decide == "discard"
                                                               else Decimal("25.00"))


def task_mark(task, mark):
    return bool(Task.objects.get(pk=task.pk).last_error.get(mark))


def test_a_failure_marked_while_the_task_is_redriven_waits_for_the_redrive_rather_than_deadlocking(
        stack, agent, settings, monkeypatch):
    """The decision is held inside its read of the task (`task_stopped`) until the redrive waits for a
    lock (or has finished): each then holds what the other comes for if they take them in two orders."""
    task, action = needing_review_under_a_dead_lettered_task(stack, agent, settings)
    item, entry = ReviewItem.objects.get(action=action, status="open"), open_entry(task)
    alice, olga = person("alice", "approvers"), person("olga", "operators")
    inside, go_on = threading.Event(), threading.Event()
    read_whether_stopped = decisions.task_stopped

    def held_inside(action):
        inside.set()
        assert go_on.wait(30)
        return read_whether_stopped(action)

    monkeypatch.setattr(decisions, "task_stopped", held_inside)
    marking, marked = in_a_thread(lambda: review_decide(
        item, user=alice, decision="mark_failed", reason="not in the provider's dashboard"))
    assert inside.wait(30)
    redriving, redriven = in_a_thread(lambda: deadletter_redrive(entry, actor=olga, reason="the provider is back"))
    wait_until(lambda: sessions_waiting_for_a_lock() or not redriving.is_alive(), seconds=30,
               message="the redrive to wait for a lock the decision holds")
    go_on.set()
    marking.join(30)
    redriving.join(30)

    outcomes = {"mark_failed": marked[0], "redrive": redriven[0]}
    assert not isinstance(outcomes["mark_failed"], BaseException), outcomes
    assert not isinstance(outcomes["redrive"], BaseException), outcomes
    # Marked failed first, while its task could still run it: retryable, and the redrive runs it again.
    action.refresh_from_db()
    error = action_resource(action)["error"]
    assert (action.status, error["code"], error["retryable"]) == (ActionStatus.FAILED, "confirmed_absent", True)
    assert Task.objects.get(pk=task.pk).state == TaskState.QUEUED
    assert DeadLetter.objects.get(pk=entry.pk).status == EntryStatus.REDRIVEN
