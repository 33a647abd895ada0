"""An action's and a task's `url` is their key as one path segment, written as the contract shows
it (`/api/v1/actions/refund:ORD-8841:full:dec-77`): ":" and "@" as they are, which a segment may
hold (RFC 3986, 3.3); "/", "%", "?", "#", a space and the rest percent-encoded, and a key of dots
alone as "%2E"s. Read back as answered, it is the same action or task."""

import json

import pytest

from tests.factories import (agent_api, make_agent_on, message_body, post_action, post_action_in_process,
                             refund_body, refund_task_body)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

ACTIONS = "/api/v1/actions/"


@pytest.fixture
def agent_client(client):
    make_agent_on(client)
    return client


def test_an_actions_url_is_its_key_as_the_contract_writes_it(agent_client):
    answer = post_action_in_process(agent_client, "refund:ORD-8841:full:dec-77", refund_body())
    assert answer.json()["url"] == "/api/v1/actions/refund:ORD-8841:full:dec-77"


def test_a_recipients_at_stays_as_it_is(agent_client):
    key = "send_message:ada@example.com:receipt:dec-1"
    answer = post_action_in_process(agent_client, key, message_body())
    assert answer.json()["url"] == f"{ACTIONS}{key}"


def test_a_tasks_url_is_its_id_as_the_contract_writes_it(agent_client):
    answer = agent_client.post("/api/v1/tasks", data=json.dumps(refund_task_body()), content_type="application/json",
                               headers={"Idempotency-Key": "task:refund:ORD-8841:dec-77"})
    assert answer.status_code == 201, answer.json()
    assert answer.json()["url"] == "/api/v1/tasks/task:refund:ORD-8841:dec-77"
    read = agent_client.get(answer.json()["url"])
    assert (read.status_code, read.json()["task_id"]) == (200, "task:refund:ORD-8841:dec-77")


@pytest.mark.parametrize(("key", "segment"), [
    ("refund:a/b", "refund:a%2Fb"), ("refund:50%:x", "refund:50%25:x"), ("refund:q?x#y", "refund:q%3Fx%23y"),
    ("refund:sp ace", "refund:sp%20ace"), ("refund:a;b=c&d+e", "refund:a%3Bb%3Dc%26d%2Be"),
    (".", "%2E"), ("..", "%2E%2E"), ("...", "..."),
])
def test_what_a_segment_cannot_hold_is_encoded_and_the_url_reads_the_same_action(agent_client, key, segment):
    answer = post_action_in_process(agent_client, key, refund_body())
    assert answer.json()["url"] == f"{ACTIONS}{segment}"
    read = agent_client.get(answer.json()["url"])
    assert (read.status_code, read.json()["operation_key"]) == (200, key)


def test_a_key_ending_in_evidence_is_read_at_its_url_and_its_evidence_below_it(stack):
    """On gunicorn, which keeps the path as sent: the key's own "/" stays encoded in its url."""
    with agent_api(stack.url) as api:
        for key, order in (("refund:x/evidence", "ORD-S1"), ("refund:x", "ORD-S2")):
            assert post_action(api, key, refund_body(order=order)).status_code == 201
        url = api.get(f"{ACTIONS}refund:x%2Fevidence").json()["url"]
        assert url == f"{ACTIONS}refund:x%2Fevidence"
        assert api.get(url).json()["operation_key"] == "refund:x/evidence"
        assert api.get(f"{url}/evidence").json()["request"]["operation_key"] == "refund:x/evidence"
        assert api.get(f"{ACTIONS}refund:x/evidence").json()["request"]["operation_key"] == "refund:x"
        # Any percent-encoding of the same key is the same action (docs/contract.md, Keys).
        for spelling in ("refund:x%2fevidence", "refund:x%2F%65vidence", "refund:x%2Fevid%65nce",
                         "refund%3Ax%2f%65vidence"):
            read = api.get(f"{ACTIONS}{spelling}")
            assert (read.status_code, read.json().get("operation_key")) == (200, "refund:x/evidence"), spelling
        assert api.get(f"{ACTIONS}refund:x/%65vidence").json()["request"]["operation_key"] == "refund:x"
