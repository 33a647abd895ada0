"""An Idempotency-Key header with nothing in it sends no key: `400 idempotency_key_missing`, as
without the header (docs/contract.md), not `400 invalid`. An HTTP field's value has no whitespace
around it (RFC 9110, 5.5): gunicorn strips it, so a blank header reaches the API empty on the wire,
and in-process alike."""

import json

import pytest

from ledger.models import Action, Task
from tests.factories import make_agent_on, post_action_in_process, refund_body, refund_task_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

HEADERS = pytest.mark.parametrize("key", [None, "", " ", "\t", "  \t "],
                                  ids=["no header", "empty", "a space", "a tab", "blanks"])


def assert_missing(answer):
    assert answer.status_code == 400, answer.content
    assert answer["Content-Type"] == "application/problem+json"
    assert answer.json()["code"] == "idempotency_key_missing"
    assert "errors" not in answer.json()


@HEADERS
def test_an_action_without_a_key_in_the_header_is_refused_as_missing(client, key):
    make_agent_on(client)
    assert_missing(post_action_in_process(client, key, refund_body()))
    assert not Action.objects.exists()


@HEADERS
def test_a_task_without_a_key_in_the_header_is_refused_as_missing(client, key):
    make_agent_on(client)
    headers = {} if key is None else {"Idempotency-Key": key}
    assert_missing(client.post("/api/v1/tasks", data=json.dumps(refund_task_body()), content_type="application/json",
                               headers=headers))
    assert not Task.objects.exists()


def test_a_key_with_something_in_it_is_still_checked(client):
    make_agent_on(client)
    answer = post_action_in_process(client, " \x7f ", refund_body())
    assert (answer.status_code, answer.json()["code"]) == (400, "invalid")
    assert answer.json()["errors"] == {"Idempotency-Key": ["1 to 255 printable ASCII characters."]}
