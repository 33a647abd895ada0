"""POST /webhooks/stripe/ where Stripe's test mode has no webhook secret of its own
(STRIPE_TEST_WEBHOOK_SECRET unset: its default is none, docs/contract.md). A test-mode event is
refused, with a problem that says why, and logged; it is never verified with the live secret, not
even one the live secret signed (as the replay set signed its test events while its test mode took
the live secret over). Live events are read as before, and a deployment whose own key is a test key
(staging) reads Stripe's test-mode events as its own."""

import logging

import pytest

from ledger.connectors import test_mode
from ledger.models import ActionStatus, WebhookEvent
from ledger.replay import CaseFailed, _stripe_event
from tests.factories import stripe_webhooks_configured
from tests.ledger.test_webhook_test_mode import LIVE, unknown_actions  # noqa: F401 (a fixture)
from tests.ledger.test_webhook_test_mode import deliver as deliver_signed

S = ActionStatus


def deliver(client, key, event_id, *, livemode):
    """An event signed with the live secret, saying which mode it is of."""
    return deliver_signed(client, key, LIVE, event_id, livemode=livemode)


@pytest.fixture(autouse=True)
def live_stripe(settings):
    stripe_webhooks_configured(settings, LIVE, None)


@pytest.mark.parametrize("which", ["live", "replay"])
def test_a_test_mode_event_is_refused_saying_why_though_the_live_secret_signed_it(client, unknown_actions, caplog,
                                                                                  which):
    action = dict(zip(("live", "replay"), unknown_actions))[which]
    with caplog.at_level(logging.WARNING, logger="surety.webhooks"):
        answer = deliver(client, action.operation_key, "evt_t1", livemode=False)

    assert answer.status_code == 400 and answer["Content-Type"] == "application/problem+json"
    problem = answer.json()
    assert problem["code"] == "webhook_refused"
    assert "STRIPE_TEST_WEBHOOK_SECRET" in problem["detail"] and "test-mode event" in problem["detail"]
    assert "STRIPE_TEST_WEBHOOK_SECRET" in caplog.text  # the operator's log says it too
    assert not WebhookEvent.objects.exists()  # nothing stored: configured, Stripe's redelivery is taken
    action.refresh_from_db()
    assert action.status == S.UNKNOWN


def test_a_live_event_is_read_with_the_live_secret_as_before(client, unknown_actions):
    live, _ = unknown_actions
    answer = deliver(client, live.operation_key, "evt_l1", livemode=True)
    assert answer.status_code == 200, answer.content
    live.refresh_from_db()
    assert (live.status, live.external_ref) == (S.SUCCEEDED, "re_evt_l1")


def test_a_deployment_on_a_test_key_reads_test_mode_events_as_its_own(client, unknown_actions, settings):
    stripe_webhooks_configured(settings, LIVE, None, api_key="sk_test_staging")
    live, _ = unknown_actions
    assert deliver(client, live.operation_key, "evt_s1", livemode=False).status_code == 200
    live.refresh_from_db()
    assert live.status == S.SUCCEEDED


def test_the_test_mode_takes_no_live_secret_so_the_replay_set_signs_no_test_event_with_it(db):
    connector = test_mode.test_connector_for("refund")[0]  # (by its module: pytest collects test_* names)
    assert not connector.options.get("webhook_secret")
    with pytest.raises(CaseFailed, match="STRIPE_TEST_WEBHOOK_SECRET"):
        _stripe_event(connector, "replay:7:tag:webhook")


@pytest.mark.parametrize("api_key", ["sk_live_x", "sk_test_staging"])
def test_with_a_test_secret_the_replay_sets_own_event_settles_its_action_as_a_test_mode_event(
        client, unknown_actions, settings, api_key):
    stripe_webhooks_configured(settings, LIVE, "whsec_test_endpoint", api_key=api_key)
    live, replayed = unknown_actions
    body, headers = _stripe_event(test_mode.test_connector_for("refund")[0], replayed.operation_key)
    answer = client.generic("POST", "/webhooks/stripe/", body, content_type="application/json", headers=headers)
    assert answer.status_code == 200, answer.content
    replayed.refresh_from_db()
    assert replayed.status == S.SUCCEEDED
    assert WebhookEvent.objects.get().payload["test_mode"] is True
    # The same event about a live action is stored and applied to nothing.
    body, headers = _stripe_event(test_mode.test_connector_for("refund")[0], live.operation_key)
    assert "not applied" in client.generic("POST", "/webhooks/stripe/", body, content_type="application/json",
                                           headers=headers).json()["outcome"]
    live.refresh_from_db()
    assert live.status == S.UNKNOWN
