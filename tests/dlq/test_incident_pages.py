"""The incidents' pages: the list and an incident's evidence; an operator takes it, adds a note
and resolves it with a reason (required), each audited; an auditor reads but cannot work it;
a resolved incident stays resolved. The status table is written out here."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from dlq.incidents import INCIDENT_TRANSITIONS, Incident, IncidentKind, IncidentStatus, ReconciliationRun
from dlq.models import Alert
from dlq.reconcile import Finding
from ledger.models import AuditEvent
from ledger.roles import roles_setup

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


def user_in(group, name):
    user = get_user_model().objects.create_user(username=name, password=None)
    user.groups.add(Group.objects.get(name=group))
    return user


@pytest.fixture
def incident(db):
    roles_setup()
    key = "refund:ORD-7:full:dec-7"
    effect = {"external_ref": "re_ghost", "amount": "80.00", "currency": "EUR",
              "created_at": timezone.now().isoformat(), "raw": {"id": "re_ghost", "order_id": "ORD-7"}}
    finding = Finding(IncidentKind.ORPHAN_EFFECT, "sandbox", "refund", key, key, effects=[effect])
    return Incident.objects.open_for(finding, actor="system:reconcile")


@pytest.fixture
def operator(client, incident):
    client.force_login(user_in("operators", "olga"))
    return client


def verbs(incident):
    return [event.verb for event in AuditEvent.objects.history(incident)]


def test_the_status_table_is_exactly_this():
    assert {str(a): {str(b) for b in to} for a, to in INCIDENT_TRANSITIONS.items()} == {"open": {"resolved"},
                                                                                        "resolved": set()}
    assert set(INCIDENT_TRANSITIONS) == set(IncidentStatus.values)


def test_the_same_finding_never_opens_a_second_incident_or_alert(incident):
    finding = Finding(IncidentKind.ORPHAN_EFFECT, "sandbox", "refund", incident.operation_key, incident.subject)
    assert Incident.objects.open_for(finding, actor="system:reconcile") is None
    assert Incident.objects.count() == 1 and Alert.objects.get().incident == incident


def test_the_list_shows_the_open_incident_and_links_it_from_the_nav(operator, incident):
    page = operator.get("/incidents/").content.decode()
    assert f'href="/incidents/{incident.pk}/"' in page and "effect without a ledger entry" in page
    assert 'href="/incidents/" aria-current="page">Incidents</a>' in page
    assert "Reconciliation has not run yet." in page
    assert f'/incidents/{incident.pk}/' not in operator.get("/incidents/?status=resolved").content.decode()
    rows = operator.get("/incidents/?kind=orphan_effect", headers={"HX-Request": "true"})
    assert rows.content.decode().lstrip().startswith('<section id="incident-rows"')


def test_the_detail_shows_the_evidence_and_the_alert(operator, incident):
    page = operator.get(f"/incidents/{incident.pk}/").content.decode()
    assert "re_ghost" in page and "80.00 EUR" in page and 'id="no-ledger-entry"' in page
    assert "Reconciliation: refund:ORD-7:full:dec-7: an effect at sandbox and no ledger entry" in page


def test_an_operator_takes_notes_and_resolves_it_with_a_reason(operator, incident):
    operator.post(f"/incidents/{incident.pk}/take")
    incident.refresh_from_db()
    assert incident.owner.username == "olga"
    operator.post(f"/incidents/{incident.pk}/note", {"reason": "the provider's support confirms two refunds"})

    refused = operator.post(f"/incidents/{incident.pk}/resolve", {"reason": "  "}, follow=True)
    assert "Not done: a reason is required" in refused.content.decode()
    incident.refresh_from_db()
    assert incident.status == IncidentStatus.OPEN

    operator.post(f"/incidents/{incident.pk}/resolve", {"reason": "made by hand at the provider; ticket 8812"})
    incident.refresh_from_db()
    assert incident.status == IncidentStatus.RESOLVED and incident.resolved_by == "user:olga"
    assert incident.resolution == "made by hand at the provider; ticket 8812" and incident.resolved_at
    assert verbs(incident) == ["incident_opened", "incident_taken", "incident_noted", "incident_resolved"]
    resolved = AuditEvent.objects.history(incident).last()
    assert resolved.before == {"status": "open"} and resolved.after == {"status": "resolved"}
    page = operator.get(f"/incidents/{incident.pk}/").content.decode()
    assert "the provider&#x27;s support confirms two refunds" in page and 'id="resolve-form"' not in page

    again = operator.post(f"/incidents/{incident.pk}/resolve", {"reason": "twice"}, follow=True)
    assert "Not done:" in again.content.decode()
    assert verbs(incident)[-1] == "incident_resolved" and len(verbs(incident)) == 4


def test_an_auditor_reads_it_but_cannot_work_it(client, incident):
    client.force_login(user_in("auditors", "aud"))
    page = client.get(f"/incidents/{incident.pk}/").content.decode()
    assert 'id="no-permission"' in page and 'id="resolve-form"' not in page
    for op in ("take", "note", "resolve"):
        assert client.post(f"/incidents/{incident.pk}/{op}", {"reason": "x"}).status_code == 403
    incident.refresh_from_db()
    assert incident.status == IncidentStatus.OPEN and incident.owner is None
    assert verbs(incident) == ["incident_opened"]


def test_an_unknown_operation_or_incident_is_a_404(operator, incident):
    assert operator.post(f"/incidents/{incident.pk}/delete").status_code == 404
    assert operator.get("/incidents/999999/").status_code == 404
    assert operator.get(f"/incidents/{incident.pk}/resolve").status_code == 405


def test_the_overview_card_counts_the_open_incidents_and_those_this_user_may_work(incident):
    from console.incident_views import incident_card

    [card] = incident_card(user_in("operators", "otto"), timezone.now())
    assert (card["count"], card["mine"], card["oldest"]) == (1, 1, incident.created_at)
    assert card["href"] == "/incidents/"
    assert incident_card(user_in("auditors", "aud"), timezone.now())[0]["mine"] == 0


@pytest.mark.parametrize("query", ["status=nope", "kind=nope", "connector=" + "x" * 5000, "after=%%%", "after=AAAA",
                                   "status=all&kind=double_effect"])
def test_odd_filters_show_a_page_never_a_500(operator, query):
    assert operator.get(f"/incidents/?{query}").status_code == 200


def test_the_list_says_when_reconciliation_last_ran_and_what_it_could_not_read(operator):
    now = timezone.now()
    ReconciliationRun.objects.create(since=now - timedelta(hours=1), until=now, finished_at=now, complete=False,
                                     report={"sandbox": {"failed": "GET /sandbox/v1/refunds: HTTP 503"},
                                             "unlisted": {"skipped": "this connector cannot list its records"}})
    line = re.sub(r"\s+", " ", operator.get("/incidents/").content.decode().split('id="last-run">')[1].split("</p>")[0])
    assert "incomplete" in line and "sandbox: GET /sandbox/v1/refunds: HTTP 503" in line
    assert "unlisted: this connector cannot list its records" in line


@pytest.mark.parametrize(("report", "finished", "hint"), [
    (None, True, "Reconciliation has not finished a run yet"),
    ({}, False, "Reconciliation has not finished a run yet"),  # one is running
    ({"sandbox": {"records": 3, "findings": 0, "opened": 0}}, True, "Reconciliation found nothing wrong"),
    ({"sandbox": {"failed": "GET /sandbox/v1/refunds: HTTP 503"}, "unlisted": {"skipped": "cannot list"}}, True,
     "The last reconciliation could not read sandbox"),
])
def test_the_overview_card_says_nothing_was_found_only_after_a_run_that_read_every_connector(
        db, report, finished, hint):
    """With no incident open, the card said "found nothing wrong" before any run, while one ran,
    and after a run that could not read a connector."""
    from console.incident_views import incident_card

    roles_setup()
    if report is not None:
        now = timezone.now()
        ReconciliationRun.objects.create(since=now - timedelta(hours=1), until=now,
                                         finished_at=now if finished else None,
                                         complete=finished and "failed" not in str(report), report=report)
    [card] = incident_card(user_in("operators", "otto"), timezone.now())
    assert (card["count"], card["hint"]) == (0, hint)
