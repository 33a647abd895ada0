"""A problem is application/problem+json in JSON, whatever renderer the request asked for, and the
API's text fields take text: a number where the OpenAPI document says string is refused, not
stored as its digits."""

import json

import pytest

from ledger.models import Action, Task
from tests.factories import make_agent_on, message_body, post_action_in_process, refund_body, refund_task_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def agent_client(client):
    make_agent_on(client)
    return client


def assert_invalid(answer, field):
    assert answer.status_code == 400, answer.content
    assert answer["Content-Type"] == "application/problem+json"
    problem = answer.json()
    assert problem["code"] == "invalid" and field in problem["errors"], problem


@pytest.mark.parametrize("query", ["format=%ff", "format=nope"])
def test_a_problem_is_json_whatever_format_was_asked(client, query):
    answer = client.get(f"/api/v1/schema?{query}")
    assert answer.status_code == 404, answer.content
    assert answer["Content-Type"] == "application/problem+json"
    assert answer.json()["code"] == "not_found"


@pytest.mark.parametrize(("params", "field"), [
    ({"body": 0}, "params.body"),
    ({"message_type": 0}, "params.message_type"),
    ({"body": 1.5}, "params.body"),
])
def test_a_messages_text_params_take_text_only(agent_client, params, field):
    body = message_body(**params)
    assert_invalid(post_action_in_process(agent_client, "send_message:ada@example.com:receipt:dec-1", body), field)
    assert not Action.objects.exists()


@pytest.mark.parametrize(("changes", "field"), [
    ({"target": 8841}, "target"), ({"customer": 17}, "customer"), ({"decision_id": 77}, "decision_id"),
])
def test_an_actions_text_fields_take_text_only(agent_client, changes, field):
    assert_invalid(post_action_in_process(agent_client, "refund:ORD-8841:full:dec-77", {**refund_body(), **changes}),
                   field)
    assert not Action.objects.exists()


def test_a_refunds_reason_takes_text_only(agent_client):
    body = refund_body(reason=0)
    assert_invalid(post_action_in_process(agent_client, "refund:ORD-8841:full:dec-77", body), "params.reason")


@pytest.mark.parametrize("field", ["customer", "order_id", "reason", "decision_id"])
def test_a_refund_tasks_text_input_takes_text_only(agent_client, field):
    body = refund_task_body()
    body["input"][field] = 0
    answer = agent_client.post("/api/v1/tasks", data=json.dumps(body), content_type="application/json",
                               headers={"Idempotency-Key": "task:refund:ORD-8841:dec-77"})
    assert_invalid(answer, f"input.{field}")
    assert not Task.objects.exists()


def test_the_contracts_examples_still_pass(agent_client):
    assert post_action_in_process(agent_client, "refund:ORD-8841:full:dec-77", refund_body()).status_code == 201
    answer = agent_client.post("/api/v1/tasks", data=json.dumps(refund_task_body()), content_type="application/json",
                               headers={"Idempotency-Key": "task:refund:ORD-8841:dec-77"})
    assert answer.status_code == 201, answer.content
