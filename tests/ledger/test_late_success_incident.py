"""A refund's success that comes after the provider's failure of that very refund, for a refund over its
limit: the success settles nothing (a person reviews it), and nobody was told of the failure, neither
then nor when the person marked it succeeded. Decision 60 holds here too: the failure stored opens the
`failed_effect` incident (one, however often it is told), and the person deciding sees both events."""

import pytest

from approvals.decisions import review_decide
from approvals.models import Limit, ReviewItem
from dlq.incidents import Incident, IncidentKind
from dlq.models import Alert
from ledger.models import ActionStatus
from tests.factories import make_action, make_agent, person
from tests.ledger.test_webhooks import deliver as post_event, event, webhook_secret  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

KEY = "refund:ORD-L1:full:dec-1"
S = ActionStatus


@pytest.fixture
def over_limit():
    """A refund of 25.00 EUR whose call timed out, above its limit of 10.00."""
    Limit.objects.create(action_type="refund", currency="EUR", max_amount="10.00")
    return make_action(make_agent("billing", grants=())[0], S.UNKNOWN, key=KEY, target="ORD-L1", attempts=1, fence=2)


def deliver(client, event_id, event_type, refund_id="re_l1"):
    answer = post_event(client, event(event_id, event_type, key=KEY, refund_id=refund_id))
    assert answer.status_code == 200, answer.content
    return answer.json()["outcome"]


def failed_effect_incident():
    [incident] = Incident.objects.all()
    assert (incident.kind, incident.operation_key, incident.external_refs, incident.status) == (
        IncidentKind.FAILED_EFFECT, KEY, ["re_l1"], "open")
    assert Alert.objects.filter(incident=incident).count() == 1
    return incident


def test_the_late_success_over_its_limit_opens_the_incident_and_the_person_sees_both_events(client, over_limit):
    deliver(client, "evt_2", "refund.failed")

    outcome = deliver(client, "evt_1", "refund.succeeded")

    assert outcome.startswith("left to a person") and "refund.failed of re_l1 came first: a person is told" in outcome
    over_limit.refresh_from_db()
    assert (over_limit.status, over_limit.external_ref) == (S.NEEDS_REVIEW, "")
    assert failed_effect_incident().evidence["effects"][0]["raw"]["event_id"] == "evt_2"
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


def test_a_person_marking_succeeded_the_effect_the_provider_failed_opens_the_incident(client, over_limit):
    """The success left to a person first, the failure after it (which sends the action to be looked at
    again, then back to a person): the person's "mark succeeded" with that refund finds the failure."""
    deliver(client, "evt_1", "refund.succeeded")
    deliver(client, "evt_2", "refund.failed")
    over_limit.refresh_from_db()
    assert over_limit.status == S.UNKNOWN and not Incident.objects.exists()
    over_limit.mark_needs_review(actor="system:executor", evidence={"found": None}, reason="the provider could not say")

    review_decide(ReviewItem.objects.get(action=over_limit, status="open"), user=person("alice", "approvers"),
                  decision="mark_succeeded", external_ref="re_l1", reason="in the dashboard")

    assert failed_effect_incident().evidence["effects"][0]["raw"]["event_id"] == "evt_2"


def test_a_person_marking_succeeded_another_refund_opens_nothing(client, over_limit):
    deliver(client, "evt_0", "refund.failed", refund_id="re_l0")  # an earlier attempt's
    deliver(client, "evt_1", "refund.succeeded")

    review_decide(ReviewItem.objects.get(action=over_limit, status="open"), user=person("alice", "approvers"),
                  decision="mark_succeeded", external_ref="re_l1", reason="in the dashboard")

    over_limit.refresh_from_db()
    assert over_limit.status == S.SUCCEEDED and not Incident.objects.exists()
