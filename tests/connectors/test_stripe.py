"""Refunds through the Stripe connector, i.e. the official `stripe` SDK, against the sandbox
speaking Stripe's wire format (/sandbox/stripe/v1/): real gunicorn, RQ workers, PostgreSQL and
Redis; the connector and the SDK are not changed for the sandbox in any way."""

import json
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import stripe

from dlq.reconcile import findings_in
from ledger.connectors.stripe import StripeConnector
from ledger.models import Action, WebhookEvent
from ledger.webhooks import sign_webhook
from tests.conftest import wait_until
from tests.connectors.stripe_stack import (  # noqa: F401 (fixtures)
    API_KEY, WEBHOOK_SECRET, make_order, stripe_client, stripe_server, stripe_stack)
from tests.factories import api_client, make_agent, post_action, refund_body, sandbox, sandbox_list


def settled(client, key, seconds=30):
    def done():
        action = client.get(f"/api/v1/actions/{key}").json()
        return action["status"] not in {"queued", "pending", "unknown"} and action

    return wait_until(done, seconds=seconds, message=f"{key} to settle")


def stripe_refunds(client, charge):
    """The refunds of `charge` as Stripe's own list shows them."""
    response = client.get("/sandbox/stripe/v1/refunds", params={"charge": charge},
                          headers={"Authorization": "Bearer sk_test_reader"})
    assert response.status_code == 200, response.text
    return response.json()["data"]


@pytest.fixture
def billing(stripe_stack):
    _, token = make_agent("billing")
    return api_client(stripe_stack.url, token)


def test_a_refund_is_made_at_stripe_with_the_operation_key_as_idempotency_key_and_in_metadata(stripe_stack, billing):
    make_order(billing, "ch_1")
    stripe_stack.start_worker()
    assert post_action(billing, "refund:ch_1:full:dec-1", refund_body("ch_1", reason="late")).status_code == 201
    action = settled(billing, "refund:ch_1:full:dec-1")
    assert action["status"] == "succeeded", action
    [refund] = stripe_refunds(billing, "ch_1")
    assert action["external_ref"] == refund["id"]
    assert (refund["amount"], refund["currency"], refund["status"]) == (2500, "eur", "succeeded")
    assert refund["metadata"] == {"operation_key": "refund:ch_1:full:dec-1", "reason": "late"}
    assert action["result"]["amount"] == 2500
    # One store under both wire formats: the sandbox's own API sees the same refund.
    [same] = sandbox_list(billing, "refunds", operation_key="refund:ch_1:full:dec-1")
    assert (same["id"], same["amount"]) == (refund["id"], "25.00")


def test_a_replay_with_the_same_key_gets_stripes_first_answer_and_no_second_refund(stripe_stack, billing):
    make_order(billing, "ch_2")
    sdk = stripe_client(stripe_stack.url)
    params = {"charge": "ch_2", "amount": 500, "metadata": {"operation_key": "refund:ch_2:a"}}
    first = sdk.v1.refunds.create(params=params, options={"idempotency_key": "refund:ch_2:a"})
    again = sdk.v1.refunds.create(params=params, options={"idempotency_key": "refund:ch_2:a"})
    assert again.id == first.id
    assert again.last_response.headers.get("Idempotent-Replayed") == "true"
    assert first.last_response.headers.get("Idempotent-Replayed") is None
    # The same key with other parameters is Stripe's idempotency error: nothing new is made.
    with pytest.raises(stripe.IdempotencyError):
        sdk.v1.refunds.create(params={**params, "amount": 600}, options={"idempotency_key": "refund:ch_2:a"})
    assert [r["id"] for r in stripe_refunds(billing, "ch_2")] == [first.id]
    # Through the ledger: the same request twice is one action and one refund.
    stripe_stack.start_worker()
    post_action(billing, "refund:ch_2:b", refund_body("ch_2"))
    done = settled(billing, "refund:ch_2:b")
    replayed = post_action(billing, "refund:ch_2:b", refund_body("ch_2"))
    assert replayed.status_code == 200 and replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.json()["external_ref"] == done["external_ref"]
    assert len(stripe_refunds(billing, "ch_2")) == 2


def test_a_timeout_after_stripe_committed_is_verified_by_the_metadata_not_repeated(stripe_stack, billing):
    make_order(billing, "ch_3")
    # Without the provider's own idempotency a blind retry would refund twice.
    sandbox(billing, "PUT", "settings", json={"idempotency": False})
    sandbox(billing, "POST", "faults", json={"target": "ch_3", "fault": "timeout_after_commit"})
    stripe_stack.start_worker()
    post_action(billing, "refund:ch_3:full:dec-3", refund_body("ch_3"))
    action = settled(billing, "refund:ch_3:full:dec-3")
    assert (action["status"], action["attempts"]) == ("succeeded", 1)
    assert [r["id"] for r in stripe_refunds(billing, "ch_3")] == [action["external_ref"]]
    evidence = Action.objects.get(operation_key="refund:ch_3:full:dec-3").evidence
    assert evidence[0]["code"] == "timeout" and evidence[-1]["found"] is True
    assert "metadata.operation_key" in evidence[-1]["verification"]["lookup"]


def test_a_timeout_before_anything_was_committed_is_verified_absent_and_tried_again(stripe_stack, billing):
    make_order(billing, "pi_4")
    sandbox(billing, "POST", "faults", json={"target": "pi_4", "fault": "timeout_before_commit"})
    stripe_stack.start_worker()
    post_action(billing, "refund:pi_4:full:dec-4", refund_body("pi_4"))
    action = settled(billing, "refund:pi_4:full:dec-4")
    assert (action["status"], action["attempts"]) == ("succeeded", 2)
    refunds = billing.get("/sandbox/stripe/v1/refunds", params={"payment_intent": "pi_4"},
                          headers={"Authorization": "Bearer sk_test_reader"}).json()["data"]
    assert [(r["id"], r["payment_intent"]) for r in refunds] == [(action["external_ref"], "pi_4")]


def test_a_decline_is_a_permanent_failure_with_stripes_code(stripe_stack, billing):
    make_order(billing, "ch_5")
    sandbox(billing, "POST", "faults", json={"target": "ch_5", "fault": "decline"})
    stripe_stack.start_worker()
    post_action(billing, "refund:ch_5:full:dec-5", refund_body("ch_5"))
    action = settled(billing, "refund:ch_5:full:dec-5")
    assert action["status"] == "failed"
    assert (action["error"]["code"], action["error"]["retryable"]) == ("card_declined", False)
    assert stripe_refunds(billing, "ch_5") == []


def test_a_500_at_stripe_spends_the_key_the_retries_get_it_replayed_and_no_refund_is_made(stripe_stack, billing):
    """Stripe saves a 500 under its key and answers every retry with it: the ledger verifies
    each time, finds nothing, and after its attempts the action fails for a person to decide."""
    make_order(billing, "ch_8")
    sandbox(billing, "POST", "faults", json={"target": "ch_8", "fault": "error_500"})
    stripe_stack.start_worker()
    post_action(billing, "refund:ch_8:full:dec-8", refund_body("ch_8"))
    action = settled(billing, "refund:ch_8:full:dec-8", seconds=60)
    assert (action["status"], action["attempts"], action["error"]["code"]) == ("failed", 3, "attempts_exhausted")
    codes = [entry.get("code") for entry in Action.objects.get(operation_key="refund:ch_8:full:dec-8").evidence]
    assert codes.count("http_500") == 3
    assert stripe_refunds(billing, "ch_8") == []


def test_a_refund_in_another_currency_than_the_charge_is_refused_before_anything_is_sent(stripe_stack, billing):
    make_order(billing, "ch_6", amount="5000", currency="JPY")
    stripe_stack.start_worker()
    post_action(billing, "refund:ch_6:full:dec-6", refund_body("ch_6", amount="25.00", currency="EUR"))
    action = settled(billing, "refund:ch_6:full:dec-6")
    assert (action["status"], action["error"]["code"]) == ("failed", "currency_mismatch")
    assert stripe_refunds(billing, "ch_6") == []


def test_reconciliation_reads_kwds_three_decimals_back_in_stripes_units(stripe_stack, billing):
    """KWD has three decimals at Stripe: a refund of 1.230 KWD goes as 1230 units, reconciliation
    reads it back as 1.230, and flags a ledger's 12.300 (which two decimals would also make 1230).
    On the sandbox because no outside server can stage it: stripe-stateful-mock knows no KWD and
    localstripe cannot list refunds by `created` (tests/connectors/stripe_servers.py); JPY and
    HUF are reconciled against stripe-stateful-mock (test_stripe_independent_servers.py)."""
    make_order(billing, "ch_kwd", amount="10.000", currency="KWD")
    post_action(billing, "refund:ch_kwd", refund_body("ch_kwd", amount="1.230", currency="KWD"))
    stripe_stack.start_worker()
    assert settled(billing, "refund:ch_kwd")["status"] == "succeeded"
    assert [(r["amount"], r["currency"]) for r in stripe_refunds(billing, "ch_kwd")] == [(1230, "kwd")]
    connector = StripeConnector(api_key=API_KEY, api_base=f"{stripe_stack.url}/sandbox/stripe")
    now = datetime.now(UTC)
    window = now - timedelta(minutes=5), now + timedelta(minutes=1)
    assert [(r.operation_key, r.amount, r.units, r.currency) for r in connector.records(*window)] == [
        ("refund:ch_kwd", Decimal("1.230"), 1230, "KWD")]
    assert findings_in(connector, connector.records(*window)) == (1, [])

    Action.objects.filter(operation_key="refund:ch_kwd").update(amount=Decimal("12.300"))
    _, [mismatch] = findings_in(connector, connector.records(*window))
    assert (mismatch.kind, mismatch.operation_key) == ("amount_mismatch", "refund:ch_kwd")
    assert (mismatch.effects[0]["units"], mismatch.ledger["amount"]) == (1230, "12.300")


def stripe_event(event_type, refund, *, event_id="evt_1"):
    return json.dumps({"id": event_id, "object": "event", "type": event_type, "api_version": "2025-03-31.basil",
                       "created": int(time.time()), "data": {"object": refund}}).encode()


def deliver(client, body, *, secret=WEBHOOK_SECRET, age=0):
    signature = sign_webhook(body, secret, timestamp=time.time() - age)
    return client.post("/webhooks/stripe/", content=body,
                       headers={"Stripe-Signature": signature, "Content-Type": "application/json"})


def test_a_stripe_webhook_settles_an_unknown_refund_and_bad_ones_settle_nothing(stripe_stack, billing):
    make_order(billing, "ch_7")
    sandbox(billing, "POST", "faults", json={"target": "ch_7", "fault": "timeout_after_commit"})
    post_action(billing, "refund:ch_7:full:dec-7", refund_body("ch_7"))
    # A burst worker makes the attempt and stops: nobody verifies the unknown outcome.
    burst = stripe_stack.start_worker(burst=True)
    burst.wait(30)
    stripe_stack.workers.remove(burst)
    assert Action.objects.get(operation_key="refund:ch_7:full:dec-7").status == "unknown"
    [refund] = stripe_refunds(billing, "ch_7")
    refund = {**refund, "status": "succeeded"}

    refused = [
        deliver(billing, stripe_event("refund.updated", refund), secret="whsec_someone_else"),
        deliver(billing, stripe_event("refund.updated", refund), age=600),  # a replayed, stale delivery
    ]
    assert [r.status_code for r in refused] == [400, 400]
    assert "Stripe-Signature" in refused[0].json()["detail"]
    assert WebhookEvent.objects.count() == 0
    # A verified event about no refund is kept and settles nothing (refused, Stripe would send it
    # again for days, then turn the endpoint off).
    other = deliver(billing, stripe_event("customer.created", {"id": "cus_1", "object": "customer"}, event_id="evt_c"))
    assert other.status_code == 200 and other.json()["outcome"] == "ignored", other.text
    assert WebhookEvent.objects.get().event_type == "customer.created"
    assert Action.objects.get(operation_key="refund:ch_7:full:dec-7").status == "unknown"

    first = deliver(billing, stripe_event("refund.updated", refund))
    assert first.status_code == 200 and "settled" in first.json()["outcome"], first.text
    action = Action.objects.get(operation_key="refund:ch_7:full:dec-7")
    assert (action.status, action.external_ref) == ("succeeded", refund["id"])
    assert deliver(billing, stripe_event("refund.updated", refund)).json() == {"duplicate": True}
    stored = WebhookEvent.objects.get(event_type="refund.succeeded")
    assert stored.connector == "stripe"
    assert stored.payload["stripe_event"]["type"] == "refund.updated"
