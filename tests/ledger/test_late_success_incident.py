"""A refund's success that comes after the provider's failure of that very refund, for a refund over its
limit: the success settles nothing (a person reviews it), and nobody was told of the failure, neither
then nor when the person marked it succeeded. Decision 60 holds here too: the failure stored opens the
`failed_effect` incident (one, however often it is told), and the person deciding sees both events.

Whoever makes the move that reveals the failure is the one the audit trail says told a person: the
success event, the worker whose call was answered with that refund, the person marking it succeeded;
the failure's webhook only stored it. And a person is told once per move, not by both the move's
reaction and the success event's settle."""

import httpx
import pytest

from approvals.decisions import review_decide
from approvals.models import Limit, ReviewItem
from dlq.incidents import Incident, IncidentKind
from dlq.models import Alert
from ledger import executor, hooks
from ledger.actions import action_request
from ledger.models import ActionStatus
from tests.factories import audit_events, make_action, make_agent, person
from tests.ledger.test_webhooks import deliver as post_event, event, webhook_secret  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

KEY = "refund:ORD-L1:full:dec-1"
S = ActionStatus


@pytest.fixture
def over_limit():
    """A refund of 25.00 EUR whose call timed out, above its limit of 10.00."""
    Limit.objects.create(action_type="refund", currency="EUR", max_amount="10.00")
    return make_action(make_agent("billing", grants=())[0], S.UNKNOWN, key=KEY, target="ORD-L1", attempts=1, fence=2)


@pytest.fixture
def told(monkeypatch):
    """What the ledger's seam was told (hooks.effect_failed), each passed on to dlq's. dlq opens one
    incident while open, however often it is told, so a second telling shows only here."""
    calls, effect_failed = [], hooks.effect_failed

    def telling(action, **details):
        calls.append(details)
        effect_failed(action, **details)

    monkeypatch.setattr(hooks, "effect_failed", telling)
    return calls


def deliver(client, event_id, event_type, refund_id="re_l1", key=KEY):
    answer = post_event(client, event(event_id, event_type, key=key, refund_id=refund_id))
    assert answer.status_code == 200, answer.content
    return answer.json()["outcome"]


def failed_effect_incident(key=KEY, refund_id="re_l1"):
    [incident] = Incident.objects.all()
    assert (incident.kind, incident.operation_key, incident.external_refs, incident.status) == (
        IncidentKind.FAILED_EFFECT, key, [refund_id], "open")
    assert Alert.objects.filter(incident=incident).count() == 1
    return incident


def opened_by(client, incident):
    """Who opened `incident`, as its audit trail says and its page shows."""
    [opened] = audit_events(incident, "incident_opened")
    client.force_login(person("olga", "approvers"))
    assert f"by <strong>{opened.actor}</strong>" in client.get(incident.get_absolute_url()).content.decode()
    return opened.actor


def test_the_late_success_over_its_limit_opens_the_incident_and_the_person_sees_both_events(client, over_limit,
                                                                                             told):
    deliver(client, "evt_2", "refund.failed")

    outcome = deliver(client, "evt_1", "refund.succeeded")

    assert outcome.startswith("left to a person") and "refund.failed of re_l1 came first: a person is told" in outcome
    over_limit.refresh_from_db()
    assert (over_limit.status, over_limit.external_ref) == (S.NEEDS_REVIEW, "")
    incident = failed_effect_incident()
    assert incident.evidence["effects"][0]["raw"]["event_id"] == "evt_2"
    assert [call["actor"] for call in told] == ["system:webhook:sandbox"]  # the success event revealed it
    # The decision page shows the action's evidence: the success, and the failure that came first.
    seen = over_limit.evidence[-1]
    assert (seen["webhook"], seen["event_id"], seen["failed"]["webhook"], seen["failed"]["event_id"]) == (
        "refund.succeeded", "evt_1", "refund.failed", "evt_2")
    item = ReviewItem.objects.get(action=over_limit, status="open")
    approver = person("alice", "approvers")
    client.force_login(approver)
    page = client.get(item.get_absolute_url()).content.decode()
    assert "evt_1" in page and "evt_2" in page

    review_decide(item, user=approver, decision="mark_succeeded", external_ref="re_l1", reason="in the dashboard")

    over_limit.refresh_from_db()
    assert (over_limit.status, over_limit.external_ref) == (S.SUCCEEDED, "re_l1")
    failed_effect_incident()  # still the one


def test_a_person_marking_succeeded_the_effect_the_provider_failed_opens_the_incident(client, over_limit, told):
    """The success left to a person first, the failure after it (which sends the action to be looked at
    again, then back to a person): the person's "mark succeeded" with that refund finds the failure, and
    the incident is theirs to have opened, not the webhook's, whose event only stored it."""
    deliver(client, "evt_1", "refund.succeeded")
    deliver(client, "evt_2", "refund.failed")
    over_limit.refresh_from_db()
    assert over_limit.status == S.UNKNOWN and not Incident.objects.exists()
    over_limit.mark_needs_review(actor="system:executor", evidence={"found": None}, reason="the provider could not say")

    review_decide(ReviewItem.objects.get(action=over_limit, status="open"), user=person("alice", "approvers"),
                  decision="mark_succeeded", external_ref="re_l1", reason="in the dashboard")

    incident = failed_effect_incident()
    assert incident.evidence["effects"][0]["raw"]["event_id"] == "evt_2"
    assert [call["external_ref"] for call in told] == ["re_l1"]
    assert opened_by(client, incident) == "user:alice"


def test_the_workers_success_with_the_effect_the_provider_failed_opens_the_incident_as_the_worker(
        client, live_server, settings, told):
    """The provider made the refund under the key, and its `refund.failed` came while the worker's call
    was out (pending: nothing to settle); the call is answered with that very refund (the real sandbox,
    which answers a key it holds with its effect). The worker's move revealed the failure."""
    key = "refund:ORD-L2:full:dec-2"
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox/v1"
    action, _ = action_request(agent=make_agent("billing")[0], operation_key=key, action_type="refund",
                               target="ORD-L2", params={"amount": "25.00", "currency": "EUR"})
    claimed = executor.action_claim_next("worker", only=action.pk)
    # The provider makes the refund under the key (as the call's request, sent a first time), and fails it.
    made = httpx.post(f"{settings.SANDBOX_BASE_URL}/refunds", json={
        "order_id": "ORD-L2", "amount": "25.00", "currency": "EUR", "metadata": {"operation_key": key}},
        headers={"Authorization": f"Bearer {settings.SANDBOX_API_KEY}", "Idempotency-Key": key})
    assert made.status_code == 201, made.text
    refund_id = made.json()["id"]
    assert deliver(client, "evt_4", "refund.failed", refund_id=refund_id, key=key) == (
        f"nothing to settle: {key} is pending, its call still out")

    executor.action_run_claimed(claimed)

    action.refresh_from_db()
    assert (action.status, action.external_ref) == (S.SUCCEEDED, refund_id)
    assert audit_events(action, "succeeded").get().actor == "system:executor"
    incident = failed_effect_incident(key, refund_id)
    assert incident.evidence["effects"][0]["raw"]["event_id"] == "evt_4"
    assert [call["external_ref"] for call in told] == [refund_id]
    assert opened_by(client, incident) == "system:executor"


def test_a_success_event_after_the_failure_tells_a_person_once(client, told):
    """The success event settles the action: its move's reaction tells a person of the failure stored
    before it, and the settle only names that event in its outcome (told by both, the seam would count
    two)."""
    action = make_action(make_agent("billing", grants=())[0], S.UNKNOWN, key=KEY, target="ORD-L1", attempts=1,
                         fence=2)
    assert deliver(client, "evt_2", "refund.failed") == f"refund.failed noted; {KEY} is verified at the provider"

    outcome = deliver(client, "evt_1", "refund.succeeded")

    assert outcome == f"settled {KEY} as succeeded; refund.failed of re_l1 came first: a person is told"
    action.refresh_from_db()
    assert (action.status, action.external_ref) == (S.SUCCEEDED, "re_l1")
    assert [(call["actor"], call["evidence"]["event_id"]) for call in told] == [("system:webhook:sandbox", "evt_2")]
    assert opened_by(client, failed_effect_incident()) == "system:webhook:sandbox"


def test_a_person_marking_succeeded_another_refund_opens_nothing(client, over_limit):
    deliver(client, "evt_0", "refund.failed", refund_id="re_l0")  # an earlier attempt's
    deliver(client, "evt_1", "refund.succeeded")

    review_decide(ReviewItem.objects.get(action=over_limit, status="open"), user=person("alice", "approvers"),
                  decision="mark_succeeded", external_ref="re_l1", reason="in the dashboard")

    over_limit.refresh_from_db()
    assert over_limit.status == S.SUCCEEDED and not Incident.objects.exists()
