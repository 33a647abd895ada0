"""How the Stripe connector takes the failures Stripe documents, and answers no sandbox gives:
the executor runs here, in this process, and the SDK talks over real HTTP to a scripted
server standing in for Stripe (a real Stripe cannot be reached from the tests, and the
sandbox never answers garbage or 429). Each answer is what Stripe's API reference shows."""

import json
import os
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dlq.reconcile import findings_in
from ledger.actions import action_request
from ledger.connectors import connector_for
from ledger.connectors.events import WebhookRefused
from ledger.connectors.stripe import StripeConnector
from ledger.executor import action_claim_next, action_run_claimed
from ledger.models import Action
from ledger.signing import sign_webhook
from tests.conftest import PYTHON, ROOT, free_port, wait_until
from tests.factories import make_agent


def stripe_error(status, error_type, message, **fields):
    return ("answer", status, json.dumps({"error": {"type": error_type, "message": message, **fields}}))


class ScriptedStripe:
    """Answers the charge read and the refunds list as Stripe would (a charge in EUR, the
    refunds in `listed`), and each refund POST with the next entry of `script`: ("answer",
    status, body[, headers]) or ("hang", seconds) before answering a refund."""

    def __init__(self):
        self.script = []
        self.posts = []
        self.listed = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body, content_type="application/json", headers=()):
                raw = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(raw)))
                for name, value in dict(headers).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                if self.path.startswith("/v1/charges/"):
                    charge = self.path.rsplit("/", 1)[1]
                    return self._send(200, json.dumps({"id": charge, "object": "charge", "currency": "eur",
                                                       "amount": 10000}))
                return self._send(200, json.dumps({"object": "list", "url": "/v1/refunds", "has_more": False,
                                                   "data": scripted.listed}))

            def do_POST(self):
                scripted.posts.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
                what = scripted.script.pop(0)
                if what[0] == "hang":
                    time.sleep(what[1])
                    what = ("answer", 200, json.dumps({"id": "re_late", "object": "refund", "status": "succeeded"}))
                _, status, body, *headers = what
                self._send(status, body, "application/json" if body.startswith("{") else "text/html", *headers)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted(settings):
    stripe = ScriptedStripe()
    settings.CONNECTOR_TIMEOUT = 0.5
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.stripe.StripeConnector",
        "options": {"api_key": "sk_test_scripted", "api_base": stripe.url}}}
    yield stripe
    stripe.stop()


def run_once(key, order, amount="25.00", currency="EUR"):
    action = action_request(agent=make_agent(f"agent-{order}")[0], operation_key=key, action_type="refund",
                            target=order, params={"amount": amount, "currency": currency})[0]
    return run_next(action)


def run_next(action):
    """The action's next run (an attempt or a verification) once it is due."""
    claimed = wait_until(lambda: action_claim_next("tests", only=action.pk), seconds=10, message="a claim")
    action_run_claimed(claimed)
    return Action.objects.get(pk=action.pk)


pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.mark.parametrize(("status", "garbage", "kept"), [
    (502, "<html><body><h1>502 Bad Gateway</h1></body></html>", "502 Bad Gateway"),  # a proxy's page
    (200, '{"id": "re_cut", "object": "ref', "re_cut"),  # JSON cut short
])
def test_an_answer_that_is_not_stripes_json_leaves_the_outcome_unknown_with_the_body_as_evidence(
        scripted, status, garbage, kept):
    scripted.script.append(("answer", status, garbage))
    action = run_once("refund:ch_g:full", "ch_g")
    assert action.status == "unknown"
    assert action.evidence[-1]["error"] == "OutcomeUnknown"
    assert kept in action.evidence[-1]["message"]


def test_no_answer_within_the_timeout_is_an_unknown_outcome_not_a_failure(scripted):
    scripted.script.append(("hang", 2))
    action = run_once("refund:ch_t:full", "ch_t")
    assert (action.status, action.evidence[-1]["code"]) == ("unknown", "timeout")


@pytest.mark.parametrize(("answer", "status", "code"), [
    # Stripe's 409: another request with this key is still running; nothing ran for this one.
    (stripe_error(409, "idempotency_error", "There is currently another in-progress request using this "
                  "Stripe-Idempotency-Key."), "unknown", "idempotency_conflict"),
    # The key was first used with other parameters: that first request's effect is what counts.
    (stripe_error(400, "idempotency_error", "Keys for idempotent requests can only be used with the same "
                  "parameters they were first used with."), "unknown", "idempotency_conflict"),
    (stripe_error(500, "api_error", "Something went wrong on Stripe's end."), "unknown", "http_500"),
    (stripe_error(429, "invalid_request_error", "Too many requests hit the API too quickly.", code="rate_limit"),
     "queued", "rate_limited"),
    (stripe_error(401, "invalid_request_error", "Invalid API Key provided: sk_test_****ted"), "queued",
     "not_authorized"),
    (stripe_error(402, "card_error", "Your card was declined.", code="card_declined", decline_code="generic_decline"),
     "failed", "card_declined"),
    (stripe_error(400, "invalid_request_error", "Charge ch_m has already been refunded.",
                  code="charge_already_refunded"), "failed", "charge_already_refunded"),
])
def test_stripes_errors_map_onto_not_sent_unknown_and_rejected(scripted, answer, status, code):
    scripted.script.append(answer)
    action = run_once("refund:ch_m:full", "ch_m")
    assert action.status == status
    if status == "failed":
        assert (action.error["code"], action.error["retryable"]) == (code, False)
    else:
        assert action.evidence[-1]["code"] == code


def test_a_refund_that_failed_since_is_not_read_as_made_from_stripes_saved_answer_to_its_key(scripted, settings):
    """The refund's answer was lost (a timeout) and the refund failed since: verification finds
    no refund made, and the action is tried again under its key. Stripe answers a key it has
    seen with its saved first answer, the refund as it was made (`pending`): the refund as it is
    now (`failed`) decides, as it would have on the first answer, and nothing is made again."""
    settings.BACKOFF_BASE_SECONDS, settings.CONNECTOR_TIMEOUT = 0.01, 2
    key = "refund:ch_r:full"
    scripted.script.append(("hang", 3))
    action = run_once(key, "ch_r")
    assert (action.status, action.evidence[-1]["code"]) == ("unknown", "timeout")
    made = {"id": "re_late", "object": "refund", "amount": 2500, "currency": "eur", "charge": "ch_r",
            "status": "pending", "failure_reason": None, "metadata": {"operation_key": key}}
    scripted.listed.append({**made, "status": "failed", "failure_reason": "expired_or_canceled_card"})
    action = run_next(action)  # the verification: the one refund under the key failed
    assert (action.status, action.evidence[-1]["found"]) == ("queued", False)

    scripted.script.append(("answer", 200, json.dumps(made), {"Idempotent-Replayed": "true"}))
    action = run_next(action)
    assert (action.status, action.external_ref) == ("failed", "")
    assert (action.error["code"], action.error["retryable"]) == ("refund_failed", False)
    assert "expired_or_canceled_card" in action.error["message"]


def test_a_provider_that_cannot_be_reached_is_not_sent_and_tried_again_later(settings):
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.stripe.StripeConnector",
        "options": {"api_key": "sk_test_x", "api_base": f"http://127.0.0.1:{free_port()}"}}}
    action = run_once("refund:ch_d:full", "ch_d")
    assert (action.status, action.evidence[-1]["code"]) == ("queued", "connect_failed")


def test_the_refund_is_sent_form_encoded_with_the_minor_units_and_the_key_in_metadata(scripted):
    scripted.script.append(("answer", 200, json.dumps({"id": "re_1", "object": "refund", "status": "succeeded",
                                                         "amount": 2500, "currency": "eur"})))
    action = run_once("refund:ch_f:full", "ch_f")
    assert (action.status, action.external_ref) == ("succeeded", "re_1")
    assert sorted(scripted.posts[0].split("&")) == ["amount=2500", "charge=ch_f",
                                                    "metadata[operation_key]=refund%3Ach_f%3Afull"]


def test_an_amount_finer_than_its_currencys_minor_unit_is_refused_before_anything_is_sent(scripted):
    # The API refuses 500.5 JPY; this one comes in past it, as a workflow's input could.
    action = run_once("refund:ch_y:full", "ch_y", amount="500.5", currency="JPY")
    assert (action.status, action.error["code"]) == ("failed", "amount_not_in_minor_units")
    assert scripted.posts == []


# --- Configuration ---------------------------------------------------------------------------


def test_a_missing_or_wrong_key_is_named_by_the_check():
    assert StripeConnector(api_key="sk_test_1").check() == []
    assert StripeConnector(api_key="").check() == ["no API key (set STRIPE_API_KEY)"]
    assert "not a Stripe secret" in StripeConnector(api_key="pk_test_1", api_base="http://x").check()[0]
    assert "not an http(s) address" in StripeConnector(api_key="sk_test_1", api_base="api.stripe.com").check()[0]


def test_the_start_stops_with_a_clear_message_when_the_stripe_key_is_missing():
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("CONNECTOR_", "STRIPE_"))},
           "CONNECTOR_REFUND": "stripe", "DATABASE_URL": "sqlite:///:memory:"}
    checked = subprocess.run([PYTHON, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode != 0
    assert "surety.E003" in checked.stderr and "STRIPE_API_KEY" in checked.stderr


def test_a_webhook_without_a_configured_secret_is_refused():
    with pytest.raises(WebhookRefused, match="STRIPE_WEBHOOK_SECRET"):
        StripeConnector(api_key="sk_test_1").read_webhook(b"{}", {"Stripe-Signature": "t=1,v1=00"})


def test_a_signature_of_characters_past_ascii_is_refused_as_a_signature():
    """The SDK's comparison raises TypeError on one, which was read as "not an event" (400 invalid)
    rather than as the bad signature it is (400 webhook_refused)."""
    raw = json.dumps({"id": "evt_1", "object": "event", "type": "refund.updated", "data": {"object": {}}}).encode()
    with pytest.raises(WebhookRefused, match="Stripe-Signature"):
        StripeConnector(api_key="sk_test_1", webhook_secret="whsec_unit").read_webhook(
            raw, {"Stripe-Signature": f"t={int(time.time())},v1=\u00e9\u00e9"})


def signed(event, secret="whsec_unit"):
    raw = json.dumps(event).encode()
    return raw, {"Stripe-Signature": sign_webhook(raw, secret)}


def test_a_signed_body_nested_too_deeply_is_no_event():
    """The SDK parses a signed body with json.loads, which raises RecursionError past Python's
    nesting limit: the view answered 500 (only a holder of the signing secret can send one)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    raw = b'{"id": "evt_deep", "object": "event", "type": "refund.updated", "data": ' + deep + b"}"
    with pytest.raises(ValueError, match="not an event") as refused:
        StripeConnector(api_key="sk_test_1", webhook_secret="whsec_unit").read_webhook(
            raw, {"Stripe-Signature": sign_webhook(raw, "whsec_unit")})
    assert not isinstance(refused.value, WebhookRefused)


def test_refund_events_are_read_by_the_refunds_status_and_any_other_event_settles_nothing():
    connector = StripeConnector(api_key="sk_test_1", webhook_secret="whsec_unit")
    refund = {"id": "re_1", "object": "refund", "metadata": {"operation_key": "k"}}
    read = [connector.read_webhook(*signed({"id": f"evt_{status}", "object": "event", "type": "refund.updated",
                                            "data": {"object": {**refund, "status": status}}}))["type"]
            for status in ("succeeded", "pending", "failed", "canceled")]
    assert read == ["refund.succeeded", "refund.pending", "refund.failed", "refund.failed"]
    charge = connector.read_webhook(*signed({"id": "evt_c", "object": "event", "type": "charge.refunded",
                                             "data": {"object": {"id": "ch_1", "object": "charge"}}}))
    assert (charge["type"], charge["data"]) == ("charge.refunded", {})
    # Any other verified event settles nothing either, and is not refused: Stripe would send a
    # refused one again for days, then turn the endpoint off.
    for kind, obj in (("refund.updated", "customer"), ("customer.created", "customer"), ("payout.paid", "payout")):
        other = connector.read_webhook(*signed({"id": f"evt_{kind}", "object": "event", "type": kind,
                                                "data": {"object": {"id": "x_1", "object": obj}}}))
        assert (other["type"], other["data"]) == (kind, {})
    with pytest.raises(ValueError) as signed_but_no_event:  # the view's "not an event", not a refusal
        connector.read_webhook(*signed(["not", "an", "event"]))
    assert not isinstance(signed_but_no_event.value, WebhookRefused)


def test_reconciliation_takes_a_refund_that_failed_at_stripe_for_no_effect(scripted):
    """A refund Stripe lists as failed or canceled moved no money: under the key of an action the
    ledger has as failed it is no finding; one that succeeded under a cancelled action's key is."""
    agent = make_agent("reconciled")[0]
    failed, cancelled = (action_request(agent=agent, operation_key=f"refund:ch_{n}:full", action_type="refund",
                                        target=f"ch_{n}", params={"amount": "25.00", "currency": "EUR"})[0]
                         for n in ("f", "c"))
    claimed = action_claim_next("tests", only=failed.pk)
    claimed.mark_failed(actor="system:tests", claim=claimed.fence, code="refund_failed", message="card", retryable=False)
    cancelled.cancel(actor="system:tests", reason="not wanted")
    now = datetime.now(UTC)
    for ref, action, status in (("re_f", failed, "failed"), ("re_x", failed, "canceled"), ("re_c", cancelled,
                                                                                            "succeeded")):
        scripted.listed.append({"id": ref, "object": "refund", "amount": 2500, "currency": "eur",
                                "status": status, "created": int(now.timestamp()),
                                "metadata": {"operation_key": action.operation_key}})
    connector = connector_for("refund")

    read, findings = findings_in(connector, connector.records(now - timedelta(minutes=5), now + timedelta(minutes=1)))

    assert read == 3
    assert [(f.kind, f.operation_key, f.external_refs) for f in findings] == [
        ("denied_effect", cancelled.operation_key, ["re_c"])]
