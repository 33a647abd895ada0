"""A refund is made once per order and decision, and a message goes once to a recipient per
message type and decision, whatever key the agent sends: the database refuses a second row (a
unique constraint each), and the API answers with the first row when the params are the same,
refuses other params (another amount, a rewritten body), and refuses another agent's row
without showing it. The same cases run for both action types; what only a refund has (its
edit-down, migration 0024's upgrade guard) follows at the end."""

import importlib
from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.apps import apps as django_apps
from django.db import IntegrityError, connection, transaction

from approvals.models import Limit
from ledger.models import Action
from ledger.versions import action_version_create, version_params
from tests.factories import make_agent, make_agent_on, new_action, post_action_in_process


def refund(amount="25.00", decision="dec-77", order="ORD-8841"):
    return {"action_type": "refund", "target": order, "decision_id": decision,
            "params": {"amount": amount, "currency": "EUR"}}


def message(body="Your refund is on its way.", message_type="refund_confirmation", decision="dec-77",
            to="ada@customers.example"):
    return {"action_type": "send_message", "target": to, "decision_id": decision,
            "params": {"channel": "email", "message_type": message_type, "body": body}}


def refund_row(agent, key):
    """A refund of ORD-8841 for dec-77, written straight into the ledger."""
    return new_action(agent, "queued", key=key, target="ORD-8841", decision_id="dec-77")


def message_row(agent, key):
    """A refund_confirmation to ada for dec-77, written straight into the ledger."""
    row = new_action(agent, "queued", key=key, target="ada@customers.example", action_type="send_message",
                     decision_id="dec-77", params={"channel": "email", "message_type": "refund_confirmation",
                                                   "body": "hi"})
    row.amount, row.currency = None, ""
    return row


KINDS = {
    "refund": SimpleNamespace(body=refund, row=refund_row, other_params={"amount": "24.99"},
                              already="refund_already_recorded"),
    "send_message": SimpleNamespace(body=message, row=message_row, other_params={"body": "Your refund is on its way!"},
                                    already="message_already_sent"),
}
# What makes another row under each rule: (the first request's changes, the second's).
ANOTHER = {
    "refund": {"another decision": ({}, {"decision": "dec-78"}), "another order": ({}, {"order": "ORD-8842"}),
               "no decision": ({"decision": ""}, {"decision": ""})},
    "send_message": {"another type": ({}, {"message_type": "refund_reminder"}),
                     "another decision": ({}, {"decision": "dec-78"}),
                     "another recipient": ({}, {"to": "bob@customers.example"}),
                     "no decision": ({"decision": ""}, {"decision": ""})},
}


@pytest.fixture(params=KINDS)
def kind(request):
    return KINDS[request.param]


@pytest.fixture
def agent(client, db, jobs_to_test_redis):
    return make_agent_on(client)


def test_a_second_key_for_the_same_action_gets_the_first_actions_row(client, agent, kind):
    first = post_action_in_process(client, "first-key", kind.body())
    again = post_action_in_process(client, "second-key", kind.body())

    assert first.status_code == 201
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["operation_key"] == "first-key"
    assert Action.objects.count() == 1


def test_a_second_key_with_other_params_is_refused_and_changes_nothing(client, agent, kind):
    post_action_in_process(client, "first-key", kind.body())
    before = list(Action.objects.values())

    again = post_action_in_process(client, "second-key", kind.body(**kind.other_params))

    assert again.status_code == 422 and again.json()["code"] == "idempotency_key_reused"
    assert "first-key" in again.json()["detail"] and again.json()["recorded_under"] == "first-key"
    assert list(Action.objects.values()) == before


@pytest.mark.parametrize(("action_type", "first", "second"), [
    pytest.param(action_type, first, second, id=f"{action_type}: {name}")
    for action_type, cases in ANOTHER.items() for name, (first, second) in cases.items()])
def test_another_decision_target_or_type_is_another_action(client, agent, action_type, first, second):
    body = KINDS[action_type].body
    assert post_action_in_process(client, "first-key", body(**first)).status_code == 201
    assert post_action_in_process(client, "second-key", body(**second)).status_code == 201


@pytest.mark.parametrize(("first", "second"), [
    pytest.param("ada@customers.example", "ada@Customers.EXAMPLE", id="case"),
    pytest.param("ada@caf\u00e9.example", "ada@cafe\u0301.example", id="unicode normal form"),
])
def test_a_recipients_domain_spelled_otherwise_is_the_same_recipient(client, agent, first, second):
    """A domain is the same whatever its case (RFC 5321) or its Unicode normal form: the message
    asked again with it spelled otherwise, under another key, is the first one, not a second."""
    assert post_action_in_process(client, "first-key", message(to=first)).status_code == 201

    again = post_action_in_process(client, "second-key", message(to=second))

    assert again.status_code == 200 and again.json()["operation_key"] == "first-key"
    assert Action.objects.count() == 1


def test_another_agents_action_is_not_shown_and_nothing_is_recorded(client, agent, kind):
    other, _ = make_agent("support-bot")
    kind.row(other, "key-of-support").save(force_insert=True)

    answer = post_action_in_process(client, "key-of-billing", kind.body())

    assert answer.status_code == 409 and answer.json()["code"] == kind.already
    assert "key-of-support" not in answer.content.decode()
    assert list(Action.objects.values_list("operation_key", flat=True)) == ["key-of-support"]


@pytest.mark.django_db
def test_the_database_refuses_a_second_row_whatever_writes_it(kind):
    agent, _ = make_agent("billing")
    kind.row(agent, "key-a").save(force_insert=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        kind.row(agent, "key-b").save(force_insert=True)
    assert Action.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_refund_edited_down_leaves_its_place_for_the_decision_to_its_version():
    """The edit-down (ledger.versions) supersedes the original before it inserts the version:
    the decision's one refund is then the version, and the database lets it in."""
    agent, _ = make_agent("billing")
    original = new_action(agent, "awaiting_approval", key="refund:a", decision_id="dec-77", amount="750.00")
    original.save(force_insert=True)
    with transaction.atomic():
        locked = Action.objects.select_for_update().get(pk=original.pk)
        version = action_version_create(locked, actor="user:ops", reason="the customer agreed to 500",
                                        params=version_params(locked, {"amount": "500.00"}))

    original.refresh_from_db()
    assert (original.status, version.decision_id, version.params["amount"]) == ("superseded", "dec-77", "500.00")
    assert Action.objects.filter(decision_id="dec-77").count() == 2


@pytest.mark.django_db
def test_the_upgrade_stops_naming_refunds_already_recorded_twice_for_one_decision():
    """Migration 0024's guard, run as it ran before its rule existed (the index dropped in this
    test's transaction): two refunds of one order and decision under two keys stop it, named."""
    guard = importlib.import_module("ledger.migrations.0024_refund_once_per_decision").refuse_refunds_made_twice
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX action_refund_once_per_decision")
    agent, _ = make_agent("billing")
    new_action(agent, "succeeded", key="refund:ORD-8841:25.00EUR:dec-77", target="ORD-8841",
               decision_id="dec-77").save(force_insert=True)
    guard(django_apps, None)  # one refund for the decision: nothing to stop

    new_action(agent, "succeeded", key="refund:ORD-8841:25EUR:dec-77", target="ORD-8841",
               decision_id="dec-77").save(force_insert=True)
    with pytest.raises(RuntimeError, match=r"ORD-8841 / dec-77 \(2 refunds\)"):
        guard(django_apps, None)


def test_a_message_recorded_before_the_domain_rule_is_replayed_under_its_key_as_it_was_sent(client, agent):
    """docs/contract.md: a message recorded before its recipient's domain was stored in one
    spelling keeps the spelling it was sent with, and a replay of it under its key with its target
    as written then is still 200. The very request sent again (its body ending in a newline,
    which the intake strips) is read in full, not answered from the row as it stands: its
    target, now stored in lower case, made another fingerprint, and it was answered 422."""
    from ledger.actions import action_request

    sent = message(to="ada@Customers.EXAMPLE", body="Your refund is on its way.\n")
    action_request(agent=agent, operation_key="old-key", action_type="send_message", target=sent["target"],
                   decision_id=sent["decision_id"], params={**sent["params"], "body": "Your refund is on its way."})

    again = post_action_in_process(client, "old-key", sent)

    assert again.status_code == 200, again.json()
    assert again.json()["target"] == "ada@Customers.EXAMPLE"
    assert Action.objects.count() == 1


def test_a_retry_under_the_second_key_after_an_edit_down_is_still_answered_with_the_first(client, agent):
    """The same refund under a second key answers the first action; a person then edits it down
    into a version, which holds the decision's place: the retry under the second key was compared
    with the version's params and refused as a key reused, where under the first key it replays."""
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    first = post_action_in_process(client, "first-key", refund(amount="900.00"))
    assert post_action_in_process(client, "second-key", refund(amount="900.00")).status_code == 200
    with transaction.atomic():
        locked = Action.objects.select_for_update().get(operation_key="first-key")
        action_version_create(locked, actor="user:ops", reason="the customer agreed to 400",
                              params=version_params(locked, {"amount": "400.00"}))

    for key in ("first-key", "second-key"):
        again = post_action_in_process(client, key, refund(amount="900"))
        assert (again.status_code, again.json()["operation_key"], again.json()["status"]) == (
            200, "first-key", "superseded"), again.json()
        assert again.json()["superseded_by"]["operation_key"] == "first-key~v2"
    assert first.status_code == 201 and Action.objects.count() == 2
