"""The names the shards' router places a request by (sharding/router.py: names), read as the shard
records them: no live shard is needed to tell them."""

import unicodedata
from types import SimpleNamespace

import pytest

from ledger.api.serializers import ActionRequestSerializer, TaskRequestSerializer
from ledger.models import Action
from ledger.recipients import email_recipient
from ledger.versions import version_key
from ledger.workflows import WORKFLOWS
from ledger.workflows.refund import default_recipient
from sharding.router import Unreadable, key_name, names
from tests.factories import refund_body

# 130 accented letters, each written as a letter and its combining accent: 260 characters as
# sent, 130 as the shard keeps it (NFKC).
DECOMPOSED = unicodedata.normalize("NFD", "\u00e9" * 130)


def test_the_router_places_the_customer_the_shard_records():
    body = refund_body("ORD-1", customer=DECOMPOSED, decision="dec-1")
    request = ActionRequestSerializer(data=body)
    assert request.is_valid(), request.errors
    assert request.validated_data["customer"] == "\u00e9" * 130
    assert names("action", "refund:ORD-1:dec-1", body)[1] == ["customer:" + "\u00e9" * 130, "target:ORD-1"]


def test_a_task_is_placed_by_its_customer_as_the_shard_records_it():
    body = {"workflow": "refund", "input": {"order_id": "ORD-1", "customer": DECOMPOSED}}
    assert names("task", "task-1", body)[1] == ["customer:" + "\u00e9" * 130, "target:ORD-1",
                                                 "target:" + "\u00e9" * 130 + "@customers.surety.example"]


def test_a_customer_the_shard_refuses_as_too_long_is_refused_by_the_router_too():
    body = refund_body("ORD-1", customer="\u00e9" * 256, decision="dec-1")
    assert not ActionRequestSerializer(data=body).is_valid()
    with pytest.raises(Unreadable):
        names("action", "refund:ORD-1:dec-1", body)


@pytest.mark.parametrize("notify", [None, " ann@Mail.EXAMPLE "])
def test_a_task_is_placed_by_the_workflow_order_and_recipient_the_shard_records(notify):
    body = {"workflow": " refund ", "input": {"order_id": " ORD-1 ", "amount": "5.00", "currency": "EUR",
                                              "customer": " Ann ", **({"notify": notify} if notify else {})}}
    task = TaskRequestSerializer(data=body)
    assert task.is_valid(), task.errors
    given = task.validated_data["input"]
    # Where the workflow's confirmation step sends it (ledger.workflows.refund.notify_customer).
    recipient = email_recipient(given.get("notify") or default_recipient(given["customer"]))

    assert task.validated_data["workflow"] == "refund"
    assert names("task", "task-1", body)[1] == ["customer:Ann", "target:ORD-1", f"target:{recipient}"]


def test_every_key_a_shard_makes_from_a_task_or_an_action_goes_by_its_name():
    """Every workflow's effect steps' keys go by their task's id, and an edit's version by its
    original's key, even one of a step's action: a workflow with an effect step the router does
    not know fails here."""
    task = SimpleNamespace(task_id="refund:T-1")
    keys = [step.key(task) for workflow in WORKFLOWS.values() for step in workflow.steps if step.kind == "effect"]
    versions = [version_key(Action(operation_key=key)) for key in keys]
    assert keys and {key_name("action", key) for key in keys + versions} == {"task:refund:T-1"}
    second = version_key(Action(operation_key="refund:ORD-1:dec-1"))
    assert [key_name("action", key) for key in (second, version_key(Action(operation_key=second)))] == [
        "action:refund:ORD-1:dec-1"] * 2
    # A key of a step's shape with no step of any workflow is a key of its own.
    assert key_name("action", "refund:ORD1:v1") == "action:refund:ORD1:v1"
    # Nor is one of a version's shape that no edit makes (a first version, a padded number).
    assert [key_name("action", key) for key in ("order-1~v1", "order-1~v007", "order-1~v0")] == [
        "action:order-1~v1", "action:order-1~v007", "action:order-1~v0"]
