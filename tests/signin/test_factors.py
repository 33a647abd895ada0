"""The second factor (TOTP with a code computed here, as an authenticator app computes it), the
enrolment a deciding role is sent to, and failed sign-ins throttled; all of it in the audit log."""

import pytest
from allauth.mfa.models import Authenticator
from django.contrib.auth import get_user_model
from django.db import connection

from ledger.audit import actor_label
from ledger.models import AuditEvent
from tests.signin.conftest import enrol_totp, sign_in, someone, totp

pytestmark = pytest.mark.django_db


@pytest.fixture
def require_mfa(settings):
    settings.MFA_REQUIRED = True
    # One period either side, so a code is not refused as used when two steps of a test fall in
    # the same 30 s (allauth refuses a code used once).
    settings.MFA_TOTP_TOLERANCE = 1


def test_a_deciding_role_enrols_totp_and_then_signs_in_with_it(client, require_mfa):
    olga = someone("olga", "operators")
    assert sign_in(client, "olga").status_code == 302
    # Signed in with a password alone, she reaches no page before she has a second factor.
    assert client.get("/")["Location"] == "/accounts/2fa/"
    assert client.get("/dlq/", headers={"HX-Request": "true"})["HX-Redirect"] == "/accounts/2fa/"
    secret = enrol_totp(client)
    assert client.get("/").status_code == 200
    added = AuditEvent.objects.filter(verb="second_factor_added", actor="user:olga")
    assert sorted(e.after["type"] for e in added) == ["recovery_codes", "totp"]

    client.post("/accounts/logout/")
    answer = sign_in(client, "olga")
    assert answer["Location"] == "/accounts/2fa/authenticate/"
    assert client.get("/").status_code == 302  # not signed in until the code is given
    assert client.post("/accounts/2fa/authenticate/", {"code": "000000" if totp(secret) != "000000" else "111111"}
                       ).status_code == 200
    assert AuditEvent.objects.get(verb="second_factor_failed").after["type"] == "totp"
    assert client.post("/accounts/2fa/authenticate/", {"code": totp(secret)})["Location"] == "/"
    assert client.session["_auth_user_id"] == str(olga.pk)
    signed_in = AuditEvent.objects.filter(verb="signed_in").latest("id")
    assert [m["method"] for m in signed_in.after["methods"]] == ["password", "mfa"]
    assert signed_in.after["methods"][1]["type"] == "totp"


@pytest.mark.usefixtures("codes_checked_in_the_next_period")
def test_an_enrolment_checked_in_the_period_after_its_code_was_computed_is_confirmed(client, require_mfa):
    """An enrolment in the tests once answered its form again (200) instead of confirming: its
    code was the period before's, and a check that fell in the next period took it no longer."""
    someone("olga", "operators")
    sign_in(client, "olga")
    enrol_totp(client)
    assert Authenticator.objects.filter(user__username="olga", type=Authenticator.Type.TOTP).exists()


def test_removing_the_factor_asks_for_it_and_is_audited(client, require_mfa):
    someone("alice", "approvers")
    sign_in(client, "alice")
    secret = enrol_totp(client)
    # Once she has a factor, taking it away needs it again.
    answer = client.post("/accounts/2fa/totp/deactivate/")
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/2fa/reauthenticate/")
    client.post("/accounts/2fa/reauthenticate/", {"code": totp(secret, 1)})
    assert client.post("/accounts/2fa/totp/deactivate/").status_code == 302
    removed = AuditEvent.objects.filter(verb="second_factor_removed")
    assert sorted(e.after["type"] for e in removed) == ["recovery_codes", "totp"]


def test_an_auditor_needs_no_second_factor(client, require_mfa):
    someone("aldo", "auditors")
    sign_in(client, "aldo")
    assert client.get("/").status_code == 200


def test_failed_sign_ins_are_throttled_and_audited(client):
    someone("alice", "approvers")
    for _ in range(5):
        answer = sign_in(client, "alice", "guess")
        assert answer.status_code == 200 and b"not correct" in answer.content
    # The sixth try, with the right password, is refused all the same: five failures a name in 5 minutes.
    answer = sign_in(client, "alice")
    assert answer.status_code == 200 and b"Too many failed login attempts" in answer.content
    assert "_auth_user_id" not in client.session
    failed = AuditEvent.objects.filter(verb="sign_in_failed")
    assert failed.count() == 5 and {e.after["who"] for e in failed} == {"alice"}
    # Counted in the database, where every web process and host sees them, and no Redis is needed.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM console_cache")
        assert cursor.fetchone()[0] >= 1
    assert failed.first().object_id == str(get_user_model().objects.get(username="alice").pk)


def test_sessions_expire(client, settings):
    someone("alice", "approvers")
    sign_in(client, "alice")
    assert client.session.get_expire_at_browser_close()
    assert client.session.get_expiry_age() == settings.SESSION_COOKIE_AGE == 8 * 3600


def test_a_person_with_the_longest_username_django_allows_signs_in_and_is_audited(client):
    """`user:` and a 150-character username is 155 characters: the sign-in's audit event did
    not fit its column, and signing in answered 500. The label is cut, with a hash of the name."""
    name = "l" * 150
    person = someone(name, "operators")
    assert sign_in(client, name)["Location"] == "/"
    assert client.get("/").status_code == 200
    event = AuditEvent.objects.get(verb="signed_in")
    assert event.actor == actor_label(person) and len(event.actor) == 150
    assert event.actor.startswith("user:" + "l" * 128 + "~")


def test_a_deactivated_persons_right_password_is_answered_as_a_wrong_one(client):
    """allauth sent the right password of a deactivated person to "This account is inactive", and
    uncounted: a guesser learned the name was a person's and the password right. It is refused as a
    wrong one is, and counts towards the limit."""
    alice = someone("alice", "approvers")
    alice.is_active = False
    alice.save()
    wrong = sign_in(client, "alice", "guess")
    right = sign_in(client, "alice")
    assert right.status_code == wrong.status_code == 200
    assert b"not correct" in right.content and b"inactive" not in right.content.lower()
    assert "_auth_user_id" not in client.session
    for _ in range(3):
        sign_in(client, "alice")
    assert b"Too many failed login attempts" in sign_in(client, "alice", "guess").content
