"""A body nested too deeply is `400 invalid`, never a 500. json.loads refuses one nested past the
interpreter's recursion limit, but one a few levels shallower parsed and then exhausted the stack
in the view (a field's str() of it recursing again): so the parser refuses a body nested deeper
than MAX_NESTING levels, far below either."""

import json

import pytest

from ledger.api.problems import MAX_NESTING
from tests.factories import make_agent_on, message_body, post_action_in_process, refund_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

TOO_DEEP = "The body is nested too deeply."


@pytest.fixture
def agent_client(client):
    make_agent_on(client)
    client.raise_request_exception = False  # a 500 is answered as a 500, for the test to see
    return client


def nested(levels):
    """A JSON array text `levels` deep (an empty array within arrays)."""
    return "[" * levels + "]" * levels


def with_action_type(levels):
    return json.dumps(refund_body()).replace('"refund"', nested(levels), 1)


def with_channel(levels):
    return json.dumps(message_body()).replace('"email"', nested(levels), 1)


@pytest.mark.parametrize("body", [with_action_type, with_channel])
def test_no_depth_near_the_interpreters_limit_answers_500(agent_client, body):
    # Where the 500s were moves with the stack the request starts on: a few depths near 985 on
    # gunicorn, near 890 here under pytest. The whole range up to the limit covers both.
    answers = {levels: post_action_in_process(agent_client, f"deep:{levels}", body(levels))
               for levels in range(600, 1000)}
    assert [levels for levels, answer in answers.items() if answer.status_code >= 500] == []
    for levels, answer in answers.items():
        assert answer.status_code == 400, (levels, answer.status_code)
        assert answer.json()["code"] == "invalid" and answer.json()["detail"] == TOO_DEEP, levels


def test_the_bound_counts_the_body_itself_as_its_first_level(agent_client):
    # The body (1) and params (2) hold the channel: its arrays make the rest.
    under = post_action_in_process(agent_client, "deep:under", with_channel(MAX_NESTING - 2))
    assert under.status_code == 400 and under.json()["detail"] != TOO_DEEP, under.json()
    assert list(under.json()["errors"]) == ["params.channel"], under.json()
    over = post_action_in_process(agent_client, "deep:over", with_channel(MAX_NESTING - 1))
    assert over.status_code == 400 and over.json()["detail"] == TOO_DEEP, over.json()
    assert over.json()["errors"] == {"body": [TOO_DEEP]}
