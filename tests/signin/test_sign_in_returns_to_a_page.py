"""Signing in again, once a session ended, leads to a page a GET opens. A form posted from a page
that was itself a POST's answer (a bulk discard's confirmation, a bulk redrive's start refused) names
an address only a POST opens as its page: signing in sent the person there with a GET, a 405."""

import re

import pytest
from allauth.account.authentication import AUTHENTICATION_METHODS_SESSION_KEY
from django.conf import settings
from guardian.shortcuts import assign_perm

from dlq.models import BulkRedrive, DeadLetter, EntryStatus
from ledger.access import WORK_DLQ
from ledger.models import ActionStatus, AuditEvent, Capability
from tests.factories import audit_events, make_action, make_agent
from tests.signin.conftest import FORM, HIDDEN, PASSWORD, sign_in, someone

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def olga(client):
    """An operator, signed in with her password, who may work refunds' dead letters."""
    user = someone("olga", "operators")
    agent = make_agent("billing", grants=("refund",))[0]
    assign_perm(f"ledger.{WORK_DLQ}", user, Capability.objects.get(kind="action_type", name="refund"))
    assert sign_in(client, "olga").status_code == 302
    return agent


def failed_refund_entry(agent, n):
    """A standalone refund out of attempts, with its open entry."""
    action = make_action(agent, ActionStatus.FAILED, key=f"refund:ORD-SI-{n}:full:dec-{n}", target=f"ORD-SI-{n}",
                         customer=f"CUST-SI-{n}", attempts=3,
                         error={"code": "provider_unavailable", "message": "down on attempt 3", "retryable": True})
    return DeadLetter.objects.open_for_action(action, actor="system:tests")


def session_ends(client):
    """The session was signed in SESSION_COOKIE_AGE ago: its next request finds it ended."""
    session = client.session
    session[AUTHENTICATION_METHODS_SESSION_KEY] = [
        {**record, "at": record["at"] - settings.SESSION_COOKIE_AGE - 1}
        for record in session[AUTHENTICATION_METHODS_SESSION_KEY]]
    session.save()


def sign_in_again_after_posting(client, address, form, page):
    """The form on `page` posted to `address` once the session ended: where signing in leads."""
    answer = client.post(address, form, headers={"Referer": f"http://testserver{page}"})
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/?next="), answer
    assert AuditEvent.objects.filter(verb="session_expired").exists()
    signed_in = client.post(answer["Location"], {"login": "olga", "password": PASSWORD})
    assert signed_in.status_code == 302
    return signed_in["Location"]


def test_a_bulk_discard_confirmed_after_the_session_ended_signs_in_to_the_queue(client, olga):
    entries = [failed_refund_entry(olga, n) for n in range(2)]
    confirmation = client.post("/dlq/bulk", {"op": "discard", "status": "open"})
    assert confirmation.status_code == 200
    action, fields = next((action, body) for action, body in FORM.findall(confirmation.content.decode())
                          if 'id="bulk-confirm"' in body)
    form = {}
    for name, value in HIDDEN.findall(fields):
        form.setdefault(name, []).append(value)
    assert form["confirm_count"] == ["2"]
    session_ends(client)

    lands_on = sign_in_again_after_posting(client, action, {**form, "reason": "duplicates"}, page="/dlq/bulk")
    assert lands_on == "/dlq/"
    assert client.get(lands_on).status_code == 200
    assert set(DeadLetter.objects.filter(pk__in=[e.pk for e in entries]).values_list("status", flat=True)) == {
        EntryStatus.OPEN}
    assert not AuditEvent.objects.filter(verb="discarded").exists()


def test_a_bulk_redrive_started_again_after_the_session_ended_signs_in_to_its_page(client, olga):
    failed_refund_entry(olga, 1)
    planned = client.post("/dlq/bulk", {"op": "redrive"})
    run = BulkRedrive.objects.get(pk=re.search(r"/dlq/redrives/(\d+)/", planned["Location"])[1])
    failed_refund_entry(olga, 2)  # the queue moved since the dry run
    start = f"/dlq/redrives/{run.pk}/start"
    refused = client.post(start, {"rate": "30", "reason": "the provider is back"})
    assert refused.status_code == 409 and 'id="start-form"' in refused.content.decode()
    session_ends(client)

    lands_on = sign_in_again_after_posting(client, start, {"rate": "30", "reason": "the provider is back"},
                                           page=start)
    assert lands_on == f"/dlq/redrives/{run.pk}/"
    assert client.get(lands_on).status_code == 200
    run.refresh_from_db()
    assert run.status == "planned" and run.started_by is None
    assert not audit_events(run).exists()
