"""A problem is application/problem+json in JSON, whatever renderer the request asked for."""

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


def test_the_contracts_examples_still_pass(agent_client):
    assert post_action_in_process(agent_client, "refund:ORD-8841:full:dec-77", refund_body()).status_code == 201
    answer = agent_client.post("/api/v1/tasks", data=json.dumps(refund_task_body()), content_type="application/json",
                               headers={"Idempotency-Key": "task:refund:ORD-8841:dec-77"})
    assert answer.status_code == 201, answer.content
