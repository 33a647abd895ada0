"""POST /api/v1/tasks: many identical requests at once make one task that runs once; and the
other answers of the contract (422, 400, 403, 404, ?wait=N)."""

import time
from collections import Counter

import pytest
from rq import Worker

from console.sweeper import sweep_once
from ledger import jobs
from ledger.models import Action, Task
from tests.conftest import wait_until
from tests.factories import (agent_api, audit_events, post_task, refund_task_body, sandbox, sandbox_order,
                             sandbox_without_idempotency, send_together)


def refund_task(amount="25.00"):
    return refund_task_body("ORD-30", amount, "CUST-30")


def post_together(url, token, task_id, body, count):
    """POST the same task `count` times at once, each on its own connection and thread."""
    return send_together(url, token, [lambda client: post_task(client, task_id, body)] * count)


@pytest.fixture
def client(stack):
    client = agent_api(stack.url, grants=("refund", "send_message"))
    sandbox_without_idempotency(client)
    sandbox_order(client, "ORD-30", "CUST-30")
    return client


def test_thirty_identical_posts_at_once_make_one_task_that_refunds_once(stack, client):
    responses = post_together(stack.url, client.token, "refund-30", refund_task(), 30)

    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 1, 200: 29}, [(r.status_code, r.text[:200]) for r in responses if r.status_code >= 300]
    assert all(r.headers.get("Idempotent-Replayed") == "true" for r in responses if r.status_code == 200)
    assert "Idempotent-Replayed" not in next(r for r in responses if r.status_code == 201).headers
    assert {r.json()["task_id"] for r in responses} == {"refund-30"}
    assert Task.objects.count() == 1
    task = Task.objects.get()
    assert audit_events(task, "requested").count() == 1

    stack.start_worker()
    stack.start_worker()

    def settled():
        sweep_once()
        return (t := client.get("/api/v1/tasks/refund-30").json())["state"] not in ("queued", "running") and t

    done = wait_until(settled, seconds=30, interval=0.2, message="the task to settle")
    assert done["state"] == "succeeded", done
    assert done["attempts"] == 1
    refunds = sandbox(client, "GET", "refunds", params={"order_id": "ORD-30"}).json()["data"]
    assert [r["operation_key"] for r in refunds] == ["refund-30:call_refund_api:v1"]
    messages = sandbox(client, "GET", "messages", params={"operation_key": "refund-30:notify_customer:v1"}).json()["data"]
    assert len(messages) == 1
    assert Action.objects.count() == 2


def test_the_same_task_id_with_a_different_input_is_refused_and_changes_nothing(stack, client):
    assert post_task(client, "refund-31", refund_task()).status_code == 201
    response = post_task(client, "refund-31", refund_task(amount="99.00"))
    assert response.status_code == 422
    assert response.headers["Content-Type"].startswith("application/problem+json")
    assert response.json()["code"] == "idempotency_key_reused"
    assert Task.objects.get(task_id="refund-31").input["amount"] == "25.00"
    assert Task.objects.count() == 1


def test_a_task_without_an_idempotency_key_is_refused(stack, client):
    response = client.post("/api/v1/tasks", json=refund_task())
    assert response.status_code == 400
    assert response.json()["code"] == "idempotency_key_missing"
    assert not Task.objects.exists()


def test_an_unknown_workflow_is_invalid(stack, client):
    response = post_task(client, "launch-1", {"workflow": "launch_rockets", "input": {}})
    assert response.status_code == 400
    problem = response.json()
    assert problem["code"] == "invalid" and "workflow" in problem["errors"]
    assert not Task.objects.exists()


def test_invalid_input_for_the_workflow_is_invalid(stack, client):
    body = refund_task()
    body["input"]["amount"] = 25
    response = post_task(client, "refund-32", body)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert list(response.json()["errors"]) == ["input.amount"]
    assert not Task.objects.exists()


def test_an_agent_not_granted_the_workflow_is_forbidden(stack):
    response = post_task(agent_api(stack.url, "messenger", grants=("send_message",)), "refund-33", refund_task())
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"
    assert not Task.objects.exists()


def test_another_agents_task_is_not_found_and_its_id_cannot_be_taken(stack, client):
    assert post_task(client, "refund-34", refund_task()).status_code == 201
    other = agent_api(stack.url, "support", grants=("refund", "send_message"))
    response = other.get("/api/v1/tasks/refund-34")
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert other.get("/api/v1/tasks/refund-34?wait=1").status_code == 404
    # Posting the same task id (same body) as another agent is no replay of someone else's task.
    taken = post_task(other, "refund-34", refund_task())
    assert taken.status_code == 422 and taken.json()["code"] == "idempotency_key_reused"
    assert Task.objects.get().agent.name == "billing"


def test_get_with_wait_returns_as_soon_as_the_task_settles(stack, client):
    assert post_task(client, "refund-35", refund_task()).status_code == 201
    queued = client.get("/api/v1/tasks/refund-35?wait=0")
    assert queued.json()["state"] == "queued"
    stack.start_worker()
    # Its start-up is no part of the wait: on a loaded machine it took more than the 5 s waited.
    wait_until(lambda: Worker.all(connection=jobs.redis_connection()), message="the worker's registration")
    started = time.monotonic()
    response = client.get("/api/v1/tasks/refund-35?wait=15")
    took = time.monotonic() - started
    assert response.status_code == 200
    assert response.json()["state"] == "succeeded", response.json()
    assert took < 10, took  # a wait that holds its seconds out: 15 s


def test_get_with_wait_gives_up_after_n_seconds_on_an_unsettled_task(stack, client):
    assert post_task(client, "refund-36", refund_task()).status_code == 201
    started = time.monotonic()
    response = client.get("/api/v1/tasks/refund-36?wait=1")  # no worker: it stays queued
    took = time.monotonic() - started
    assert response.status_code == 200 and response.json()["state"] == "queued"
    assert 1 <= took < 3, took
    assert client.get("/api/v1/tasks/refund-36?wait=31").status_code == 400
