"""Wrong codes at the factor page: the fifth in a row, in any of the person's sessions and under any
of their names, signs the session out and is audited; a factor given (a code, a sign-in) starts the
count again. A passkey given starts it again too: tests/browser/test_passkey.py, whose passkey is
Chromium's virtual authenticator's."""

import pytest
from django.core.cache import cache
from django.test import Client

from approvals.models import ReviewItem, ReviewStatus
from console.signin import STEP_UP_WRONG_CODES
from ledger.actions import action_request
from ledger.models import AuditEvent
from tests.factories import audit_events, make_agent
from tests.signin.conftest import enrol_totp, sign_in, totp

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("step_up")]
REAUTHENTICATE = "/accounts/2fa/reauthenticate/"
SIGNED_OUT = "You have been signed out"


def approval():
    action, _ = action_request(agent=make_agent("bot")[0], operation_key="refund:ORD-L1:full:dec-l1",
                               action_type="refund", target="ORD-L1", params={"amount": "750.00", "currency": "EUR"})
    return ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)


def wrong_code(secret):
    """A code none of the periods a check may take is: a wrong one for certain."""
    right = {totp(secret, step) for step in range(-1, 3)}
    return next(code for code in ("000000", "111111", "222222", "333333", "444444") if code not in right)


def wrong_codes(client, secret, count):
    """`count` wrong codes at the factor page; the answer to the last."""
    for _ in range(count):
        answer = client.post(REAUTHENTICATE, {"code": wrong_code(secret)})
    return answer


def signed_in(client):
    return "_auth_user_id" in client.session


def test_four_wrong_codes_then_the_right_one_decide_and_count_again_from_none(client, alice):
    item = approval()
    sign_in(client, "alice")
    secret = enrol_totp(client)
    decide = {"decision": "approve", "reason": "charged twice", "fingerprint": item.action.params_fingerprint()}
    asked = client.post(f"/review/{item.pk}/decide", decide)
    assert asked["Location"].startswith(REAUTHENTICATE)
    for _ in range(STEP_UP_WRONG_CODES - 1):
        assert client.post(asked["Location"], {"code": wrong_code(secret)}).status_code == 200
    assert signed_in(client)

    assert client.post(asked["Location"], {"code": totp(secret)}).status_code == 302
    item.refresh_from_db()
    assert item.status == ReviewStatus.APPROVED and audit_events(item, "approve").get().actor == "user:alice"
    # The right code started the count again: four more wrong ones sign nobody out.
    assert wrong_codes(client, secret, STEP_UP_WRONG_CODES - 1).status_code == 200
    assert signed_in(client) and not AuditEvent.objects.filter(verb="session_locked_out").exists()


def test_the_fifth_wrong_code_in_a_row_signs_the_session_out_and_is_audited(client, alice):
    item = approval()
    sign_in(client, "alice")
    secret = enrol_totp(client)
    decide = {"decision": "approve", "reason": "charged twice", "fingerprint": item.action.params_fingerprint()}
    asked = client.post(f"/review/{item.pk}/decide", decide)
    for _ in range(STEP_UP_WRONG_CODES - 1):
        client.post(asked["Location"], {"code": wrong_code(secret)})

    answer = client.post(asked["Location"], {"code": wrong_code(secret)})
    assert answer.status_code == 403 and SIGNED_OUT in answer.content.decode()
    assert f"{STEP_UP_WRONG_CODES} wrong codes in a row" in answer.content.decode()
    assert not signed_in(client) and client.get("/")["Location"].startswith("/accounts/login/")
    ended = AuditEvent.objects.get(verb="session_locked_out")
    assert (ended.actor, ended.object_id) == ("system:sign-in", str(alice.pk))
    assert AuditEvent.objects.filter(verb="second_factor_failed", after__step_up=True).count() == STEP_UP_WRONG_CODES
    assert not AuditEvent.objects.filter(verb="signed_out").exists()  # not as her own signing out
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN and not audit_events(item, "approve").exists()

    # Signing in again asks for the password and the factor, behind allauth's own limit on codes:
    # the five it counted (per person, at sign-in and at the factor page alike) refuse the right
    # one for five minutes, as the page says.
    assert sign_in(client, "alice")["Location"] == "/accounts/2fa/authenticate/"
    refused = client.post("/accounts/2fa/authenticate/", {"code": totp(secret)})
    assert "Too many failed login attempts" in refused.content.decode() and not signed_in(client)
    cache.clear()  # five minutes later: allauth's counts have expired
    assert client.post("/accounts/2fa/authenticate/", {"code": totp(secret)})["Location"] == "/"
    # The factor given at sign-in started the count again.
    assert wrong_codes(client, secret, STEP_UP_WRONG_CODES - 1).status_code == 200 and signed_in(client)


def test_wrong_codes_count_for_the_person_in_every_session(client, alice):
    """A thief holding two of alice's sessions gets five guesses between them, not five in each:
    the other session, still open after the first was signed out, starts with no fresh count and
    is signed out at its next wrong code."""
    sign_in(client, "alice")
    secret = enrol_totp(client)
    other = Client()
    sign_in(other, "alice")
    assert other.post("/accounts/2fa/authenticate/", {"code": totp(secret)})["Location"] == "/"

    wrong_codes(client, secret, 3)
    wrong_codes(other, secret, 1)
    assert signed_in(client) and signed_in(other)
    assert wrong_codes(client, secret, 1).status_code == 403 and not signed_in(client)

    cache.clear()  # allauth's own limit (five codes in five minutes per person) would refuse it unseen
    answer = wrong_codes(other, secret, 1)
    assert answer.status_code == 403 and SIGNED_OUT in answer.content.decode() and not signed_in(other)
    assert AuditEvent.objects.filter(verb="session_locked_out").count() == 2


def test_a_person_renamed_keeps_their_count(client, alice):
    """The count is the person's, not their name's: the audit trail names them by their username,
    which an admin may change between two of their wrong codes."""
    sign_in(client, "alice")
    secret = enrol_totp(client)
    wrong_codes(client, secret, STEP_UP_WRONG_CODES - 1)
    alice.username = "alice.martin"
    alice.save(update_fields=["username"])

    answer = wrong_codes(client, secret, 1)
    assert answer.status_code == 403 and SIGNED_OUT in answer.content.decode() and not signed_in(client)
    assert AuditEvent.objects.get(verb="session_locked_out").object_id == str(alice.pk)


def test_wrong_codes_at_sign_in_are_allauths_to_limit_not_counted_here(client, alice):
    """A code is asked at sign-in before any session exists: allauth's limit refuses the sixth."""
    sign_in(client, "alice")
    secret = enrol_totp(client)
    client.post("/accounts/logout/")
    sign_in(client, "alice")
    for _ in range(STEP_UP_WRONG_CODES):
        client.post("/accounts/2fa/authenticate/", {"code": wrong_code(secret)})
    cache.clear()
    assert client.post("/accounts/2fa/authenticate/", {"code": totp(secret)})["Location"] == "/"
    assert wrong_codes(client, secret, 1).status_code == 200 and signed_in(client)
