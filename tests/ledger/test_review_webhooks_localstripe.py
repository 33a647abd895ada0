"""POST /webhooks/stripe/ by a Stripe-compatible server written by others: localstripe sends its
events as Stripe does (signed `Stripe-Signature` over the raw body, its own JSON layout), to the
endpoint it was given. It sends none about refunds (tests/connectors/stripe_servers.py names what
it lacks): the events it does send, about a customer and a payment, are verified, stored once and
answered 200 "ignored", so that Stripe would neither retry them nor turn the endpoint off."""

import httpx
import pytest

from ledger.models import WebhookEvent
from tests.conftest import wait_until
from tests.connectors.stripe_servers import provider_app, provider_stack, stripe_provider, uses  # noqa: F401
from tests.connectors.stripe_stack import WEBHOOK_SECRET

pytestmark = uses("localstripe")
SENT = {"customer.created", "payment_intent.succeeded"}


@pytest.fixture
def endpoint(provider_stack, stripe_provider):
    """localstripe posting SENT's events to the app's Stripe endpoint; afterwards, none anywhere."""
    config = f"{stripe_provider.url}/_config/webhooks/surety"
    url = f"{provider_stack.url}/webhooks/stripe/"
    assert httpx.post(config, json={"url": url, "secret": WEBHOOK_SECRET, "events": sorted(SENT)}).status_code == 200
    yield
    assert httpx.post(config, json={"url": url, "secret": WEBHOOK_SECRET, "events": []}).status_code == 200


def stored_events():
    return {event.event_type: event for event in WebhookEvent.objects.filter(connector="stripe")}


def test_a_stripe_compatible_servers_own_events_are_verified_stored_once_and_ignored(endpoint, stripe_provider):
    client = stripe_provider.client()
    customer = client.v1.customers.create(params={"email": "payer@example.com"})
    intent = client.v1.payment_intents.create(params={
        "amount": 2500, "currency": "eur", "payment_method": "pm_card_visa", "confirm": True})
    assert intent.status == "succeeded"

    stored = wait_until(lambda: (events := stored_events()).keys() >= SENT and events, seconds=20,
                        message="localstripe's events to be stored")

    assert {kind: event.outcome for kind, event in stored.items()} == dict.fromkeys(SENT, "ignored")
    assert stored["customer.created"].payload["stripe_event"]["data"]["object"]["id"] == customer.id
    assert stored["payment_intent.succeeded"].payload["stripe_event"]["data"]["object"]["id"] == intent.id
    assert WebhookEvent.objects.filter(connector="stripe").count() == len(SENT)
