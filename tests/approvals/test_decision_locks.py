"""A decision locks each of its rows once: the action, then its review item, and nothing else
(the moves that follow are told the rows are locked; the item's reaction to the action's move
reads without a lock). Counted on the statements PostgreSQL receives."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.decisions import review_decide
from approvals.models import Limit, ReviewItem
from ledger.actions import action_request
from tests.factories import make_agent, person

pytestmark = pytest.mark.django_db


@pytest.fixture
def item():
    agent, _ = make_agent("billing-bot")
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    action, _ = action_request(agent=agent, operation_key="r1", action_type="refund", target="ORD-1",
                               customer="CUST-1", params={"amount": "750.00", "currency": "EUR"})
    return ReviewItem.objects.get(action=action)


def locks_taken(decide):
    """The tables of the rows each SELECT ... FOR UPDATE the decision sends locks, in order."""
    with CaptureQueriesContext(connection) as queries:
        decide()
    return [q["sql"].split(" FROM ", 1)[1].split()[0].strip('"') for q in queries.captured_queries
            if q["sql"].startswith("SELECT") and "FOR UPDATE" in q["sql"]]


@pytest.mark.parametrize(("decision", "action_status"), [("approve", "queued"), ("reject", "rejected")])
def test_a_decision_locks_the_action_and_its_item_once_each(item, decision, action_status):
    alice = person("alice", "approvers")

    locked = locks_taken(lambda: review_decide(item, user=alice, decision=decision, reason="checked the order"))

    assert locked == ["ledger_action", "approvals_reviewitem"]
    item.refresh_from_db()
    assert (item.status, item.action.status) == ({"approve": "approved", "reject": "rejected"}[decision], action_status)
