"""Many identical requests at the same moment: one action, one effect, never a 5xx.

Each request has its own connection (its own httpx.Client in its own thread) and all of them
are released together by a barrier, against the real gunicorn server and RQ workers.
"""

from collections import Counter

import pytest
from django.db import connection

from ledger.actions import action_request
from ledger.models import Action
from tests.conftest import wait_until
from tests.factories import (agent_api, another_transaction, make_agent, post_action, refund_body, sandbox,
                             send_together)


def post_together(url, token, requests):
    """POST every (key, body) at once, one connection each; return the responses in order."""
    return send_together(url, token, [lambda client, k=key, b=body: post_action(client, k, b) for key, body in requests])


def test_fifty_identical_posts_at_once_make_one_action_and_one_refund(stack):
    client = agent_api(stack.url)
    key = "refund:ORD-50:full:dec-50"
    stack.start_worker()
    stack.start_worker()

    responses = post_together(stack.url, client.token, [(key, refund_body("ORD-50"))] * 50)

    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 1, 200: 49}, statuses
    replayed = [r for r in responses if r.status_code == 200]
    assert all(r.headers.get("Idempotent-Replayed") == "true" for r in replayed)
    assert "Idempotent-Replayed" not in next(r for r in responses if r.status_code == 201).headers
    assert {r.json()["operation_key"] for r in responses} == {key}
    assert Action.objects.filter(operation_key=key).count() == 1
    assert Action.objects.count() == 1

    done = wait_until(
        lambda: (a := client.get(f"/api/v1/actions/{key}").json())["status"] == "succeeded" and a,
        message="the refund to succeed",
    )
    refunds = sandbox(client, "GET", "refunds", params={"operation_key": key}).json()["data"]
    assert [r["id"] for r in refunds] == [done["external_ref"]]
    assert done["attempts"] == 1


def test_twenty_posts_of_one_key_with_different_amounts_let_one_win_and_refuse_the_rest(stack):
    client = agent_api(stack.url)
    key = "refund:ORD-20:full:dec-20"
    stack.start_worker()

    requests = [(key, refund_body("ORD-20", amount=f"{10 + i}.00")) for i in range(20)]
    responses = post_together(stack.url, client.token, requests)

    statuses = Counter(r.status_code for r in responses)
    assert not any(code >= 500 for code in statuses), statuses
    assert statuses[201] == 1, statuses
    assert set(statuses) <= {201, 200, 422}, statuses
    winner = next(r.json() for r in responses if r.status_code == 201)
    for response in responses:
        if response.status_code == 422:
            assert response.json()["code"] == "idempotency_key_reused"
        if response.status_code == 200:
            assert response.json()["params"] == winner["params"]
    action = Action.objects.get()
    assert action.params == winner["params"]

    wait_until(lambda: Action.objects.get().status == "succeeded", message="the refund to succeed")
    refunds = sandbox(client, "GET", "refunds", params={"order_id": "ORD-20"}).json()["data"]
    assert [r["amount"] for r in refunds] == [winner["params"]["amount"]]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis")
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises every writer")
def test_one_key_asked_twice_at_once_without_a_decision_is_one_action():
    """No decision names the effect, so no once-per-decision rule stands behind the key: its unique
    index alone makes the second request, which waited for the first one's commit, its replay
    (not a second action, held behind the first, then run as well)."""
    agent, _ = make_agent("billing")
    key = "refund:ORD-51:full"
    request = {"agent": agent, "operation_key": key, "action_type": "refund", "target": "ORD-51",
               "customer": "CUST-51", "params": {"amount": "25.00", "currency": "EUR"}}

    def first():
        assert action_request(**request)[1] is True

    with another_transaction(first, commit_when_waited_on=True) as other:
        action, created = action_request(**request)

    assert other.waited is True  # this request waited for the first one's commit
    assert created is False and action.operation_key == key
    assert list(Action.objects.values_list("operation_key", "status")) == [(key, "queued")]
