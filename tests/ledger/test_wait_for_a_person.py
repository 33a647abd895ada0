"""`GET /api/v1/actions/{key}?wait=N` holds only while the ledger is working on the action:
one that waits for a person (awaiting approval, held, needs review) answers at once, since a
decision can take hours. This is the documented behaviour (docs/api.md, docs/contract.md)."""

import time
from decimal import Decimal

import pytest

from approvals.models import Limit
from tests.factories import api_client, make_agent, post_action, refund_body

pytestmark = pytest.mark.django_db(transaction=True)


def test_wait_answers_at_once_for_an_action_awaiting_approval(stack):
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"))
    _, token = make_agent("wait-bot")
    with api_client(stack.url, token) as api:
        key = "refund:ORD-W1:full:dec-w1"
        assert post_action(api, key, refund_body(order="ORD-W1", amount="900.00")).status_code == 201
        started = time.monotonic()
        answer = api.get(f"/api/v1/actions/{key}", params={"wait": 10})
        took = time.monotonic() - started
    assert answer.status_code == 200 and answer.json()["status"] == "awaiting_approval"
    assert took < 2, f"held for {took:.1f}s"
