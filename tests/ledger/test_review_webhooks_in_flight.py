"""A provider's event that arrives while the ledger's own call about the action is still out: the
worker's call (the action `pending`) or a verifier's look (`unknown`, claimed). The event cannot
settle a pending action (the worker's answer does), and a failure only sends an open outcome to be
verified: the worker's or the verifier's success lands after it. When the failure names the very
effect that success names, the provider failed it after making it, and a person must be told
(decision 60), as when a success event or a person settles the action after such a failure: also
when the failure commits while the success waits for the action's lock, or the failure's delivery
waits for it while the success commits."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client

from dlq.incidents import Incident, IncidentKind
from ledger import clock, executor, webhooks
from ledger.actions import action_request
from ledger.connectors import http
from ledger.connectors.base import Effect, Lookup
from ledger.evidence import _webhooks as evidence_webhooks
from ledger.models import Action, ActionStatus, WebhookEvent
from tests.conftest import wait_until
from tests.factories import audit_events, make_action, make_agent, sessions_waiting_for_a_lock
from tests.ledger.test_review_webhooks_concurrent import held_once_succeeded, in_threads
from tests.ledger.test_webhooks import KEY, deliver, event, webhook_secret  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]
S = ActionStatus
REFUND = "re_w1"


class Provider:
    """A provider whose event about the action arrives while the ledger's call to it is out: the
    call (or the look) posts `event_type` to the webhook, then answers that it made REFUND."""

    name = "sandbox"
    verifiable = True

    def __init__(self, event_type):
        self.event_type, self.delivered = event_type, []

    def _event_first(self):
        answer = deliver(Client(), event(event_id="evt_during", event_type=self.event_type, refund_id=REFUND))
        assert answer.status_code == 200, answer.content
        self.delivered.append(answer.json()["outcome"])

    def perform(self, action):
        self._event_first()
        return Effect(external_ref=REFUND, result={"id": REFUND, "status": "pending"})

    def find_effect(self, action):
        self._event_first()
        return Lookup(found=True, external_ref=REFUND, result={"id": REFUND, "status": "pending"},
                      evidence={"matches": [[REFUND, "pending"]]})


@pytest.fixture
def agent(transactional_db):
    return make_agent("billing")[0]


def claimed(action):
    return executor.action_claim_next("worker", only=action.pk)


def pending(agent):
    action, _ = action_request(agent=agent, operation_key=KEY, action_type="refund", target="ORD-W1",
                               params={"amount": "25.00", "currency": "EUR"})
    return claimed(action)


def under_verification(agent):
    return claimed(make_action(agent, S.UNKNOWN, key=KEY, target="ORD-W1", attempts=1, fence=2))


def run(action, provider, monkeypatch):
    monkeypatch.setattr(executor, "connector_for_action", lambda action: provider)
    executor.action_run_claimed(action)
    return Action.objects.get(pk=action.pk)


@pytest.mark.parametrize("claim", [pending, under_verification], ids=["the worker's call", "a verifier's look"])
def test_a_failure_of_the_effect_while_the_call_is_out_is_told_when_the_call_settles_it(agent, monkeypatch, claim):
    provider = Provider("refund.failed")

    action = run(claim(agent), provider, monkeypatch)

    [outcome] = provider.delivered
    assert not outcome.startswith("settled"), outcome
    assert (action.status, action.external_ref) == (S.SUCCEEDED, REFUND)
    assert audit_events(action, "succeeded").get().actor == "system:executor"
    [incident] = Incident.objects.all()
    assert (incident.kind, incident.operation_key, incident.external_refs) == (
        IncidentKind.FAILED_EFFECT, KEY, [REFUND])
    assert incident.evidence["effects"][0]["raw"]["event_id"] == "evt_during"


def failed_effect_told(action):
    assert (action.status, action.external_ref) == (S.SUCCEEDED, REFUND)
    [incident] = Incident.objects.all()
    assert (incident.kind, incident.operation_key, incident.external_refs) == (
        IncidentKind.FAILED_EFFECT, KEY, [REFUND])
    return incident


def deliver_failure():
    return deliver(Client(), event(event_id="evt_during", event_type="refund.failed", refund_id=REFUND))


class Answered(Provider):
    """The call answers REFUND made once `go` is set; the event is delivered by the test."""

    def __init__(self, go):
        super().__init__("refund.failed")
        self.go = go

    def perform(self, action):
        assert self.go.wait(10)
        return Effect(external_ref=REFUND, result={"id": REFUND, "status": "pending"})


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises writers")
def test_a_failure_committed_while_the_worker_waits_to_settle_is_told_by_the_settle(agent, monkeypatch):
    """The failure's delivery holds the action's lock (pending: nothing to settle) when the call
    answers; the worker's settle waits for that lock, and the delivery commits meanwhile. What the
    settle reads back is read once it has the row, not by its statement's own snapshot, taken
    before the failure committed: it tells a person."""
    settle, failure_holds = webhooks._settle, threading.Event()

    def settle_then_wait_for_the_worker(*args, **kwargs):
        outcome = settle(*args, **kwargs)
        failure_holds.set()
        wait_until(lambda: sessions_waiting_for_a_lock("ledger_action"), seconds=10,
                   message="the worker's settle to wait for the action's lock")
        return outcome

    monkeypatch.setattr(webhooks, "_settle", settle_then_wait_for_the_worker)
    monkeypatch.setattr(executor, "connector_for_action", lambda action: Answered(failure_holds))
    action = pending(agent)

    failure, _ = in_threads(deliver_failure, lambda: executor.action_run_claimed(action))

    assert failure.json()["outcome"] == f"nothing to settle: {KEY} is pending, its call still out"
    incident = failed_effect_told(Action.objects.get(pk=action.pk))
    assert incident.evidence["effects"][0]["raw"]["event_id"] == "evt_during"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises writers")
def test_a_failure_delivered_while_the_worker_settles_waits_and_tells_a_person_itself(agent, monkeypatch):
    """The worker's settle holds the action's lock, having read back no failure, when the failure's
    event is written (not committed) and its delivery waits for that lock: let through once the
    success commits, it finds the action succeeded with that refund. One incident."""
    succeeded = held_once_succeeded(monkeypatch)
    answered = threading.Event()
    answered.set()
    monkeypatch.setattr(executor, "connector_for_action", lambda action: Answered(answered))
    action = pending(agent)

    def failure_once_the_success_holds_the_action():
        assert succeeded.wait(10)
        return deliver_failure()

    _, failure = in_threads(lambda: executor.action_run_claimed(action), failure_once_the_success_holds_the_action)

    assert failure.json()["outcome"] == f"refund.failed of {REFUND}, which {KEY} succeeded with: a person is told"
    failed_effect_told(Action.objects.get(pk=action.pk))


def test_a_success_event_while_the_worker_calls_leaves_the_worker_to_settle_once(agent, monkeypatch):
    """The event finds the action pending: stored, saying so, and in the action's evidence record;
    the worker's answer settles it, once, and the event changed nothing of it."""
    provider = Provider("refund.succeeded")

    action = run(pending(agent), provider, monkeypatch)

    assert provider.delivered == [f"nothing to settle: {KEY} is pending, its call still out"]
    assert WebhookEvent.objects.get(event_id="evt_during").outcome == provider.delivered[0]
    assert (action.status, action.external_ref) == (S.SUCCEEDED, REFUND)
    assert [e.actor for e in audit_events(action, "succeeded")] == ["system:executor"]
    assert not any("webhook" in entry for entry in action.evidence)
    assert [e["event_id"] for e in evidence_webhooks(action)] == ["evt_during"]
    assert not Incident.objects.exists()


class Stalled(Provider):
    """A call that outlives its worker's lease: the sweeper makes the action `unknown`, the
    provider's success event settles it, and then the call answers, a refusal."""

    def perform(self, action):
        Action.objects.filter(pk=action.pk).update(lease_expires_at=clock.now() - timedelta(hours=1))
        assert executor.action_expire_leases() == 1
        self._event_first()
        raise http.Rejected("declined, as the stalled call was answered", code="declined")


def test_a_worker_whose_claim_lapsed_while_the_event_settled_is_refused_by_the_fence(agent, monkeypatch):
    provider = Stalled("refund.succeeded")

    action = run(pending(agent), provider, monkeypatch)

    assert provider.delivered == [f"settled {KEY} as succeeded"]
    assert (action.status, action.external_ref, action.error) == (S.SUCCEEDED, REFUND, None)
    assert [e.actor for e in audit_events(action, "succeeded")] == ["system:webhook:sandbox"]
    assert not audit_events(action, "failed").exists()
    # The sweeper's entry, then the event's.
    assert [entry.get("webhook") for entry in action.evidence] == [None, "refund.succeeded"]
    assert action.evidence[-1]["event_id"] == "evt_during"
