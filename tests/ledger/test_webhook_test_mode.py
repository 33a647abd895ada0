"""POST /webhooks/stripe/ with Stripe's test-mode endpoint secret beside the live one: an event
signed with the test secret is a test-mode event, which settles a replay run's action and never
a live one; the live secret settles live actions as before."""

import json

import pytest

from ledger.models import ActionStatus, WebhookEvent
from ledger.replay import replay_agent
from ledger.signing import sign_webhook
from tests.factories import make_action, make_agent, stripe_webhooks_configured

LIVE, TEST = "whsec_live_endpoint", "whsec_test_endpoint"
S = ActionStatus


@pytest.fixture(autouse=True)
def stripe_refunds(settings):
    stripe_webhooks_configured(settings, LIVE, TEST)


def deliver(client, key, secret, event_id, *, livemode=None):
    """A signed `refund.updated` for `key`; with `livemode`, the event says which mode it is of."""
    refund = {"id": f"re_{event_id}", "object": "refund", "status": "succeeded", "metadata": {"operation_key": key}}
    event = {"id": event_id, "object": "event", "type": "refund.updated", "data": {"object": refund}}
    body = json.dumps(event if livemode is None else {**event, "livemode": livemode}).encode()
    return client.generic("POST", "/webhooks/stripe/", body, content_type="application/json",
                          headers={"Stripe-Signature": sign_webhook(body, secret)})


@pytest.fixture
def unknown_actions(db):
    live = make_action(make_agent("billing", grants=())[0], S.UNKNOWN, key="refund:ch_1:dec-1", target="ch_1",
                       attempts=1, fence=2)
    replayed = make_action(replay_agent(), S.UNKNOWN, key="replay:7:timeout", target="ch_2", attempts=1, fence=2)
    return live, replayed


def test_an_event_signed_with_the_test_secret_settles_a_replay_action(client, unknown_actions):
    _, replayed = unknown_actions
    answer = deliver(client, replayed.operation_key, TEST, "evt_t1")
    assert answer.status_code == 200, answer.content
    replayed.refresh_from_db()
    assert replayed.status == S.SUCCEEDED and replayed.external_ref == "re_evt_t1"
    assert WebhookEvent.objects.get().payload["test_mode"] is True


def test_an_event_signed_with_the_test_secret_never_settles_a_live_action(client, unknown_actions):
    live, _ = unknown_actions
    answer = deliver(client, live.operation_key, TEST, "evt_t2")
    assert answer.status_code == 200 and "not applied" in answer.json()["outcome"]
    live.refresh_from_db()
    assert live.status == S.UNKNOWN


def test_the_live_secret_settles_a_live_action_and_any_other_secret_is_refused(client, unknown_actions):
    live, _ = unknown_actions
    refused = deliver(client, live.operation_key, "whsec_someone_else", "evt_x")
    assert refused.status_code == 400 and "Stripe-Signature" in refused.json()["detail"]
    assert deliver(client, live.operation_key, LIVE, "evt_l1").status_code == 200
    live.refresh_from_db()
    assert live.status == S.SUCCEEDED
    assert "test_mode" not in WebhookEvent.objects.get().payload
