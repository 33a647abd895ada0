"""POST /webhooks/sandbox/: verified first, stored once by event id, and able to settle `unknown`."""

import json
import time
from importlib import import_module

import pytest
from django.apps import apps as django_apps
from django.db import IntegrityError

from ledger import webhooks
from ledger.evidence import _webhooks as evidence_webhooks
from ledger.models import Action, ActionStatus, AuditEvent, WebhookClaim, WebhookEvent
from sandbox.webhooks import sign_webhook
from tests.factories import audit_events, make_action, make_agent

SECRET = "whsec-test"
URL = "/webhooks/sandbox/"
KEY = "refund:ORD-W1:full:dec-1"
S = ActionStatus


@pytest.fixture(autouse=True)
def webhook_secret(settings):
    settings.SANDBOX_ENABLED = True
    settings.SANDBOX_WEBHOOK_SECRET = SECRET


def event(event_id="evt_1", event_type="refund.succeeded", key=KEY, refund_id="re_w1"):
    return {"id": event_id, "type": event_type,
            "data": {"id": refund_id, "object": "refund", "order_id": "ORD-W1", "metadata": {"operation_key": key}}}


def deliver(client, payload, *, signature=None, secret=SECRET, age=0):
    """Sign with `secret` as of `age` seconds ago, unless a `signature` is given (False: none)."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {}
    if signature is not False:
        headers["Sandbox-Signature"] = signature or sign_webhook(body, secret, time.time() - age)
    return client.generic("POST", URL, body, content_type="application/json", headers=headers)


@pytest.fixture
def unknown_action(db):
    agent, _ = make_agent("billing", grants=())
    return make_action(agent, S.UNKNOWN, key=KEY, target="ORD-W1", attempts=1, fence=2)


@pytest.mark.parametrize(
    ("case", "kwargs"),
    [
        ("wrong secret", {"secret": "whsec-someone-else"}),
        ("garbage header", {"signature": "sha256=deadbeef"}),
        ("timestamp only", {"signature": "t=<now>"}),
        ("non-ASCII signature", {"signature": "t=<now>,v1=\u00e9\u00e9"}),
        ("stale timestamp", {"age": 302}),
        ("timestamp from the future", {"age": -302}),
        ("timestamp past a float's range", {"signature": "t=1" + "0" * 400 + ",v1=00"}),
        ("missing header", {"signature": False}),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_it_refuses_a_bad_missing_or_stale_signature_and_stores_nothing(client, unknown_action, case, kwargs):
    if isinstance(kwargs.get("signature"), str):
        kwargs = {**kwargs, "signature": kwargs["signature"].replace("<now>", str(int(time.time())))}
    response = deliver(client, event(), **kwargs)
    assert response.status_code == 400, (case, response.content)
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "webhook_refused" and response.json()["detail"]
    assert not WebhookEvent.objects.exists()
    assert Action.objects.get(pk=unknown_action.pk).status == S.UNKNOWN


def test_it_refuses_a_body_changed_after_signing(client, unknown_action):
    signed = json.dumps(event()).encode()
    tampered = json.dumps(event(refund_id="re_other")).encode()
    response = deliver(client, tampered, signature=sign_webhook(signed, SECRET))
    assert response.status_code == 400
    assert not WebhookEvent.objects.exists()


def test_a_signature_just_inside_the_tolerance_is_accepted(client, db):
    response = deliver(client, event(), age=290)
    assert response.status_code == 200
    assert response.json()["received"] is True
    assert WebhookEvent.objects.get().event_id == "evt_1"


def v1(body, secret, stamp):
    """The `v1=…` part alone of the signature `secret` makes of `body` at `stamp`."""
    return sign_webhook(body, secret, stamp).split(",", 1)[1]


@pytest.mark.parametrize("valid_first", [True, False], ids=["the valid one first", "the valid one second"])
def test_a_signature_header_with_several_v1_is_accepted_when_any_one_holds(client, db, valid_first):
    """While a secret is rolled, Stripe's scheme, which the sandbox follows, signs with the old secret
    and the new, each its own `v1`, in no set order."""
    body, stamp = json.dumps(event()).encode(), int(time.time())
    valid, rolled_out = v1(body, SECRET, stamp), v1(body, "whsec-rolled-out", stamp)
    signatures = [valid, rolled_out] if valid_first else [rolled_out, valid]
    response = deliver(client, body, signature=",".join([f"t={stamp}", *signatures]))
    assert response.status_code == 200, response.content
    assert WebhookEvent.objects.get().event_id == "evt_1"


def test_a_signature_header_whose_v1_are_all_wrong_is_refused(client, unknown_action):
    body, stamp = json.dumps(event()).encode(), int(time.time())
    signatures = [v1(body, "whsec-rolled-out", stamp), v1(body, "whsec-other", stamp), v1(b"{}", SECRET, stamp)]
    response = deliver(client, body, signature=",".join([f"t={stamp}", *signatures]))
    assert (response.status_code, response.json()["code"]) == (400, "webhook_refused")
    assert not WebhookEvent.objects.exists()
    assert Action.objects.get(pk=unknown_action.pk).status == S.UNKNOWN


def test_a_refund_succeeded_event_settles_an_unknown_action(client, unknown_action):
    response = deliver(client, event())

    assert response.status_code == 200
    assert response.json()["received"] is True
    action = Action.objects.get(pk=unknown_action.pk)
    assert (action.status, action.external_ref) == (S.SUCCEEDED, "re_w1")
    assert action.result["metadata"]["operation_key"] == KEY
    stored = WebhookEvent.objects.get()
    assert (stored.connector, stored.event_id, stored.event_type) == ("sandbox", "evt_1", "refund.succeeded")
    assert stored.outcome.startswith(f"settled {KEY}")
    settle = audit_events(action, "succeeded").get()
    assert settle.actor == "system:webhook:sandbox"
    assert "refund.succeeded" in settle.reason


def test_a_duplicate_delivery_answers_duplicate_and_does_nothing(client, unknown_action):
    assert deliver(client, event()).status_code == 200
    action_after_first = Action.objects.values().get(pk=unknown_action.pk)
    events_after_first = AuditEvent.objects.count()

    again = deliver(client, event())

    assert again.status_code == 200
    assert again.json() == {"duplicate": True}
    assert WebhookEvent.objects.count() == 1
    assert Action.objects.values().get(pk=unknown_action.pk) == action_after_first
    assert AuditEvent.objects.count() == events_after_first


def test_a_duplicate_with_another_body_is_still_a_duplicate(client, unknown_action):
    assert deliver(client, event(event_type="message.sent", key="other")).status_code == 200
    again = deliver(client, event())
    assert again.json() == {"duplicate": True}
    assert Action.objects.get(pk=unknown_action.pk).status == S.UNKNOWN


def test_an_event_for_a_settled_action_changes_nothing(client, unknown_action):
    Action.objects.filter(pk=unknown_action.pk).update(status=S.SUCCEEDED, external_ref="re_first")
    response = deliver(client, event(refund_id="re_second"))
    assert response.json()["outcome"] == f"nothing to settle: {KEY} is succeeded"
    assert Action.objects.get(pk=unknown_action.pk).external_ref == "re_first"
    assert deliver(client, event(event_id="evt_other_key", key="refund:ORD-NONE")).json()["outcome"] == (
        "nothing to settle")


def test_a_refund_failed_event_does_not_settle_an_unknown_action_it_is_left_to_verification(client, unknown_action):
    """The event names the key, not the attempt: a late failure of an earlier attempt must not
    override what the provider holds now, nor start another call."""
    response = deliver(client, event(event_type="refund.failed"))
    assert response.status_code == 200
    assert "verified at the provider" in response.json()["outcome"]
    assert Action.objects.get(pk=unknown_action.pk).status == S.UNKNOWN


def test_a_refund_failed_event_sends_an_action_in_review_back_to_verification(client, unknown_action):
    Action.objects.get(pk=unknown_action.pk).mark_needs_review(actor="system:tests", evidence={"found": None})
    deliver(client, event(event_type="refund.failed"))
    assert Action.objects.get(pk=unknown_action.pk).status == S.UNKNOWN


@pytest.mark.parametrize(
    ("case", "payload"),
    [
        ("not JSON", b"{nope"),
        ("a JSON list", b"[1, 2]"),
        ("no id", json.dumps({"type": "refund.succeeded", "data": {}}).encode()),
        ("an effect id longer than its column", json.dumps(event(refund_id="re_" + "x" * 300)).encode()),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_signed_body_that_is_not_an_event_is_refused(client, unknown_action, case, payload):
    response = deliver(client, payload)
    assert response.status_code == 400, case
    assert not WebhookEvent.objects.exists()
    assert Action.objects.get(pk=unknown_action.pk).status == S.UNKNOWN


@pytest.mark.parametrize(
    "data",
    [{"metadata": "refund:ORD-W1"}, {"metadata": ["x"]}, {"metadata": {"operation_key": ["x"]}}, "just text", None],
    ids=["metadata a string", "metadata a list", "operation key a list", "data a string", "data null"],
)
def test_an_event_with_odd_data_is_stored_and_ignored_not_a_crash(client, unknown_action, data):
    response = deliver(client, {"id": "evt_odd", "type": "refund.succeeded", "data": data})
    assert response.status_code == 200, response.content
    assert WebhookEvent.objects.get().event_id == "evt_odd"
    assert Action.objects.get(pk=unknown_action.pk).status == S.UNKNOWN


def test_an_unknown_connector_is_404(client, db):
    body = json.dumps(event()).encode()
    response = client.generic("POST", "/webhooks/stripe-ish/", body, content_type="application/json",
                              headers={"Sandbox-Signature": sign_webhook(body, SECRET)})
    assert (response.status_code, response["Content-Type"]) == (404, "application/problem+json")
    assert response.json()["code"] == "not_found"
    assert not WebhookEvent.objects.exists()


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_another_method_than_post_is_refused_with_a_problem(client, db, method):
    response = client.generic(method, URL)
    assert (response.status_code, response["Content-Type"]) == (405, "application/problem+json")
    assert (response.json()["code"], response["Allow"]) == ("method_not_allowed", "POST")


def test_an_unknown_connector_is_404_whatever_the_method(client, db):
    response = client.get("/webhooks/stripe-ish/")
    assert (response.status_code, response["Content-Type"]) == (404, "application/problem+json")
    assert response.json()["code"] == "not_found"


def test_a_webhook_that_settles_an_action_under_verification_leaves_the_verifier_nothing_to_do(
    client, unknown_action, live_server, settings
):
    """The verifier asks the real sandbox (live_server), which holds the refund; the webhook
    settles the action between the claim and the verifier's answer, so the answer must be dropped."""
    from ledger import executor
    from sandbox.models import SandboxRefund

    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox/v1"
    SandboxRefund.objects.create(refund_id="re_w1", operation_key=KEY, order_id="ORD-W1", amount="25.00",
                                 currency="EUR", metadata={"operation_key": KEY})
    Action.objects.filter(pk=unknown_action.pk).update(next_attempt_at=unknown_action.created_at)
    verifying = executor.action_claim_next("host:verifier")
    assert verifying.pk == unknown_action.pk

    assert deliver(client, event()).status_code == 200  # settles it while the worker is asking
    executor.action_verify(verifying)  # the worker's answer arrives late: dropped, not a crash

    action = Action.objects.get(pk=unknown_action.pk)
    assert (action.status, action.external_ref) == (S.SUCCEEDED, "re_w1")
    assert audit_events(action, "succeeded").count() == 1
    # Settled by the webhook, not by the verifier: the late answer left no trace on the action.
    assert audit_events(action, "succeeded").get().actor == "system:webhook:sandbox"
    assert not any("verification" in entry for entry in action.evidence)


def test_a_refund_succeeded_event_for_an_action_over_its_limit_goes_to_a_person(client, unknown_action):
    from approvals.models import Limit

    Limit.objects.create(action_type="refund", currency="EUR", max_amount="10.00")

    response = deliver(client, event())

    assert response.status_code == 200
    assert response.json()["outcome"].startswith("left to a person")
    action = Action.objects.get(pk=unknown_action.pk)
    assert (action.status, action.external_ref) == (S.NEEDS_REVIEW, "")
    assert action.evidence[-1]["webhook"] == "refund.succeeded"
    review = audit_events(action, "needs_review").get()
    assert "above the limit" in review.reason


def test_an_event_for_a_key_of_the_longest_allowed_length_is_stored(client, unknown_action):
    long_key = "k" * 255
    Action.objects.filter(pk=unknown_action.pk).update(operation_key=long_key)
    response = deliver(client, event(key=long_key))
    assert response.status_code == 200, response.content
    assert Action.objects.get(pk=unknown_action.pk).status == S.SUCCEEDED


@pytest.mark.parametrize(("field", "value"), [("id", "e" * 256), ("id", ""), ("type", "t" * 101)])
def test_a_signed_event_whose_id_or_type_does_not_fit_is_refused(client, db, field, value):
    response = deliver(client, {**event(), field: value})
    assert response.status_code == 400
    assert not WebhookEvent.objects.exists()


@pytest.mark.parametrize("event_id", [None, 1.5, 1e3, True, ["evt_1"], {"id": "evt_1"}],
                         ids=["null", "a fraction", "a whole number written as a float", "a boolean", "a list", "an object"])
def test_a_signed_event_whose_id_is_not_text_or_a_whole_number_is_refused_and_nothing_stored(
        client, unknown_action, event_id):
    """Stored as Python spells it, `null` would be the event "None": every later event without an
    id would be its duplicate, and never settle anything."""
    response = deliver(client, event(event_id=event_id))
    assert (response.status_code, response["Content-Type"]) == (400, "application/problem+json")
    assert {k: response.json()[k] for k in ("status", "code", "detail")} == {
        "status": 400, "code": "invalid", "detail": "the body is not an event"}
    assert not WebhookClaim.objects.exists() and not WebhookEvent.objects.exists()
    assert Action.objects.get(pk=unknown_action.pk).status == S.UNKNOWN


def test_a_signed_event_whose_id_is_a_whole_number_is_stored_under_its_digits(client, unknown_action):
    response = deliver(client, event(event_id=8841))
    assert response.status_code == 200, response.content
    assert WebhookEvent.objects.get().event_id == "8841"
    assert deliver(client, event(event_id="8841")).json() == {"duplicate": True}


def test_an_event_is_stored_with_the_key_it_names_and_the_evidence_finds_it_by_that_column(client, unknown_action):
    long_key = "k" * 300
    assert deliver(client, event()).status_code == 200
    assert deliver(client, event(event_id="evt_2", key=long_key)).status_code == 200
    assert deliver(client, event(event_id="evt_3", key=None)).status_code == 200
    keys = dict(WebhookEvent.objects.values_list("event_id", "operation_key"))
    assert keys == {"evt_1": KEY, "evt_2": long_key[:255], "evt_3": ""}
    # The evidence reads the column: a row whose column names the key is found, whatever its payload says.
    WebhookEvent.objects.filter(event_id="evt_3").update(operation_key=KEY)
    WebhookEvent.objects.filter(event_id="evt_1").update(operation_key="")
    assert [e["event_id"] for e in evidence_webhooks(unknown_action)] == ["evt_3"]


def test_the_migration_gives_events_stored_before_it_the_key_their_payload_names(db):
    backfill = import_module("ledger.migrations.0022_webhook_event_operation_key").backfill
    WebhookEvent.objects.create(connector="sandbox", event_id="evt_old", event_type="refund.succeeded",
                                payload=event(event_id="evt_old"))
    WebhookEvent.objects.create(connector="sandbox", event_id="evt_other", event_type="refund.succeeded",
                                payload={"id": "evt_other", "type": "refund.succeeded", "data": {"metadata": {}}})
    backfill(django_apps, None)
    assert dict(WebhookEvent.objects.values_list("event_id", "operation_key")) == {"evt_old": KEY, "evt_other": ""}


def test_an_event_settles_only_an_action_its_connector_serves(client, agent, settings):
    """The sandbox's secret has a development default: an event it signs must not settle a
    refund that Stripe serves (a forged success would close an outcome nobody proved)."""
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.stripe.StripeConnector",
        "options": {"api_key": "sk_test_x", "api_base": "http://127.0.0.1:9", "webhook_secret": "whsec_live"}}}
    action = make_action(agent, S.UNKNOWN, key=KEY)
    answer = deliver(client, event(refund_id="re_forged"))
    assert answer.status_code == 200 and answer.json()["outcome"].startswith("not applied")
    action.refresh_from_db()
    assert (action.status, action.external_ref) == (S.UNKNOWN, "")
    assert WebhookEvent.objects.get(event_id="evt_1").outcome == answer.json()["outcome"]


def test_an_error_while_settling_is_no_duplicate_so_the_redelivery_settles(client, unknown_action, monkeypatch):
    """Only the claim's own conflict makes a delivery a duplicate: an integrity error while the
    event settles (staged here: none of the reactions raises one today) rolls the claim back and
    fails the delivery, and the provider's redelivery is applied."""
    def settle_fails(*args, **kwargs):
        raise IntegrityError("staged: a reaction's insert conflicted")

    monkeypatch.setattr(webhooks, "_settle", settle_fails)
    client.raise_request_exception = False
    first = deliver(client, event())
    assert first.status_code == 500 and b"duplicate" not in first.content
    assert not WebhookEvent.objects.exists()
    monkeypatch.undo()
    again = deliver(client, event())
    assert again.json() == {"received": True, "outcome": again.json()["outcome"]}
    assert Action.objects.get(pk=unknown_action.pk).status == S.SUCCEEDED


def test_an_event_about_another_kind_of_effect_settles_nothing(client, unknown_action):
    """A signed `message.sent` that names a refund's key says nothing of the refund."""
    response = deliver(client, {**event(event_type="message.sent"), "id": "evt_other_kind"})
    assert response.status_code == 200 and response.json()["outcome"].startswith("not applied")
    assert Action.objects.get(pk=unknown_action.pk).status == S.UNKNOWN
