"""A refund Stripe fails days after the ledger recorded it made, whose webhook never came (an endpoint
down past Stripe's retries, a wrong secret): the next reconciliation, whatever its window, reads the
provider's listing back far enough to find it, and opens the failed-effect incident of decision 60,
once, also when the webhook arrives after all. A refund still `pending` is no finding. The provider
is the sandbox's Stripe wire format over HTTP, read by the Stripe connector; the run is the
`reconcile` command's."""

import json
import time
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from dlq.incidents import Incident, IncidentKind
from dlq.models import Alert
from ledger.signing import sign_webhook
from sandbox.models import SandboxOrder, SandboxRefund
from tests.connectors.stripe_stack import sandbox_stripe
from tests.factories import make_action, make_agent

SECRET = "whsec_late_failures"


@pytest.fixture
def stripe_at_the_sandbox(stack, settings):
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.stripe.StripeConnector",
        "options": {"api_key": "sk_test_surety", "api_base": sandbox_stripe(stack.url), "webhook_secret": SECRET}}}
    return stack


def refunded_days_ago(n, days, status):
    """A refund the ledger recorded succeeded `days` ago, as Stripe lists it now (`status`)."""
    key, charge = f"refund:ch_late{n}:full:dec-{n}", f"ch_late{n}"
    SandboxOrder.objects.create(order_id=charge, customer=f"CUST-{n}", amount=Decimal("25.00"), currency="EUR")
    refund = SandboxRefund.objects.create(order_id=charge, amount=Decimal("25.00"), currency="EUR", status=status,
                                          operation_key=key, metadata={"operation_key": key},
                                          created_at=timezone.now() - timedelta(days=days))
    make_action(make_agent(f"billing-{n}")[0], "succeeded", key=key, target=charge, external_ref=refund.refund_id)
    return key, refund


def reconcile_last_hour():
    out = StringIO()
    call_command("reconcile", "--hours", "1", stdout=out)
    return out.getvalue()


def deliver_failure(client, refund):
    """Stripe's `refund.failed` for `refund`, signed as its endpoint's secret signs it."""
    data = {"id": refund.refund_id, "object": "refund", "amount": 2500, "currency": "eur", "charge": refund.order_id,
            "metadata": refund.metadata, "status": "failed", "failure_reason": "expired_or_canceled_card"}
    body = json.dumps({"id": "evt_late_1", "object": "event", "type": "refund.failed", "created": int(time.time()),
                       "data": {"object": data}}).encode()
    answer = client.generic("POST", "/webhooks/stripe/", body, content_type="application/json",
                            headers={"Stripe-Signature": sign_webhook(body, SECRET)})
    assert answer.status_code == 200, answer.content


def test_a_refund_failed_days_after_it_succeeded_opens_one_incident_without_its_webhook(stripe_at_the_sandbox,
                                                                                       client):
    key, refund = refunded_days_ago(1, 3, "failed")

    printed = reconcile_last_hour()

    incident = Incident.objects.get()
    assert (incident.kind, incident.connector, incident.subject) == (IncidentKind.FAILED_EFFECT, "stripe", key)
    assert incident.external_refs == [refund.refund_id]
    assert incident.evidence["effects"][0]["raw"]["status"] == "failed"
    assert Alert.objects.filter(incident=incident).count() == 1
    assert "opened 1" in printed

    # Run again, then the webhook arrives after all: the same incident, no other, no other alert.
    assert "opened 0" in reconcile_last_hour()
    deliver_failure(client, refund)
    assert Incident.objects.get() == incident and Alert.objects.count() == 1


def test_a_refund_still_pending_is_no_finding_beside_one_that_failed(stripe_at_the_sandbox):
    _, pending = refunded_days_ago(1, 2, "pending")
    failed_key, failed = refunded_days_ago(2, 2, "failed")

    reconcile_last_hour()

    incident = Incident.objects.get()
    assert (incident.subject, incident.external_refs) == (failed_key, [failed.refund_id])
