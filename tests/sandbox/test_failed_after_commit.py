"""The sandbox's `failed_after_commit` fault: the provider makes the effect, answers that it made it,
and then fails it, as Stripe fails a refund to a card closed since the payment (decision 60). Its
failure event follows its success event, both naming the effect; a refund is listed `failed` in
Stripe's wire format from then on. Events are recorded here, not sent: these tests' transactions
never commit (tests/sandbox/test_outbound_webhooks.py sends them)."""

import pytest

from sandbox.models import SandboxFault, SandboxMessage, SandboxRefund, SandboxWebhook

from .test_sandbox_api import arm, message_body, refund_body
from .test_stripe_edges import refund as stripe_refund
from .test_stripe_edges import stripe

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def webhooks_on(settings):
    settings.SANDBOX_WEBHOOK_URL = "http://127.0.0.1:9/webhooks/sandbox/"


def events():
    return [(event.event_type, event.data["id"], event.data["status"]) for event in SandboxWebhook.objects.all()]


def test_a_refund_is_answered_made_then_failed_with_its_failure_event_after_its_success(sandbox):
    arm(sandbox, "ORD-1", "failed_after_commit")

    response = sandbox.post("refunds", refund_body(), idempotency_key="k-1")

    assert response.status_code == 201
    refund = response.json()
    assert refund["status"] == "succeeded"
    assert SandboxRefund.objects.get().status == "failed"
    assert events() == [("refund.succeeded", refund["id"], "succeeded"), ("refund.failed", refund["id"], "failed")]
    assert SandboxWebhook.objects.get(event_type="refund.failed").data["metadata"] == refund["metadata"]
    assert SandboxFault.objects.get().remaining == 0


def test_a_refund_failed_after_it_was_made_is_listed_failed_in_its_list_and_its_order(sandbox):
    """The contract: "a refund is listed `failed` from then on". Only Stripe's wire format did; the
    sandbox's own list and its order said `succeeded`."""
    sandbox.post("orders", {"order_id": "ORD-1", "customer": "CUST-1", "amount": "80.00", "currency": "EUR"})
    arm(sandbox, "ORD-1", "failed_after_commit")
    made = sandbox.post("refunds", refund_body(), idempotency_key="k-1").json()

    [listed] = sandbox.get("refunds", order_id="ORD-1").json()["data"]
    [in_its_order] = sandbox.get("orders/ORD-1").json()["refunds"]
    assert (made["status"], listed["status"], in_its_order["status"]) == ("succeeded", "failed", "failed")
    assert listed["id"] == in_its_order["id"] == made["id"]


def test_a_replay_of_the_key_fails_nothing_more(sandbox):
    arm(sandbox, "ORD-1", "failed_after_commit", times=2)
    first = sandbox.post("refunds", refund_body(), idempotency_key="k-1")

    again = sandbox.post("refunds", refund_body(), idempotency_key="k-1")

    assert (again.status_code, again.json()) == (200, first.json())
    assert [event_type for event_type, _, _ in events()] == ["refund.succeeded", "refund.failed"]


def test_a_message_is_failed_so_too(sandbox):
    arm(sandbox, "ada@example.com", "failed_after_commit")

    response = sandbox.post("messages", message_body())

    assert response.status_code == 201
    message = SandboxMessage.objects.get()
    assert events() == [("message.delivered", message.message_id, "sent"), ("message.failed", message.message_id,
                                                                              "failed")]


def test_stripes_wire_format_answers_the_refund_made_and_lists_it_failed(sandbox, client):
    charge = stripe(client, "post", "charges", {"amount": "2500", "currency": "eur", "source": "tok_visa"}).json()["id"]
    arm(sandbox, charge, "failed_after_commit")

    answer = stripe_refund(client, charge, "1000")

    assert (answer.status_code, answer.json()["status"]) == (200, "succeeded")
    [listed] = stripe(client, "get", "refunds", {"charge": charge}).json()["data"]
    assert (listed["id"], listed["status"]) == (answer.json()["id"], "failed")
    assert not SandboxWebhook.objects.exists()  # Stripe's wire format sends no events of its own
    # A failed refund gave nothing back: the whole charge can be refunded again, as at Stripe.
    assert stripe_refund(client, charge, "2500").status_code == 200
