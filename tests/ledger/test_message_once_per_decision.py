"""A message goes once to a recipient per message type and decision, whatever key the agent
sends: the database refuses a second row (a unique constraint), and the API answers with the
first message's row for the same params, and refuses other params (a rewritten body)."""

import pytest
from django.db import IntegrityError, transaction

from ledger.models import Action
from tests.factories import make_agent, make_agent_on, new_action, post_action_in_process


def message(body="Your refund is on its way.", message_type="refund_confirmation", decision="dec-77",
            to="ada@customers.example"):
    return {"action_type": "send_message", "target": to, "decision_id": decision,
            "params": {"channel": "email", "message_type": message_type, "body": body}}


def sent_message(agent, key):
    """A refund_confirmation to ada for dec-77, written straight into the ledger."""
    row = new_action(agent, "queued", key=key, target="ada@customers.example", action_type="send_message",
                     decision_id="dec-77", params={"channel": "email", "message_type": "refund_confirmation",
                                                   "body": "hi"})
    row.amount, row.currency = None, ""
    return row


@pytest.fixture
def agent(client, db, jobs_to_test_redis):
    return make_agent_on(client)


def test_a_second_key_for_the_same_message_gets_the_first_messages_row(client, agent):
    first = post_action_in_process(client, "msg:ada:dec-77:a", message())
    again = post_action_in_process(client, "msg:ada:dec-77:b", message())

    assert first.status_code == 201
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["operation_key"] == "msg:ada:dec-77:a"
    assert Action.objects.filter(action_type="send_message").count() == 1


def test_a_second_key_with_a_rewritten_body_is_refused_and_sends_nothing(client, agent):
    post_action_in_process(client, "msg:ada:dec-77:a", message())
    before = list(Action.objects.values())

    again = post_action_in_process(client, "msg:ada:dec-77:b", message(body="Your refund is on its way!"))

    assert again.status_code == 422 and again.json()["code"] == "idempotency_key_reused"
    assert "msg:ada:dec-77:a" in again.json()["detail"]
    assert list(Action.objects.values()) == before


@pytest.mark.parametrize(("first", "second"), [
    ({}, {"message_type": "refund_reminder"}), ({}, {"decision": "dec-78"}), ({}, {"to": "bob@customers.example"}),
    ({"decision": ""}, {"decision": ""}),
], ids=["another type", "another decision", "another recipient", "no decision"])
def test_another_type_decision_or_recipient_is_another_message(client, agent, first, second):
    assert post_action_in_process(client, "msg:1", message(**first)).status_code == 201
    assert post_action_in_process(client, "msg:2", message(**second)).status_code == 201


def test_another_agents_message_is_not_shown_and_nothing_is_recorded(client, agent):
    other, _ = make_agent("support-bot")
    sent_message(other, "msg:by-support").save(force_insert=True)

    answer = post_action_in_process(client, "msg:by-billing", message())

    assert answer.status_code == 409 and answer.json()["code"] == "message_already_sent"
    assert "msg:by-support" not in answer.content.decode()
    assert list(Action.objects.values_list("operation_key", flat=True)) == ["msg:by-support"]


@pytest.mark.django_db
def test_the_database_refuses_a_second_row_whatever_writes_it():
    agent, _ = make_agent("billing")
    sent_message(agent, "msg:a").save(force_insert=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        sent_message(agent, "msg:b").save(force_insert=True)
    assert Action.objects.count() == 1
