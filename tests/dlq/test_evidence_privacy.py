"""An action's evidence record names no staff address: it is the agent's to read (and whoever holds its
token), and it showed whom each alert about the action went to, and whom each delivery reached. It
still shows that an alert was raised, of which kind, when, and whether each delivery went through;
the record stays signed and verifiable, from the API and from the dashboard."""

import json
from urllib.parse import quote

import pytest
from django.utils import timezone

from approvals.models import ReviewItem
from dlq.models import Alert, AlertDelivery
from dlq.reconcile import incident_open_for_failed_effect
from ledger.evidence import record_problems
from ledger.models import AuditEvent
from tests.factories import make_action, make_agent_on

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

KEY = "refund:ORD-P1:full:dec-1"
STAFF = "staff.example"  # every address an alert named or reached


@pytest.fixture
def alerted(client):
    """An agent's refund the provider failed after it succeeded (an incident, alerted to the group)
    and waiting for a person past the deadline (an overdue alert to the limit's tier), each alert
    delivered, with an agent's token on `client`."""
    agent = make_agent_on(client)
    action = make_action(agent, "succeeded", key=KEY, external_ref="re_1")
    incident_open_for_failed_effect(action, connector="sandbox", external_ref="re_1", actor="system:tests",
                                    evidence={"webhook": "refund.failed"})
    item = ReviewItem.objects.create(action=action, kind="unknown_outcome", why="the provider could not say",
                                     deadline=timezone.now())
    Alert.objects.raise_for(kind=Alert.Kind.OVERDUE_REVIEW, review_item=item, subject=f"Overdue: {item}",
                            link=item.get_absolute_url(), recipients=[f"lead@{STAFF}", f"second@{STAFF}"])
    for alert in Alert.objects.all():
        AlertDelivery.objects.create(alert=alert, channel="email", attempt=1, ok=False,
                                     detail=f"SMTPRecipientsRefused: {{'lead@{STAFF}': (550, b'no')}}")
        AlertDelivery.objects.create(alert=alert, channel="email", attempt=2, ok=True,
                                     detail=f"mailed to lead@{STAFF}, second@{STAFF}", reached=[f"lead@{STAFF}"])
    AuditEvent.objects.seal()
    return action


def test_the_agents_record_shows_its_alerts_without_a_staff_address(client, alerted):
    response = client.get(f"/api/v1/actions/{quote(KEY, safe='')}/evidence")

    assert response.status_code == 200, response.content
    assert STAFF not in response.content.decode()
    record = response.json()
    alerts = record["sections"]["dead_letters"]["alerts"]
    assert sorted(alert["kind"] for alert in alerts) == ["incident", "overdue_review"]
    for alert in alerts:
        assert alert["created_at"] and "recipients" not in alert
        assert [(d["channel"], d["attempt"], d["ok"]) for d in alert["deliveries"]] == [
            ("email", 1, False), ("email", 2, True)]
        assert all(set(d) == {"channel", "attempt", "ok", "at"} for d in alert["deliveries"])
    assert record_problems(record) == []


def test_the_dashboards_record_is_the_same_and_verifies_and_its_page_says_where_recipients_are(client, alerted,
                                                                                               auditor):
    client.force_login(auditor)

    download = client.get(f"/actions/{alerted.pk}/evidence.json")
    page = client.get(f"/actions/{alerted.pk}/evidence")

    assert STAFF not in download.content.decode() and STAFF not in page.content.decode()
    assert record_problems(json.loads(download.content)) == []
    incident = Alert.objects.get(kind="incident").incident
    # Whom it reached is on the incident's own page, for the people who work it.
    assert f'href="{incident.get_absolute_url()}"' in page.content.decode()
