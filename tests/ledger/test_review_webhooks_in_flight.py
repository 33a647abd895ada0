"""A provider's event that arrives while the ledger's own call about the action is still out: the
worker's call (the action `pending`) or a verifier's look (`unknown`, claimed). The event cannot
settle a pending action (the worker's answer does), and a failure only sends an open outcome to be
verified: the worker's or the verifier's success lands after it. When the failure names the very
effect that success names, the provider failed it after making it, and a person must be told
(decision 60), as when a success event or a person settles the action after such a failure: also
when the failure commits while the success waits for the action's lock, or the failure's delivery
waits for it while the success commits.

The provider is the sandbox, served by the live server in this process, called over HTTP by the
real connector; it fails the refund it makes when its `failed_after_commit` fault is armed. Its
events are sent by its own delivery job (`webhook_deliver`, what an RQ worker runs) over HTTP to
/webhooks/sandbox/, each when the test has it come: while the call is out, a proxy of the test's
own in front of the sandbox holds the sandbox's answer (as a provider's event often outruns its
answer)."""

import threading
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from django.db import connection

from dlq.incidents import Incident, IncidentKind
from ledger import clock, executor, webhooks
from ledger.actions import action_request
from ledger.evidence import _webhooks as evidence_webhooks
from ledger.models import Action, ActionStatus, WebhookEvent
from sandbox.models import SandboxRefund, SandboxWebhook
from sandbox.webhooks import webhook_deliver
from tests.conftest import thread_server, wait_until
from tests.factories import (api_client, audit_events, in_threads, make_action, make_agent, sandbox,
                             sessions_waiting_for_a_lock)
from tests.ledger.test_review_webhooks_concurrent import held_once_succeeded

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]
S = ActionStatus
KEY = "refund:ORD-W1:full:dec-1"
REFUND = {"order_id": "ORD-W1", "amount": "25.00", "currency": "EUR", "metadata": {"operation_key": KEY}}
# What the worker's call sends the sandbox, and what a proxy passes on.
PASSED_ON = ("Authorization", "Content-Type", "Idempotency-Key")


@pytest.fixture
def agent(transactional_db):
    return make_agent("billing")[0]


@pytest.fixture
def provider(live_server, settings):
    """An HTTP client of the sandbox's API on the live server, which the connector calls and whose
    webhooks go to the live server's receiver. Their jobs go to this run's Redis, where no worker
    listens (jobs_to_test_redis): `sent` sends one when the test has it come."""
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox/v1"
    settings.SANDBOX_WEBHOOK_URL = f"{live_server.url}/webhooks/sandbox/"
    # A held call takes a whole webhook delivery (and, racing, a wait for another thread) inside its
    # deadline, and the sandbox's POST of an event a settle held: the tests' 2 s are not for a loaded
    # machine. The claim's lease bounds the call's deadline: longer still.
    settings.CONNECTOR_TIMEOUT, settings.LEASE_SECONDS = 20, 30
    with api_client(live_server.url, settings.SANDBOX_API_KEY) as client:
        yield client


def failing_the_refund(provider):
    """The sandbox fails the next refund of ORD-W1 once it has made it (and answered so)."""
    armed = sandbox(provider, "POST", "faults", json={"target": "ORD-W1", "fault": "failed_after_commit"})
    assert armed.status_code == 201, armed.text


def made():
    """The id of the refund the sandbox made."""
    return SandboxRefund.objects.get(operation_key=KEY).refund_id


def sent(event_type):
    """The sandbox's `event_type` event, sent now by its delivery job over HTTP: as the receiver stored it."""
    event = SandboxWebhook.objects.get(event_type=event_type)
    assert webhook_deliver(event.pk) == 1, SandboxWebhook.objects.get(pk=event.pk).last_error
    return WebhookEvent.objects.get(event_id=event.event_id)


def holding(upstream, during):
    """A handler for `thread_server`: each request passed on to `upstream`, and its answer held
    while `during()` runs (on this server thread's own database connection, closed after)."""

    class Hold(BaseHTTPRequestHandler):
        def _pass_on(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {name: self.headers[name] for name in PASSED_ON if name in self.headers}
            answer = httpx.request(self.command, f"{upstream}{self.path}", content=body, headers=headers, timeout=30)
            try:
                during()
            finally:
                connection.close()
            self.send_response(answer.status_code)
            self.send_header("Content-Type", answer.headers["Content-Type"])
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        do_GET = do_POST = _pass_on  # noqa: N815 (http.server's names)

        def log_message(self, format, *args):  # noqa: A002
            pass

    return Hold


@contextmanager
def answers_held(provider, settings, during):
    """The connector's calls reach the sandbox, and their answers come back only once `during()`
    has run: meanwhile the call is out."""
    with thread_server(holding(str(provider.base_url).rstrip("/"), during)) as proxy:
        settings.SANDBOX_BASE_URL = f"{proxy.url}/sandbox/v1"
        yield


def claimed(action):
    return executor.action_claim_next("worker", only=action.pk)


def pending(agent, provider):
    action, _ = action_request(agent=agent, operation_key=KEY, action_type="refund", target="ORD-W1",
                               params={"amount": "25.00", "currency": "EUR"})
    return claimed(action)


def under_verification(agent, provider):
    """Its earlier call made the refund at the sandbox, and its answer was lost."""
    earlier = sandbox(provider, "POST", "refunds", json=REFUND, headers={"Idempotency-Key": KEY})
    assert earlier.status_code == 201, earlier.text
    return claimed(make_action(agent, S.UNKNOWN, key=KEY, target="ORD-W1", attempts=1, fence=2))


def failed_effect_told(action):
    assert (action.status, action.external_ref) == (S.SUCCEEDED, made())
    [incident] = Incident.objects.all()
    assert (incident.kind, incident.operation_key, incident.external_refs) == (
        IncidentKind.FAILED_EFFECT, KEY, [made()])
    return incident


@pytest.mark.parametrize("claim", [pending, under_verification], ids=["the worker's call", "a verifier's look"])
def test_a_failure_of_the_effect_while_the_call_is_out_is_told_when_the_call_settles_it(agent, provider, settings,
                                                                                       claim):
    failing_the_refund(provider)
    action, delivered = claim(agent, provider), []

    with answers_held(provider, settings, lambda: delivered.append(sent("refund.failed"))):
        executor.action_run_claimed(action)

    [failure] = delivered
    assert not failure.outcome.startswith("settled"), failure.outcome
    action = Action.objects.get(pk=action.pk)
    incident = failed_effect_told(action)
    assert audit_events(action, "succeeded").get().actor == "system:executor"
    assert incident.evidence["effects"][0]["raw"]["event_id"] == failure.event_id


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises writers")
def test_a_failure_committed_while_the_worker_waits_to_settle_is_told_by_the_settle(agent, provider, settings,
                                                                                   monkeypatch):
    """The failure's delivery holds the action's lock (pending: nothing to settle) when the call
    answers; the worker's settle waits for that lock, and the delivery commits meanwhile. What the
    settle reads back is read once it has the row, not by its statement's own snapshot, taken
    before the failure committed: it tells a person."""
    settle, call_out, failure_holds = webhooks._settle, threading.Event(), threading.Event()

    def settle_then_wait_for_the_worker(*args, **kwargs):
        outcome = settle(*args, **kwargs)
        failure_holds.set()
        wait_until(lambda: sessions_waiting_for_a_lock("ledger_action"), seconds=10,
                   message="the worker's settle to wait for the action's lock")
        return outcome

    def answer_once_the_failure_holds():
        call_out.set()
        assert failure_holds.wait(10)

    def failure_once_the_call_is_out():
        assert call_out.wait(10)
        return sent("refund.failed")

    monkeypatch.setattr(webhooks, "_settle", settle_then_wait_for_the_worker)
    failing_the_refund(provider)
    action = pending(agent, provider)

    with answers_held(provider, settings, answer_once_the_failure_holds):
        _, failure = in_threads(lambda: executor.action_run_claimed(action), failure_once_the_call_is_out)

    assert failure.outcome == f"nothing to settle: {KEY} is pending, its call still out"
    incident = failed_effect_told(Action.objects.get(pk=action.pk))
    assert incident.evidence["effects"][0]["raw"]["event_id"] == failure.event_id


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises writers")
def test_a_failure_delivered_while_the_worker_settles_waits_and_tells_a_person_itself(agent, provider, monkeypatch):
    """The worker's settle holds the action's lock, having read back no failure, when the failure's
    event is written (not committed) and its delivery waits for that lock: let through once the
    success commits, it finds the action succeeded with that refund. One incident."""
    succeeded = held_once_succeeded(monkeypatch)
    failing_the_refund(provider)
    action = pending(agent, provider)

    def failure_once_the_success_holds_the_action():
        assert succeeded.wait(10)
        return sent("refund.failed")

    _, failure = in_threads(lambda: executor.action_run_claimed(action), failure_once_the_success_holds_the_action)

    assert failure.outcome == f"refund.failed of {made()}, which {KEY} succeeded with: a person is told"
    failed_effect_told(Action.objects.get(pk=action.pk))


def test_a_success_event_while_the_worker_calls_leaves_the_worker_to_settle_once(agent, provider, settings):
    """The event finds the action pending: stored, saying so, and in the action's evidence record;
    the worker's answer settles it, once, and the event changed nothing of it."""
    action, delivered = pending(agent, provider), []

    with answers_held(provider, settings, lambda: delivered.append(sent("refund.succeeded"))):
        executor.action_run_claimed(action)

    [success] = delivered
    assert success.outcome == f"nothing to settle: {KEY} is pending, its call still out"
    action = Action.objects.get(pk=action.pk)
    assert (action.status, action.external_ref) == (S.SUCCEEDED, made())
    assert [e.actor for e in audit_events(action, "succeeded")] == ["system:executor"]
    assert not any("webhook" in entry for entry in action.evidence)
    assert [e["event_id"] for e in evidence_webhooks(action)] == [success.event_id]
    assert not Incident.objects.exists()


def test_a_worker_whose_claim_lapsed_while_the_event_settled_is_refused_by_the_fence(agent, provider, settings):
    """A call that outlives its worker's lease: the sweeper makes the action `unknown`, the sandbox's
    success event settles it, and then the call answers (the refund made): too late, the settle is
    the event's alone."""
    action, delivered = pending(agent, provider), []

    def lapsed_then_the_event():
        Action.objects.filter(pk=action.pk).update(lease_expires_at=clock.now() - timedelta(hours=1))
        assert executor.action_expire_leases() == 1
        delivered.append(sent("refund.succeeded"))

    with answers_held(provider, settings, lapsed_then_the_event):
        executor.action_run_claimed(action)

    [success] = delivered
    assert success.outcome == f"settled {KEY} as succeeded"
    action = Action.objects.get(pk=action.pk)
    assert (action.status, action.external_ref, action.error) == (S.SUCCEEDED, made(), None)
    assert [e.actor for e in audit_events(action, "succeeded")] == ["system:webhook:sandbox"]
    # The sweeper's entry, then the event's.
    assert [entry.get("webhook") for entry in action.evidence] == [None, "refund.succeeded"]
    assert action.evidence[-1]["event_id"] == success.event_id
