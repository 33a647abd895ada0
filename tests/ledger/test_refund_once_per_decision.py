"""A refund is made once per order and decision, whatever key the agent sends: the database
refuses a second row (a unique constraint), and the API answers with the first refund when
the params are the same, refuses other params, and refuses another agent's."""

import importlib

import pytest
from django.apps import apps as django_apps
from django.db import IntegrityError, connection, transaction

from ledger.models import Action
from ledger.versions import action_version_create, version_params
from tests.factories import make_agent, make_agent_on, new_action, post_action_in_process


def refund(amount="25.00", decision="dec-77", order="ORD-8841"):
    return {"action_type": "refund", "target": order, "decision_id": decision,
            "params": {"amount": amount, "currency": "EUR"}}


@pytest.fixture
def agent(client, db, jobs_to_test_redis):
    return make_agent_on(client)


def test_a_second_key_for_the_same_refund_gets_the_first_refund(client, agent):
    first = post_action_in_process(client, "refund:ORD-8841:25.00EUR:dec-77", refund())
    again = post_action_in_process(client, "refund:ORD-8841:dec-77", refund())

    assert first.status_code == 201
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["operation_key"] == "refund:ORD-8841:25.00EUR:dec-77"
    assert Action.objects.filter(action_type="refund").count() == 1


def test_a_second_key_with_another_amount_is_refused_and_changes_nothing(client, agent):
    post_action_in_process(client, "refund:ORD-8841:25.00EUR:dec-77", refund())
    before = list(Action.objects.values())

    again = post_action_in_process(client, "refund:ORD-8841:24.99EUR:dec-77", refund(amount="24.99"))

    assert again.status_code == 422 and again.json()["code"] == "idempotency_key_reused"
    assert "refund:ORD-8841:25.00EUR:dec-77" in again.json()["detail"]
    assert list(Action.objects.values()) == before


@pytest.mark.parametrize("second", [{"decision": "dec-78"}, {"order": "ORD-8842"}, {"decision": ""}],
                         ids=["another decision", "another order", "no decision"])
def test_another_decision_or_order_is_another_refund(client, agent, second):
    first = {"decision": ""} if second == {"decision": ""} else {}
    assert post_action_in_process(client, "refund:1", refund(**first)).status_code == 201
    assert post_action_in_process(client, "refund:2", refund(**second)).status_code == 201


def test_another_agents_refund_is_not_shown_and_nothing_is_recorded(client, agent):
    other, _ = make_agent("support-bot")
    new_action(other, "queued", key="refund:by-support", target="ORD-8841", decision_id="dec-77").save(
        force_insert=True)

    answer = post_action_in_process(client, "refund:by-billing", refund())

    assert answer.status_code == 409 and answer.json()["code"] == "refund_already_recorded"
    assert "refund:by-support" not in answer.content.decode()
    assert list(Action.objects.values_list("operation_key", flat=True)) == ["refund:by-support"]


@pytest.mark.django_db
def test_the_database_refuses_a_second_refund_whatever_writes_it():
    agent, _ = make_agent("billing")
    new_action(agent, "queued", key="refund:a", decision_id="dec-77").save(force_insert=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        new_action(agent, "queued", key="refund:b", decision_id="dec-77").save(force_insert=True)
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
