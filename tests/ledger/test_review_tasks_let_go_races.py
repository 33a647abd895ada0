"""A task given up (its dead letter discarded) or done by hand (resolved) while one of its actions
not started yet moves at the same moment: a person rejects or approves the one awaiting approval,
or its approval window closes (the sweeper). The actions not started were listed without a lock,
then cancelled one by one: one rejected or expired meanwhile refused its cancel, and the person
at the dead letter was told "Not done", the entry left open. They are listed under their locks
now, waiting for a move under way: the give-up goes through, and no action of the task may run."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.decisions import review_decide
from approvals.models import Limit, ReviewItem
from approvals.reviews import approval_expire_due
from dlq.entries import deadletter_discard, deadletter_resolve
from dlq.models import EntryStatus
from ledger.actions import action_request
from ledger.models import ActionStatus
from ledger.tasks import task_request
from tests.factories import another_transaction, open_entry, person, refund_input

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


def dead_lettered_awaiting_approval(agent):
    """A refund task whose run recorded its refund, over the limit so awaiting approval, and whose
    worker died before the task waited for it: out of attempts, the sweeper dead-lettered it."""
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), approval_expires_after_hours=6)
    task, _ = task_request(agent=agent, task_id="t-race", workflow="refund",
                           input=refund_input("ORD-R", "CUST-R", amount="750.00"))
    task = task.claim(owner="tests:1")
    action, _ = action_request(agent=agent, operation_key="t-race:call_refund_api:v1", action_type="refund",
                               target="ORD-R", customer="CUST-R", decision_id="t-race", task=task,
                               params={"amount": "750.00", "currency": "EUR"})
    assert action.status == ActionStatus.AWAITING_APPROVAL
    task.refresh_from_db()
    task.mark_dead_lettered(actor="system:sweeper", claim=task.fence,
                            error={"code": "worker_lost", "message": "the lease lapsed", "retryable": True})
    return task, action


def decided(action, move):
    """What moves the action awaiting approval: a person's rejection or approval, or the sweeper."""
    item = ReviewItem.objects.get(action=action)
    if move == "expire":
        return lambda: approval_expire_due(now=item.expires_at + timedelta(seconds=1))
    return lambda: review_decide(item, user=person("alice", "approvers"), decision=move, reason="looked at it")


@pytest.mark.parametrize("give_up", ["discard", "resolve"])
@pytest.mark.parametrize("move, ends", [("reject", ActionStatus.REJECTED), ("expire", ActionStatus.EXPIRED),
                                        # queued, still not started: cancelled, not passed over
                                        ("approve", ActionStatus.CANCELLED)])
def test_a_task_given_up_while_its_action_awaiting_approval_is_decided_goes_through(agent, give_up, move, ends):
    task, action = dead_lettered_awaiting_approval(agent)
    entry, olga = open_entry(task), person("olga", "operators")

    with another_transaction(decided(action, move), commit_when_waited_on=True) as other:
        if give_up == "discard":
            entry = deadletter_discard(entry, actor=olga, reason="refunded by hand")
        else:
            entry = deadletter_resolve(entry, actor=olga, note="refunded by hand, ticket 9120")
    assert other.waited  # the give-up waited for the decision's commit

    assert entry.status == (EntryStatus.DISCARDED if give_up == "discard" else EntryStatus.RESOLVED)
    action.refresh_from_db()
    assert action.status == ends
    assert not task.actions.filter(status__in=[ActionStatus.QUEUED, ActionStatus.HELD,
                                               ActionStatus.AWAITING_APPROVAL]).exists()


def test_a_give_up_locks_each_action_not_started_once(agent):
    """The list locks the actions it cancels; each cancel moves its action under that lock, not
    reading it FOR UPDATE again (a round trip per action)."""
    task, action = dead_lettered_awaiting_approval(agent)
    with CaptureQueriesContext(connection) as queries:
        deadletter_discard(open_entry(task), actor=person("olga", "operators"), reason="not needed")

    action.refresh_from_db()
    assert action.status == ActionStatus.CANCELLED
    action_locks = [q["sql"] for q in queries.captured_queries
                    if "FOR UPDATE" in q["sql"] and 'FROM "ledger_action"' in q["sql"]]
    assert len(action_locks) == 1, action_locks
