"""The guarded executor's verification of an unknown outcome, through the real stack (the
gunicorn server with its sandbox provider, an RQ worker): a provider that cannot be asked
leaves the action to a person with the evidence, and an effect the provider confirms but that
is over its limit goes to a person too, with the limit's reason. The sandbox's `lookup_error`
fault makes its look-ups by operation key answer 500."""

import json
from datetime import timedelta
from decimal import Decimal

import pytest

from approvals.decisions import review_decide
from approvals.models import Limit, ReviewItem, ReviewKind
from ledger import clock
from ledger.actions import action_request
from ledger.executor import action_claim_next, action_run_claimed
from ledger.models import Action
from sandbox.models import SandboxFault
from tests.conftest import answering, thread_server, wait_until
from tests.factories import agent_api, audit_events, person, post_action, refund_body, sandbox, sandbox_list


def arm(client, target, fault, times=1):
    response = sandbox(client, "POST", "faults", json={"target": target, "fault": fault, "times": times})
    assert response.status_code == 201, response.text


def settled_for_a_person(key):
    return wait_until(lambda: Action.objects.filter(operation_key=key, status="needs_review").first(), seconds=30,
                      message=f"{key} to need review")


def test_a_lookup_fault_answers_500_to_lookups_only_while_armed(stack):
    client = agent_api(stack.url)
    arm(client, "refund:ORD-L:full:dec-1", "lookup_error")
    assert sandbox(client, "GET", "refunds", params={"operation_key": "refund:ORD-L:full:dec-1"}).status_code == 500
    assert sandbox(client, "GET", "refunds", params={"operation_key": "refund:ORD-L:full:dec-1"}).json() == {"data": []}


def test_a_lookup_fault_is_not_spent_by_a_write_nor_a_write_fault_by_a_lookup(stack):
    client = agent_api(stack.url)
    arm(client, "ORD-W", "lookup_error")
    arm(client, "ORD-W", "decline")
    assert sandbox(client, "GET", "refunds", params={"order_id": "ORD-W"}).status_code == 500
    assert sandbox(client, "GET", "refunds", params={"order_id": "ORD-W"}).status_code == 200
    assert sandbox(client, "POST", "refunds", json={"order_id": "ORD-W", "amount": "1.00", "currency": "EUR"}
                   ).status_code == 402


def test_when_the_provider_cannot_be_asked_the_action_needs_review_with_the_evidence(stack):
    client = agent_api(stack.url)
    key = "refund:ORD-NA:full:dec-1"
    arm(client, "ORD-NA", "error_500")  # the call's outcome is unknown...
    arm(client, key, "lookup_error")  # ...and the look-up that should settle it fails
    stack.start_worker()
    assert post_action(client, key, refund_body("ORD-NA")).status_code == 201

    action = settled_for_a_person(key)
    assert action.attempts == 1 and action.external_ref in ("", None)
    call, verification = action.evidence[0], action.evidence[-1]
    assert call["code"] != "declined"
    assert verification["found"] is None and "500" in str(verification["verification"])
    [event] = audit_events(action, "needs_review")
    assert event.reason == "the provider cannot say whether the effect happened"
    item = ReviewItem.objects.get(action=action, status="open")
    assert item.kind == ReviewKind.UNKNOWN_OUTCOME
    # The look-up was really asked (its fault is spent), and nothing was sent again.
    assert SandboxFault.objects.get(target=key).remaining == 0
    assert sandbox_list(client, "refunds", operation_key=key) == []


def test_an_effect_verified_but_over_its_limit_needs_review_with_the_limits_reason(stack):
    client = agent_api(stack.url)
    key = "refund:ORD-OL:full:dec-1"
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"))
    arm(client, "ORD-OL", "timeout_after_commit")  # committed, but the answer never comes
    assert post_action(client, key, refund_body("ORD-OL", amount="750.00")).status_code == 201
    action = Action.objects.get(operation_key=key)
    assert action.status == "awaiting_approval"
    approver = person("alice", "approvers")
    review_decide(ReviewItem.objects.get(action=action, status="open"), user=approver, decision="approve",
                  reason="known customer")
    stack.start_worker()

    action = settled_for_a_person(key)
    [refund] = sandbox_list(client, "refunds", operation_key=key)
    verification = action.evidence[-1]
    assert verification["found"] is True and verification["verification"]["matches"] == [refund["id"]]
    [event] = audit_events(action, "needs_review")
    assert event.reason == "verified, but 750.00 EUR is above the limit of 500.00"
    assert ReviewItem.objects.get(action=action, status="open").kind == ReviewKind.UNKNOWN_OUTCOME
    assert action.attempts == 1


# A proxy in front of the provider answering 200 with a page of its own; one that drops the query,
# answering every effect the provider holds, none under the key asked.
MAINTENANCE_PAGE = b"<html>Down for maintenance</html>"
UNFILTERED_LISTING = json.dumps({"data": [{"id": "re_other", "operation_key": "someone-else"}], "has_more": False})


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis")
@pytest.mark.parametrize("proxy, said", [
    (answering(MAINTENANCE_PAGE), "unreadable_answer"),
    # read as found, re_other would have been recorded as this refund, which was never made
    (answering(UNFILTERED_LISTING.encode(), "application/json"), "none_under_this_key"),
], ids=["a page", "other keys' effects"])
def test_a_lookup_answered_200_without_the_listing_needs_review_and_is_never_sent_again(agent, settings, proxy, said):
    """Read as "no effect", the page requeued the action, and the refund the provider may have
    made was sent a second time."""
    action, _ = action_request(agent=agent, operation_key="refund:ORD-MP:full:dec-1", action_type="refund",
                               target="ORD-MP", params={"amount": "5.00", "currency": "EUR"})
    action = action_claim_next("tests:1", only=action.pk)
    action.mark_unknown(actor="system:tests", claim=action.fence, evidence={"call": "timeout"},
                        verify_at=clock.now() - timedelta(seconds=1))
    with thread_server(proxy) as server:
        settings.SANDBOX_BASE_URL = server.url
        action_run_claimed(action_claim_next("tests:2", only=action.pk))

    action = Action.objects.get(pk=action.pk)
    assert (action.status, action.external_ref) == ("needs_review", "")
    verification = action.evidence[-1]
    assert verification["found"] is None
    assert verification["verification"][said]
    [event] = audit_events(action, "needs_review")
    assert event.reason == "the provider cannot say whether the effect happened"
