"""A key names the intended effect: the business object, the action type and the decision
(docs/contract.md). The decision is not in the fingerprint, so the same key asked for another
decision was answered 200 as a replay of the first decision's action: the agent believed the
second decision's effect recorded when nothing was. It is another request under a used key:
`422 idempotency_key_reused`, nothing changed."""

import pytest

from ledger.models import Action
from tests.factories import booking_body, make_agent_on, message_body, post_action_in_process, refund_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

BODIES = {
    "refund": lambda decision: refund_body(decision=decision),
    "send_message": lambda decision: {**message_body(), "decision_id": decision},
    "create_booking": lambda decision: booking_body(decision=decision),
}


@pytest.fixture
def agent_client(client):
    make_agent_on(client)
    return client


@pytest.mark.parametrize("action_type", BODIES)
@pytest.mark.parametrize(("first", "second"), [("dec-1", "dec-2"), ("", "dec-2"), ("dec-1", "")],
                         ids=["another decision", "a decision where none was", "none where one was"])
def test_the_same_key_for_another_decision_is_refused_and_changes_nothing(agent_client, action_type, first, second):
    body = BODIES[action_type]
    assert post_action_in_process(agent_client, "k1", body(first)).status_code == 201
    before = list(Action.objects.values())

    again = post_action_in_process(agent_client, "k1", body(second))

    assert again.status_code == 422, again.json()
    assert again.json()["code"] == "idempotency_key_reused"
    assert "recorded_under" not in again.json()  # the key is its own: nothing to point to
    assert list(Action.objects.values()) == before


def test_the_first_decisions_request_is_still_replayed_under_the_key(agent_client):
    post_action_in_process(agent_client, "k1", refund_body(decision="dec-1"))
    post_action_in_process(agent_client, "k1", refund_body(decision="dec-2"))

    again = post_action_in_process(agent_client, "k1", refund_body(decision="dec-1"))

    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["decision_id"] == "dec-1"


def test_the_other_decision_under_a_key_of_its_own_is_recorded(agent_client):
    post_action_in_process(agent_client, "k1", refund_body(decision="dec-1"))
    post_action_in_process(agent_client, "k1", refund_body(decision="dec-2"))

    second = post_action_in_process(agent_client, "k2", refund_body(decision="dec-2"))

    assert second.status_code == 201 and second.json()["decision_id"] == "dec-2"
    assert sorted(Action.objects.values_list("operation_key", "decision_id")) == [("k1", "dec-1"), ("k2", "dec-2")]
