"""Two actions on one order or customer: the intake holds them until a person decides."""

import pytest

from ledger.models import Action, ActionStatus, InvalidTransition
from tests.conftest import wait_until
from tests.factories import agent_api, audit_events, post_action, refund_body, sandbox

S = ActionStatus


@pytest.fixture
def billing(stack):
    return agent_api(stack.url)


def status_of(key):
    return Action.objects.get(operation_key=key).status


def events_for(key, verb):
    return audit_events(Action.objects.get(operation_key=key), verb)


def post_refund(billing, key, order, **fields):
    """A refund of `order` under `key`, for the decision the key ends with (one refund per
    order and decision: two refunds of one order are two decisions)."""
    return post_action(billing, key, refund_body(order, decision=key.rsplit(":", 1)[1], **fields))


def a_full_and_a_partial_refund(billing, order):
    """Both refunds for one order, held (the first test): returns (full, partial)."""
    keys = f"refund:{order}:full:dec-1", f"refund:{order}:partial:dec-2"
    post_refund(billing, keys[0], order)
    post_refund(billing, keys[1], order, amount="5.00")
    return tuple(Action.objects.get(operation_key=key, status=S.HELD) for key in keys)


def test_a_second_refund_for_an_order_with_a_queued_one_holds_both(billing):
    assert post_refund(billing, "refund:ORD-H1:full:dec-1", "ORD-H1").status_code == 201

    second = post_refund(billing, "refund:ORD-H1:partial:dec-2", "ORD-H1", amount="5.00")

    assert second.status_code == 201
    assert second.json()["status"] == "held"
    assert status_of("refund:ORD-H1:full:dec-1") == S.HELD
    [hold] = events_for("refund:ORD-H1:full:dec-1", "held")
    assert hold.actor == "system:intake" and "refund:ORD-H1:partial:dec-2" in hold.reason
    [request] = events_for("refund:ORD-H1:partial:dec-2", "requested")
    assert request.after == {"status": "held"} and "refund:ORD-H1:full:dec-1" in request.reason


def test_a_second_refund_while_the_first_is_pending_holds_only_the_new_one(billing):
    post_refund(billing, "refund:ORD-H2:full:dec-1", "ORD-H2")
    Action.objects.get(operation_key="refund:ORD-H2:full:dec-1").claim(owner="host:tests")

    second = post_refund(billing, "refund:ORD-H2:partial:dec-2", "ORD-H2", amount="5.00")

    assert second.json()["status"] == "held"
    assert status_of("refund:ORD-H2:full:dec-1") == S.PENDING  # started: not ours to stop


def test_a_second_refund_after_the_first_succeeded_is_not_held(billing):
    post_refund(billing, "refund:ORD-H3:full:dec-1", "ORD-H3")
    first = Action.objects.get(operation_key="refund:ORD-H3:full:dec-1").claim(owner="host:tests")
    first.mark_succeeded(actor="system:tests", external_ref="re_1", claim=first.fence)

    second = post_refund(billing, "refund:ORD-H3:partial:dec-2", "ORD-H3", amount="5.00")

    assert second.json()["status"] == "queued"  # nothing is in flight any more
    assert status_of("refund:ORD-H3:full:dec-1") == S.SUCCEEDED


def test_refunds_for_one_customer_on_different_orders_are_held_too(billing):
    post_refund(billing, "refund:ORD-H4:full:dec-1", "ORD-H4", customer="CUST-H")

    second = post_refund(billing, "refund:ORD-H5:full:dec-2", "ORD-H5", customer="CUST-H")

    assert second.json()["status"] == "held"
    assert status_of("refund:ORD-H4:full:dec-1") == S.HELD


def test_refunds_for_different_orders_and_customers_are_not_held(billing):
    post_refund(billing, "refund:ORD-H6:full:dec-1", "ORD-H6", customer="CUST-H6")
    second = post_refund(billing, "refund:ORD-H7:full:dec-2", "ORD-H7", customer="CUST-H7")
    assert second.json()["status"] == "queued"
    assert status_of("refund:ORD-H6:full:dec-1") == S.QUEUED


def test_a_released_action_is_queued_and_executes(stack, billing):
    held, _ = a_full_and_a_partial_refund(billing, "ORD-H8")
    stack.start_worker()

    held.release(actor="user:ops-lead", reason="the partial one was a mistake")

    assert held.status == S.QUEUED
    [release] = audit_events(held, "released")
    assert (release.actor, release.reason) == ("user:ops-lead", "the partial one was a mistake")
    assert (release.before["status"], release.after["status"]) == ("held", "queued")
    done = wait_until(lambda: (a := Action.objects.get(pk=held.pk)).status == S.SUCCEEDED and a,
                      message="the released refund to run")
    refunds = sandbox(billing, "GET", "refunds", params={"order_id": "ORD-H8"}).json()["data"]
    assert [(r["id"], r["operation_key"]) for r in refunds] == [(done.external_ref, held.operation_key)]
    assert status_of("refund:ORD-H8:partial:dec-2") == S.HELD  # the other still waits for a person


def test_a_rejected_held_action_never_executes(stack, billing):
    _, held = a_full_and_a_partial_refund(billing, "ORD-H9")
    stack.start_worker()

    held.reject(actor="user:ops-lead", reason="duplicate of the full refund")

    assert Action.objects.get(pk=held.pk).status == S.REJECTED
    [reject] = audit_events(held, "rejected")
    assert (reject.actor, reject.reason) == ("user:ops-lead", "duplicate of the full refund")
    with pytest.raises(InvalidTransition):
        held.release(actor="user:ops-lead", reason="changed my mind")
    assert sandbox(billing, "GET", "refunds", params={"order_id": "ORD-H9"}).json()["data"] == []


def test_a_hold_is_released_through_approval_when_asked(billing):
    _, held = a_full_and_a_partial_refund(billing, "ORD-HA")

    held.release(actor="user:ops-lead", reason="over the limit", needs_approval=True)

    assert Action.objects.get(pk=held.pk).status == S.AWAITING_APPROVAL
    assert audit_events(held, "released")[0].reason == "over the limit"
