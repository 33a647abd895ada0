"""What a session alone cannot do: outlive its sign-in, change who it signs in as, or swap its
person's second factor through the admin site and then decide."""

import time
from datetime import timedelta
from decimal import Decimal

import pytest
from allauth.account.internal.flows.login import AUTHENTICATION_METHODS_SESSION_KEY
from allauth.mfa.models import Authenticator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.sessions.backends.db import SessionStore
from django.core.management import call_command
from django.db import OperationalError
from django.test import override_settings
from django.utils import timezone

from approvals.models import Limit, ReviewItem, ReviewStatus
from ledger.actions import action_request
from ledger.models import AuditEvent
from tests.factories import make_agent
from tests.signin.conftest import PASSWORD, enrol_totp, sign_in, someone, totp

REAUTHENTICATE = "/accounts/2fa/reauthenticate/"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis", "step_up")
def test_a_session_without_its_factor_cannot_swap_it_through_the_admin_and_decide(client, settings):
    """The admin site keeps people's factors: deleting one there asked for nothing, and a person
    with no factor left enrols one without being asked for the old one. Every admin change now asks
    for a fresh factor, as a decision does."""
    settings.MFA_REQUIRED = True
    call_command("setup_roles", verbosity=0)
    root = get_user_model().objects.create_superuser("root", "root@surety.example", PASSWORD)
    Limit.limit_set(actor="system:tests", reason="policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=None)
    action, _ = action_request(agent=make_agent("bot-x")[0], operation_key="refund:ORD-X:full:dec-x",
                               action_type="refund", target="ORD-X", params={"amount": "750.00", "currency": "EUR"})
    item = ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)
    sign_in(client, "root")
    enrol_totp(client)
    own = Authenticator.objects.get(user=root, type=Authenticator.Type.TOTP)

    deleted = client.post(f"/admin/mfa/authenticator/{own.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302 and deleted["Location"].startswith(REAUTHENTICATE)
    assert Authenticator.objects.filter(pk=own.pk).exists()
    assert client.get("/admin/")["Location"].startswith(REAUTHENTICATE)  # its pages too
    decide = {"decision": "approve", "reason": "x", "fingerprint": action.params_fingerprint()}
    assert client.post(f"/review/{item.pk}/decide", decide)["Location"].startswith(REAUTHENTICATE)
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN
    # Signing out of the admin asks for nothing.
    assert client.post("/admin/logout/")["Location"].startswith("/accounts/login/")
    assert client.get("/")["Location"].startswith("/accounts/login/")


@pytest.mark.django_db
def test_a_session_ends_eight_hours_after_sign_in_however_often_it_stepped_up(client, settings, monkeypatch):
    """Django's session store moved the session's end 8 hours on at every save, and a step-up
    saves it: stepping up every few hours kept a person signed in for good."""
    settings.MFA_TOTP_TOLERANCE = 1
    someone("alice", "approvers")
    sign_in(client, "alice")
    secret = enrol_totp(client)
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=7))
    assert client.post(REAUTHENTICATE, {"code": totp(secret, 1)}).status_code == 302
    assert client.get("/").status_code == 200

    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=8, seconds=1))
    answer = client.get("/")
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")
    # Audited as the session's end, not as the person's signing out.
    assert AuditEvent.objects.filter(verb="session_expired", actor="system:sign-in").count() == 1
    assert not AuditEvent.objects.filter(verb="signed_out").exists()


@pytest.mark.django_db
def test_a_person_cannot_change_the_address_they_sign_in_as(client):
    """The address is who the company's provider signs a person in as, and where a password reset
    goes: allauth's page for adding and choosing one's own addresses let a session set any."""
    someone("aldo", "auditors")
    sign_in(client, "aldo")
    assert client.get("/accounts/email/").status_code == 404
    client.post("/accounts/email/", {"email": "ada@company.example", "action_add": ""})
    client.post("/accounts/email/", {"email": "ada@company.example", "action_primary": ""})
    assert get_user_model().objects.get(username="aldo").email == "aldo@surety.example"


@pytest.mark.django_db
@pytest.mark.usefixtures("step_up")
def test_an_admin_change_asked_without_a_fresh_factor_goes_back_to_its_page_once_it_is_given(client):
    """Replayed from the factor page, an admin change answered with a page (here "delete selected"'s
    confirmation) was served at the factor page's address, and its form posted there: the change
    was never made. Now the person is sent back to the page, and the change goes through."""
    get_user_model().objects.create_superuser("root", "root@surety.example", PASSWORD)
    sign_in(client, "root")
    secret = enrol_totp(client)
    group = Group.objects.create(name="scratch")
    chosen = {"action": "delete_selected", "_selected_action": [group.pk]}
    with override_settings(STEP_UP_SECONDS=0.001):  # the factor given at enrolment has gone stale
        time.sleep(0.01)
        asked = client.post("/admin/auth/group/", chosen)
    assert asked["Location"] == f"{REAUTHENTICATE}?next=%2Fadmin%2Fauth%2Fgroup%2F"
    back = client.post(asked["Location"], {"code": totp(secret, 1)})
    assert back.status_code == 302 and back["Location"] == "/admin/auth/group/"
    confirm = client.post("/admin/auth/group/", chosen)
    assert confirm.status_code == 200 and "Are you sure" in confirm.content.decode()
    client.post("/admin/auth/group/", {**chosen, "post": "yes"})
    assert not Group.objects.filter(pk=group.pk).exists()


@pytest.mark.django_db
def test_a_session_past_its_lifetime_whose_first_read_fails_is_not_served_by_the_next(client, settings, monkeypatch):
    """The check met the database out of reach and let the request on: the view read the session
    again, which then answered, and served a session past its lifetime. It answers the outage."""
    settings.MFA_TOTP_TOLERANCE = 1
    someone("alice", "approvers")
    sign_in(client, "alice")
    enrol_totp(client)
    real_now, read = timezone.now, SessionStore._get_session_from_db
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=8, seconds=1))
    reads = []

    def fails_once(store):
        reads.append(1)
        if len(reads) == 1:
            raise OperationalError("the database dropped the connection")
        return read(store)

    monkeypatch.setattr(SessionStore, "_get_session_from_db", fails_once)
    client.raise_request_exception = False  # answered as a server answers it (config.urls.handler500)
    answer = client.get("/", headers={"Accept": "text/html"})
    assert answer.status_code == 503 and len(reads) == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("step_up")
def test_a_session_ends_once_a_factor_it_gave_is_removed(client, settings):
    """alice's phone was stolen, with her password: the thief's session signed in with its code.
    An admin removed the factor, and the session went on: it counted the removed factor as a fresh
    step-up, and, left with no factor, enrolled one of its own unasked and decided with it. Now it
    ends, audited as revoked; a session that gave another factor is not touched."""
    settings.MFA_REQUIRED = True
    alice = someone("alice", "approvers")
    sign_in(client, "alice")
    secret = enrol_totp(client)
    client.post("/accounts/logout/")
    sign_in(client, "alice")
    assert client.post("/accounts/2fa/authenticate/", {"code": totp(secret, 1)})["Location"] == "/"
    assert client.get("/").status_code == 200

    Authenticator.objects.filter(user=alice).delete()  # the admin site's delete, as its audit shows

    answer = client.get("/accounts/2fa/totp/activate/")
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")
    assert "_auth_user_id" not in client.session
    revoked = AuditEvent.objects.get(verb="session_revoked")
    assert revoked.actor == "system:sign-in" and revoked.object_id == str(alice.pk)
    assert AuditEvent.objects.filter(verb="signed_out").count() == 1  # her own, before the second sign-in


# Transactional: allauth tells of a factor enrolled once its transaction has committed.
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("step_up")
def test_a_session_ends_once_a_factor_it_enrolled_is_removed(client, settings):
    """alice's password was stolen before she had a factor: the thief's session enrolled its own
    authenticator app. An admin removed it, and the session went on: with no factor left, it was
    asked for nothing, enrolled another, stepped up with it and decided. Now it ends, audited as
    revoked. Enrolling is not a factor given: a decision right after it still asks for one."""
    settings.MFA_REQUIRED = True
    alice = someone("alice", "approvers")
    sign_in(client, "alice")
    enrol_totp(client)
    given = client.session[AUTHENTICATION_METHODS_SESSION_KEY]
    assert [record["method"] for record in given] == ["password"]
    assert client.get("/").status_code == 200

    Authenticator.objects.filter(user=alice, type=Authenticator.Type.TOTP).delete()  # the admin site's delete

    answer = client.get("/accounts/2fa/totp/activate/")
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")
    assert "_auth_user_id" not in client.session
    revoked = AuditEvent.objects.get(verb="session_revoked")
    assert revoked.actor == "system:sign-in" and revoked.object_id == str(alice.pk)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("step_up", "codes_checked_in_the_next_period")
def test_a_session_that_enrolled_a_factor_stays_signed_in_as_it_makes_new_codes_and_removes_it(client, settings):
    """The recovery codes made again, and the factor removed by the session that enrolled it
    (asked for it first), end nothing."""
    settings.MFA_REQUIRED = True
    someone("alice", "approvers")
    sign_in(client, "alice")
    secret = enrol_totp(client)
    asked = client.post("/accounts/2fa/recovery-codes/generate/")
    assert asked["Location"].startswith(REAUTHENTICATE)
    client.post(asked["Location"], {"code": totp(secret, 1)})
    assert client.post("/accounts/2fa/recovery-codes/generate/").status_code == 302
    assert AuditEvent.objects.filter(verb="second_factor_reset").exists()
    assert client.get("/").status_code == 200
    assert client.post("/accounts/2fa/totp/deactivate/").status_code == 302
    assert not Authenticator.objects.filter(type=Authenticator.Type.TOTP).exists()
    assert client.get("/")["Location"] == "/accounts/2fa/"
    assert "_auth_user_id" in client.session and not AuditEvent.objects.filter(verb="session_revoked").exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("step_up", "codes_checked_in_the_next_period")
def test_a_person_who_removes_their_own_factor_stays_signed_in_in_that_session(client, settings):
    """Their other sessions that gave it end; the one that removed it, after giving a factor for it,
    goes on (and, in a deciding role with none left, is sent to enrol one). Its two codes are the
    current period's, then the next's: the period before's, given second, was refused when checked
    in the period after it was computed, and the factor stayed."""
    settings.MFA_REQUIRED = True
    someone("alice", "approvers")
    sign_in(client, "alice")
    secret = enrol_totp(client)
    client.post("/accounts/logout/")
    sign_in(client, "alice")
    assert client.post("/accounts/2fa/authenticate/", {"code": totp(secret)})["Location"] == "/"
    asked = client.post("/accounts/2fa/totp/deactivate/")
    assert asked["Location"].startswith(REAUTHENTICATE)
    client.post(asked["Location"], {"code": totp(secret, 1)})
    assert not Authenticator.objects.filter(type=Authenticator.Type.TOTP).exists()
    assert client.get("/")["Location"] == "/accounts/2fa/"
    assert "_auth_user_id" in client.session and not AuditEvent.objects.filter(verb="session_revoked").exists()
