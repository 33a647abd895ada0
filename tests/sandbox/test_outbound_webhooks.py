"""The sandbox's outbound webhooks and the receiver that settles from them, over real HTTP:
gunicorn serves the sandbox and /webhooks/sandbox/, RQ workers deliver the events.

An action the sandbox committed but did not answer for in time (a `timeout_after_commit`
fault) is `unknown`. Its verification by look-up is held off in these tests (its next look
moved an hour on) so that what settles it is the webhook, not the executor.
"""

import json
import logging
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from django.conf import settings
from django.utils import timezone

from console.sweeper import sweep_once
from dlq.incidents import Incident, IncidentKind
from dlq.models import Alert
from ledger.models import Action, ActionStatus, AuditEvent, WebhookEvent
from ledger.webhooks import sign_webhook, signature_valid
from sandbox.models import SandboxWebhook
from sandbox.webhooks import MAX_FAILURES, send_webhook, webhook_deliver
from tests.conftest import wait_until
from tests.factories import api_client, host_clock_off_by, make_agent, post_action, refund_body, sandbox, sandbox_list

S = ActionStatus
RECIPIENT = "ana@customers.surety.example"
# GET /sandbox/v1/settings with nothing set there: the server's SANDBOX_WEBHOOK_* defaults.
DELIVERY_OFF = {"idempotency": True, "webhook_url": "", "webhook_duplicate_rate": 0, "webhook_delay_seconds": 0}


def message_body(recipient=RECIPIENT):
    return {"action_type": "send_message", "target": recipient, "decision_id": "dec-9",
            "params": {"channel": "email", "message_type": "refund_confirmation", "body": "Your refund is on its way."}}


@pytest.fixture
def api(stack):
    """An agent's HTTP client of the server (the sandbox takes any agent's token)."""
    _, token = make_agent("billing")
    with api_client(stack.url, token) as client:
        yield client


def webhooks_on(api, url, **knobs):
    response = sandbox(api, "PUT", "settings", json={"webhook_url": url, **knobs})
    assert response.status_code == 200, response.text


def settle_by_webhook(stack, api, key, body, target, **knobs):
    """Post an action whose call commits at the sandbox and then times out, with the sandbox's
    webhooks on (`knobs`); return the action once it is unknown and its look-up held off."""
    webhooks_on(api, f"{stack.url}/webhooks/sandbox/", **knobs)
    sandbox(api, "POST", "faults", json={"target": target, "fault": "timeout_after_commit", "times": 1})
    stack.start_worker()
    assert post_action(api, key, body).status_code == 201
    wait_until(lambda: Action.objects.filter(operation_key=key).exclude(status__in=[S.QUEUED, S.PENDING]).exists(),
               message=f"{key} to leave pending")
    held_off = Action.objects.filter(operation_key=key, status=S.UNKNOWN).update(
        next_attempt_at=timezone.now() + timedelta(hours=1))
    assert held_off == 1, Action.objects.get(operation_key=key).status
    return Action.objects.get(operation_key=key)


def settled_by_webhook(action):
    """The action once succeeded, its one `succeeded` audit event, and its webhook evidence."""
    done = wait_until(lambda: Action.objects.filter(pk=action.pk, status=S.SUCCEEDED).first(),
                      message=f"{action} to be settled")
    [audit] = AuditEvent.objects.filter(object_type="ledger.action", object_id=str(action.pk), verb="succeeded")
    return done, audit, [entry for entry in done.evidence if "webhook" in entry]


@pytest.mark.parametrize(
    ("kind", "key", "body", "target", "event_type"),
    [
        ("refunds", "refund:ORD-WH1:full:dec-1", refund_body("ORD-WH1"), "ORD-WH1", "refund.succeeded"),
        ("messages", "msg:ana:refund_confirmation:dec-9", message_body(), RECIPIENT, "message.delivered"),
    ],
    ids=["refund", "message"],
)
def test_an_unknown_action_is_settled_by_the_sandbox_webhook(stack, api, kind, key, body, target, event_type):
    action = settle_by_webhook(stack, api, key, body, target, webhook_delay_seconds=3)

    done, audit, evidence = settled_by_webhook(action)

    [effect] = sandbox_list(api, kind, operation_key=key)
    event = SandboxWebhook.objects.get(event_type=event_type)
    assert done.external_ref == effect["id"]
    assert audit.actor == "system:webhook:sandbox" and audit.reason == f"{event_type} received"
    assert [(e["event_id"], e["data"]["id"]) for e in evidence] == [(event.event_id, effect["id"])]
    assert WebhookEvent.objects.get(event_id=event.event_id).outcome == f"settled {key} as succeeded"
    assert (event.copies, event.sent, event.attempts) == (1, 1, 1)


def test_a_webhook_delivered_twice_and_late_settles_an_unknown_refund_once(stack, api):
    key = "refund:ORD-WH2:full:dec-2"
    action = settle_by_webhook(stack, api, key, refund_body("ORD-WH2"), "ORD-WH2",
                               webhook_delay_seconds=3, webhook_duplicate_rate=1)

    done, audit, evidence = settled_by_webhook(action)
    event = wait_until(lambda: SandboxWebhook.objects.filter(sent=2).first(), message="the second copy to be sent")

    # Late: it reached the receiver only after the action had become unknown.
    unknown_at = AuditEvent.objects.get(object_id=str(action.pk), verb="outcome_unknown").occurred_at
    stored = WebhookEvent.objects.get(event_id=event.event_id)
    assert stored.received_at > unknown_at
    assert stored.received_at >= event.created_at + timedelta(seconds=3)
    # Twice: both copies were accepted, the second as a duplicate that did nothing.
    assert (event.copies, event.sent, event.attempts, event.next_attempt_at) == (2, 2, 2, None)
    assert WebhookEvent.objects.count() == 1
    assert audit.actor == "system:webhook:sandbox"
    assert [e["event_id"] for e in evidence] == [event.event_id]
    assert Action.objects.get(pk=action.pk).updated_at == done.updated_at
    assert len(sandbox_list(api, "refunds", operation_key=key)) == 1


def test_a_failed_event_after_a_success_is_recorded_and_not_applied(stack, api):
    key = "refund:ORD-WH3:full:dec-3"
    stack.start_worker()
    assert post_action(api, key, refund_body("ORD-WH3")).status_code == 201
    done = wait_until(lambda: Action.objects.filter(operation_key=key, status=S.SUCCEEDED).first(),
                      message=f"{key} to succeed")
    audit_before = AuditEvent.objects.filter(object_id=str(done.pk)).count()

    # What the sandbox would send for an earlier attempt it declined, arriving last.
    late = send_webhook("refund.failed", {"id": "re_declined", "object": "refund", "status": "failed",
                                          "metadata": {"operation_key": key}}, f"{stack.url}/webhooks/sandbox/")

    assert late.status_code == 200, late.text
    assert late.json()["outcome"] == f"late refund.failed after success: recorded, not applied ({key})"
    stored = WebhookEvent.objects.get(event_type="refund.failed")
    assert stored.payload["data"]["metadata"]["operation_key"] == key
    after = Action.objects.get(pk=done.pk)
    assert (after.status, after.external_ref, after.error, after.updated_at) == (
        S.SUCCEEDED, done.external_ref, None, done.updated_at)
    assert AuditEvent.objects.filter(object_id=str(done.pk)).count() == audit_before


def test_a_failed_event_for_the_very_effect_that_succeeded_opens_an_incident(stack, api):
    """The provider failed the refund the ledger recorded as made (Stripe fails one days later when
    the card was closed): it was logged and dropped as a late event of an earlier attempt, and the
    ledger said the customer was refunded while no money moved. The success stays the record of
    the call; a person is told, by an incident and its alert, once however often it is sent."""
    key = "refund:ORD-WH4:full:dec-4"
    stack.start_worker()
    assert post_action(api, key, refund_body("ORD-WH4")).status_code == 201
    done = wait_until(lambda: Action.objects.filter(operation_key=key, status=S.SUCCEEDED).first(),
                      message=f"{key} to succeed")

    for event_id in ("evt_f1", "evt_f2"):  # sent again under another id: still one incident
        failed = send_webhook("refund.failed", {"id": done.external_ref, "object": "refund", "status": "failed",
                                                "metadata": {"operation_key": key}},
                              f"{stack.url}/webhooks/sandbox/", event_id=event_id)
        assert failed.status_code == 200, failed.text
        assert failed.json()["outcome"] == f"refund.failed of {done.external_ref}, which {key} succeeded with: a " \
                                           "person is told"
    [incident] = Incident.objects.all()
    assert (incident.kind, incident.operation_key, incident.external_refs, incident.status) == (
        IncidentKind.FAILED_EFFECT, key, [done.external_ref], "open")
    assert Alert.objects.filter(incident=incident).count() == 1
    assert Action.objects.get(pk=done.pk).status == S.SUCCEEDED


def signed(payload, *, age=0, secret=None):
    body = json.dumps(payload).encode()
    return body, sign_webhook(body, secret or settings.SANDBOX_WEBHOOK_SECRET, time.time() - age)


def refund_event(key, event_type="refund.succeeded"):
    return {"id": "evt_refused", "type": event_type,
            "data": {"id": "re_x", "object": "refund", "metadata": {"operation_key": key}}}


REFUSALS = {
    "bad signature": lambda key: signed(refund_event(key), secret="whsec-someone-else"),
    "replayed timestamp": lambda key: signed(refund_event(key), age=settings.WEBHOOK_TOLERANCE_SECONDS + 60),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_bad_webhook_is_refused_and_settles_nothing(stack, case):
    agent, _ = make_agent("billing")
    key = f"refund:ORD-WH4:full:{case}"
    action = Action.objects.create(
        operation_key=key, fingerprint="f" * 64, action_type="refund", target="ORD-WH4",
        params={"amount": "25.00", "currency": "EUR"}, amount="25.00", currency="EUR", agent=agent,
        status=S.UNKNOWN, attempts=1, fence=2, next_attempt_at=timezone.now() + timedelta(hours=1),
    )
    body, signature = REFUSALS[case](key)

    response = httpx.post(f"{stack.url}/webhooks/sandbox/", content=body,
                          headers={"Content-Type": "application/json", "Sandbox-Signature": signature})

    assert response.status_code == 400, response.text
    assert not WebhookEvent.objects.exists()
    assert Action.objects.get(pk=action.pk).status == S.UNKNOWN
    assert not AuditEvent.objects.filter(object_type="ledger.action", object_id=str(action.pk)).exists()


@pytest.mark.parametrize("case", list(REFUSALS))
def test_each_refusal_is_logged(client_in_process, caplog, case):
    body, signature = REFUSALS[case]("refund:ORD-WH5:full:dec-5")
    with caplog.at_level(logging.WARNING, logger="surety.webhooks"):
        response = client_in_process.generic("POST", "/webhooks/sandbox/", body, content_type="application/json",
                                             headers={"Sandbox-Signature": signature})
    assert response.status_code == 400
    assert any(record.getMessage().startswith("webhook refused (400)") for record in caplog.records)


@pytest.fixture
def client_in_process(client, db, settings):
    """Django's test client, in this process: its log records can be captured."""
    settings.ROOT_URLCONF = "config.urls"
    settings.SANDBOX_ENABLED = True
    return client


# --- Delivery -------------------------------------------------------------------------------


class Receiver:
    """A real HTTP server on 127.0.0.1 that records each POST and fails the first `failing`."""

    def __init__(self, failing=0):
        self.received = []
        self.failing = failing
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.received.append((dict(self.headers), body))
                status = 500 if len(receiver.received) <= receiver.failing else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def events(self):
        return [json.loads(body) for _, body in self.received]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.close()


def test_each_write_announces_its_event_and_a_decline_its_failure(stack, api, receiver):
    webhooks_on(api, receiver.url)
    stack.start_worker()
    sandbox(api, "POST", "faults", json={"target": "ORD-WH6", "fault": "decline", "times": 1})
    refund = {"amount": "5.00", "currency": "EUR", "metadata": {"operation_key": "k-refund"}}
    assert sandbox(api, "POST", "refunds", json={"order_id": "ORD-WH6", **refund}).status_code == 402
    assert sandbox(api, "POST", "refunds", json={"order_id": "ORD-WH7", **refund},
                   headers={"Idempotency-Key": "k-1"}).status_code == 201
    assert sandbox(api, "POST", "refunds", json={"order_id": "ORD-WH7", **refund},
                   headers={"Idempotency-Key": "k-1"}).status_code == 200  # a replay: no new event
    assert sandbox(api, "POST", "messages", json={
        "recipient": RECIPIENT, "channel": "email", "message_type": "receipt", "body": "Hello",
        "metadata": {"operation_key": "k-message"}}).status_code == 201

    # One event per write that committed or declined: the replay made none.
    assert SandboxWebhook.objects.count() == 3
    wait_until(lambda: len(receiver.received) == 3, message="three events")
    by_type = {event["type"]: event for event in receiver.events()}
    assert set(by_type) == {"refund.failed", "refund.succeeded", "message.delivered"}
    assert by_type["refund.failed"]["data"]["order_id"] == "ORD-WH6"
    assert by_type["refund.failed"]["data"]["failure_code"] == "declined"
    assert by_type["refund.succeeded"]["data"]["order_id"] == "ORD-WH7"
    assert by_type["message.delivered"]["data"]["metadata"] == {"operation_key": "k-message"}
    for headers, body in receiver.received:
        assert signature_valid(headers["Sandbox-Signature"], body, settings.SANDBOX_WEBHOOK_SECRET)


def test_a_failed_delivery_is_retried_with_backoff_under_the_same_event_id(stack, api, receiver):
    receiver.failing = 2
    webhooks_on(api, receiver.url)
    stack.start_worker()
    assert sandbox(api, "POST", "refunds", json={"order_id": "ORD-WH8", "amount": "5.00", "currency": "EUR",
                                                    "metadata": {"operation_key": "k-retry"}}).status_code == 201

    event = wait_until(lambda: SandboxWebhook.objects.filter(sent=1).first(), message="the event to be delivered")

    assert len({event["id"] for event in receiver.events()}) == 1
    assert len(receiver.received) == 3
    assert (event.attempts, event.sent, event.next_attempt_at) == (3, 1, None)
    assert "500" in event.last_error


def test_an_event_whose_job_was_lost_is_sent_by_the_sweeper(stack, receiver):
    stack.start_worker()
    lost = SandboxWebhook.objects.create(
        event_type="refund.succeeded", data={"id": "re_lost", "metadata": {"operation_key": "k-lost"}},
        url=receiver.url, next_attempt_at=timezone.now() - timedelta(minutes=5),
    )
    recent = SandboxWebhook.objects.create(event_type="refund.succeeded", data={}, url=receiver.url,
                                           next_attempt_at=timezone.now() + timedelta(hours=1))

    assert sweep_once()["sandbox_webhooks_redelivered"] == 1
    assert sweep_once()["sandbox_webhooks_redelivered"] == 0  # not again before another grace period

    wait_until(lambda: SandboxWebhook.objects.filter(pk=lost.pk, sent=1).exists(), message="the lost event to go out")
    assert [event["id"] for event in receiver.events()] == [lost.event_id]
    assert SandboxWebhook.objects.get(pk=recent.pk).attempts == 0


def test_it_gives_up_on_an_event_after_its_last_allowed_failure_and_says_so(db, receiver, caplog):
    """Run here, not by a worker: what is checked is that no further attempt is scheduled."""
    receiver.failing = 100
    event = SandboxWebhook.objects.create(event_type="refund.succeeded", data={}, url=receiver.url,
                                          attempts=MAX_FAILURES - 1, next_attempt_at=timezone.now())
    with caplog.at_level(logging.ERROR, logger="surety.sandbox.webhooks"):
        assert webhook_deliver(event.pk) == 0

    event.refresh_from_db()
    assert (event.attempts, event.sent, event.next_attempt_at) == (MAX_FAILURES, 0, None)
    assert len(receiver.received) == 1
    assert any("gave up" in record.getMessage() for record in caplog.records)
    assert webhook_deliver(event.pk) is None  # nothing is due any more


# --- The knobs ------------------------------------------------------------------------------


@pytest.mark.parametrize("change", [
    {"webhook_url": "ftp://example.com/x"}, {"webhook_url": "not a url"}, {"webhook_url": 5},
    {"webhook_url": "http://example.com/" + "x" * 500}, {"webhook_duplicate_rate": 1.5},
    {"webhook_duplicate_rate": -0.1}, {"webhook_duplicate_rate": True}, {"webhook_duplicate_rate": "0.5"},
    {"webhook_delay_seconds": -1}, {"webhook_delay_seconds": 10**6},
    {"webhook_delay_seconds": 1, "webhook_duplicate_rate": 2},
])
def test_a_bad_webhook_setting_is_refused_and_changes_nothing(stack, api, change):
    response = sandbox(api, "PUT", "settings", json=change)
    assert response.status_code == 400, response.text
    named = set(response.json()["error"]["fields"])
    assert named and named <= set(change)
    assert sandbox(api, "GET", "settings").json() == DELIVERY_OFF


def test_the_webhook_settings_are_shown_as_set_and_restored_by_null_and_by_a_reset(stack, api):
    knobs = {"webhook_url": f"{stack.url}/webhooks/sandbox/", "webhook_duplicate_rate": 0.5,
             "webhook_delay_seconds": 2}
    assert sandbox(api, "PUT", "settings", json=knobs).json() == knobs
    assert sandbox(api, "GET", "settings").json() == {"idempotency": True, **knobs}
    assert sandbox(api, "PUT", "settings", json={"webhook_url": None}).status_code == 200
    assert sandbox(api, "GET", "settings").json() == {**DELIVERY_OFF, **knobs, "webhook_url": ""}
    sandbox(api, "POST", "reset", json={})
    assert sandbox(api, "GET", "settings").json() == DELIVERY_OFF


def test_a_failed_delivery_waits_its_backoff_on_a_host_whose_clock_runs_ahead(db, receiver, monkeypatch, settings):
    """The backoff is written on the database's clock (ledger.retry.backoff_until): read as due
    on the host's, a host a minute ahead sent the event again at once, and spent its every allowed
    failure in one go instead of over the backoff."""
    from ledger import clock

    settings.BACKOFF_BASE_SECONDS = 5
    host_clock_off_by(monkeypatch, 60)
    receiver.failing = 100
    event = SandboxWebhook.objects.create(event_type="refund.succeeded", data={}, url=receiver.url,
                                          next_attempt_at=clock.now())  # due now, as webhook_emit writes it
    try:
        assert webhook_deliver(event.pk) == 0
        assert webhook_deliver(event.pk) is None  # not due again before its backoff
    finally:
        clock.forget()
    assert len(receiver.received) == 1
