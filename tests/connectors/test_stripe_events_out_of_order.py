"""POST /webhooks/stripe/ with a refund's events in the order Stripe may deliver them, not the order
they were made in: Stripe retries a delivery for days, so `refund.created` (the refund `succeeded`
as of when that event was made) may come after `refund.failed`. The failure, arriving while the
action's outcome was open, only sent it to be verified; the late success then settled it as made.
Decision 60 holds in either order: the action settles as the success says, and a person is told
that the provider failed that very refund (one `failed_effect` incident)."""

import json
import time

import pytest

from dlq.incidents import Incident, IncidentKind
from dlq.models import Alert
from ledger.models import ActionStatus
from ledger.signing import sign_webhook
from tests.factories import make_action, make_agent, stripe_webhooks_configured

LIVE, TEST = "whsec_review", "whsec_review_test"
KEY = "refund:ch_1:dec-1"
REFUND = {"id": "re_1", "object": "refund", "amount": 2500, "currency": "eur", "charge": "ch_1",
          "metadata": {"operation_key": KEY}}
FAILED = {**REFUND, "status": "failed", "failure_reason": "expired_or_canceled_card"}
S = ActionStatus


@pytest.fixture(autouse=True)
def stripe_refunds(settings):
    stripe_webhooks_configured(settings, LIVE, TEST)


def deliver(client, event_id, event_type, refund, *, age=0, secret=LIVE):
    """A Stripe event about `refund`, made `age` seconds ago, signed now (as a redelivery is)."""
    body = json.dumps({"id": event_id, "object": "event", "type": event_type, "created": int(time.time()) - age,
                       "data": {"object": refund}}).encode()
    answer = client.generic("POST", "/webhooks/stripe/", body, content_type="application/json",
                            headers={"Stripe-Signature": sign_webhook(body, secret)})
    assert answer.status_code == 200, answer.content
    return answer.json()


def open_refund(status):
    """A refund whose call timed out (`unknown`), or whose verification left it to a person."""
    return make_action(make_agent("billing", grants=())[0], status, key=KEY, target="ch_1", attempts=1, fence=2)


@pytest.mark.parametrize("status", [S.UNKNOWN, S.NEEDS_REVIEW])
def test_a_stale_success_after_the_refunds_failure_settles_it_and_opens_one_failed_effect_incident(client, db,
                                                                                                   status):
    """The ledger said refunded, Stripe had failed the refund, and nobody was told. The success
    still settles the action (a person decides what follows, never a retry: decision 60), and the
    failure stored before it opens the incident it opens when it comes second; the failure sent
    again, under its own id or another event's, opens no second one."""
    action = open_refund(status)
    deliver(client, "evt_2", "refund.failed", FAILED)

    settled = deliver(client, "evt_1", "refund.created", {**REFUND, "status": "succeeded"}, age=600)

    assert settled["outcome"] == f"settled {KEY} as succeeded; refund.failed of re_1 came first: a person is told"
    action.refresh_from_db()
    assert (action.status, action.external_ref) == (S.SUCCEEDED, "re_1")
    [incident] = Incident.objects.all()
    assert (incident.kind, incident.operation_key, incident.external_refs, incident.status) == (
        IncidentKind.FAILED_EFFECT, KEY, ["re_1"], "open")
    assert incident.evidence["effects"][0]["raw"]["event_id"] == "evt_2"
    assert deliver(client, "evt_2", "refund.failed", FAILED) == {"duplicate": True}
    deliver(client, "evt_3", "charge.refund.updated", FAILED)
    assert Incident.objects.count() == 1 and Alert.objects.filter(incident=incident).count() == 1


def test_a_failure_of_another_refund_under_the_key_is_no_incident_when_the_success_comes(client, db):
    """An earlier attempt's refund that failed is not the one the success names: nothing is told."""
    action = open_refund(S.UNKNOWN)
    deliver(client, "evt_0", "refund.failed", {**FAILED, "id": "re_0"})

    deliver(client, "evt_1", "refund.created", {**REFUND, "status": "succeeded"})

    action.refresh_from_db()
    assert (action.status, action.external_ref) == (S.SUCCEEDED, "re_1")
    assert not Incident.objects.exists()


def test_a_test_mode_failure_is_never_told_of_a_live_refund(client, db):
    """An event only the test-mode secret verifies never acts on a live action, stored or not."""
    action = open_refund(S.UNKNOWN)
    deliver(client, "evt_t", "refund.failed", FAILED, secret=TEST)

    deliver(client, "evt_1", "refund.created", {**REFUND, "status": "succeeded"})

    action.refresh_from_db()
    assert action.status == S.SUCCEEDED
    assert not Incident.objects.exists()
