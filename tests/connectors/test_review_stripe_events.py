"""POST /webhooks/stripe/ with verified events that hold what PostgreSQL cannot store, and with a
`Stripe-Signature` carrying several signatures.

JSON's escapes can name a NUL or a lone surrogate, in a customer's name, say, in an event of a
type Surety ignores. Refused, a correctly signed event is sent again by Stripe for three days, and
the endpoint may then be turned off: it is stored mended (U+FFFD, as a provider's answers are) and
answered 200. The signature is checked over the bytes that came, before anything is mended.
During a rotation of the endpoint's secret, Stripe signs with the old and the new secret (and a
header may carry a `v0` besides): any `v1` that holds verifies the event."""

import json
import math

import pytest

from ledger.models import Action, ActionStatus, WebhookEvent
from ledger.signing import sign_webhook
from tests.factories import make_action, make_agent, stripe_webhooks_configured

LIVE, TEST = "whsec_review_events", "whsec_review_events_test"
KEY = "refund:ch_1:dec-1"
S = ActionStatus


@pytest.fixture(autouse=True)
def stripe_refunds(settings):
    stripe_webhooks_configured(settings, LIVE, TEST)


def event(event_id, event_type, obj):
    return {"id": event_id, "object": "event", "type": event_type, "data": {"object": obj}}


def post(client, body, signature):
    return client.generic("POST", "/webhooks/stripe/", body, content_type="application/json",
                          headers={"Stripe-Signature": signature})


def deliver(client, body):
    """`body` (bytes, or an event: JSON with ASCII escapes, as Stripe sends), signed with the endpoint's secret."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return post(client, raw, sign_webhook(raw, LIVE))


def unknown_refund(key=KEY):
    return make_action(make_agent("billing", grants=())[0], S.UNKNOWN, key=key, target="ch_1", attempts=1, fence=2)


def refund(key=KEY, **fields):
    return {"id": "re_1", "object": "refund", "status": "succeeded", "amount": 2500, "currency": "eur",
            "metadata": {"operation_key": key}, **fields}


@pytest.mark.parametrize("name, stored", [("Ad\x00a", "Ad\ufffda"), ("Ad\ud800a", "Ad\ufffda"),
                                          (math.inf, "inf")], ids=["nul", "lone_surrogate", "not_finite"])
def test_an_event_surety_ignores_holding_what_postgresql_refuses_is_stored_mended(client, db, name, stored):
    """It was refused 400 (`invalid`): Stripe sent it again for days, then could turn the endpoint off."""
    customer = {"id": "cus_1", "object": "customer", "name": name, "metadata": {"note\x00": "x"}}

    answer = deliver(client, event("evt_c1", "customer.updated", customer))

    assert answer.status_code == 200, answer.content
    assert answer.json() == {"received": True, "outcome": "ignored"}
    kept = WebhookEvent.objects.get()
    assert (kept.event_id, kept.event_type) == ("evt_c1", "customer.updated")
    assert kept.payload["stripe_event"]["data"]["object"]["name"] == stored
    assert kept.payload["stripe_event"]["data"]["object"]["metadata"] == {"note\ufffd": "x"}
    assert deliver(client, event("evt_c1", "customer.updated", customer)).json() == {"duplicate": True}


def test_a_refund_event_with_a_nul_beside_what_it_says_settles_the_refund_and_keeps_it_mended(client, db):
    action = unknown_refund()

    answer = deliver(client, event("evt_r1", "refund.updated", refund(description="ca\x00rd \ud83d")))

    assert answer.status_code == 200, answer.content
    assert answer.json()["outcome"] == f"settled {KEY} as succeeded"
    action.refresh_from_db()
    assert (action.status, action.external_ref) == (S.SUCCEEDED, "re_1")
    assert action.result["description"] == "ca\ufffdrd \ufffd"
    assert action.evidence[-1]["data"]["description"] == "ca\ufffdrd \ufffd"


def test_a_refund_event_whose_operation_key_had_to_be_mended_is_stored_and_settles_nothing(client, db):
    """Mended, `refund:\\x00` would read as `refund:\\ufffd`, another action's key: what the event
    says of which action it settles cannot be read, so it settles none."""
    action = unknown_refund("refund:\ufffd")

    answer = deliver(client, event("evt_r2", "refund.updated", refund("refund:\x00")))

    assert answer.status_code == 200, answer.content
    action.refresh_from_db()
    assert action.status == S.UNKNOWN
    kept = WebhookEvent.objects.get()
    assert (kept.event_id, kept.operation_key) == ("evt_r2", "")
    assert kept.payload["stripe_event"]["data"]["object"]["metadata"]["operation_key"] == "refund:\ufffd"
    assert "operation key" in kept.payload["unreadable"]


def test_the_outcome_of_an_event_that_cannot_be_read_says_so(client, db):
    answer = deliver(client, event("evt_r3", "refund.updated", refund("refund:\ud800")))

    assert answer.status_code == 200, answer.content
    assert "cannot be read" in answer.json()["outcome"]


def test_the_signature_is_checked_over_the_bytes_that_came_not_over_the_mended_event(client, db):
    unknown_refund()
    sent = json.dumps(event("evt_r4", "refund.updated", refund(description="\x00"))).encode()
    mended = sent.replace(b"\\u0000", "\ufffd".encode())

    refused = post(client, sent, sign_webhook(mended, LIVE))

    assert refused.status_code == 400 and refused.json()["code"] == "webhook_refused"
    assert not WebhookEvent.objects.exists()
    assert Action.objects.get().status == S.UNKNOWN


@pytest.mark.parametrize("valid_first", [True, False])
def test_a_signature_header_of_a_secrets_rotation_verifies_by_any_of_its_v1_signatures(client, db, valid_first):
    """Stripe signs with the expiring secret and the new one for as long as the rotation lasts."""
    action = unknown_refund()
    raw = json.dumps(event("evt_r5", "refund.updated", refund())).encode()
    stamp, valid = sign_webhook(raw, LIVE).split(",")
    other = sign_webhook(raw, "whsec_expiring").split(",")[1]
    signatures = [valid, other] if valid_first else [other, valid]

    answer = post(client, raw, ",".join([stamp, *signatures, "v0=" + "0" * 64]))

    assert answer.status_code == 200, answer.content
    action.refresh_from_db()
    assert action.status == S.SUCCEEDED
    assert post(client, raw, ",".join([stamp, other, "v0=" + "0" * 64])).status_code == 400
