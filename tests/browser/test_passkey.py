"""A passkey, with Chromium's virtual authenticator (over CDP): enrolled, asked for when a money
decision needs a step-up, used to sign in, and given after wrong codes, which starts their count
again. The stack here requires the second factor and step-up, as production does, and is reached
as localhost: WebAuthn refuses an IP address as the relying party's id."""

import pytest
from allauth.mfa.models import Authenticator

from approvals.models import ReviewItem, ReviewStatus
from console.signin import STEP_UP_WRONG_CODES
from ledger.models import AuditEvent
from tests.browser.conftest import PASSWORD, request_refund
from tests.conftest import running_server
from tests.factories import audit_events

pytestmark = pytest.mark.browser
KEY = "refund:ORD-7301:full:dec-7301"
# Six digits: never one of the recovery codes a passkey's enrolment makes (eight digits each).
WRONG_CODE = "000000"
SIGNED_OUT = "You have been signed out"


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with running_server(django_db_blocker, MFA_REQUIRED="true", STEP_UP_SECONDS="300") as stack:
        stack.url = stack.url.replace("127.0.0.1", "localhost")
        yield stack


def virtual_authenticator(page):
    """A platform authenticator that keeps resident keys and verifies its user (a fingerprint
    reader that always says yes); returns what reads the credentials it holds."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    added = cdp.send("WebAuthn.addVirtualAuthenticator", {"options": {
        "protocol": "ctap2", "transport": "internal", "hasResidentKey": True,
        "hasUserVerification": True, "isUserVerified": True, "automaticPresenceSimulation": True}})
    return lambda: cdp.send("WebAuthn.getCredentials", {"authenticatorId": added["authenticatorId"]})["credentials"]


def sign_in_with_password(page, username):
    page.goto("/accounts/login/")
    page.fill("#id_login", username)
    page.fill("#id_password", PASSWORD)
    with page.expect_navigation():
        page.locator("#id_password").press("Enter")


def enrol_passkey(page, shot):
    """Signed in with a password alone, an approver must enrol a second factor before any page."""
    page.goto("/approvals/")
    assert page.url.endswith("/accounts/2fa/")
    page.goto("/accounts/2fa/webauthn/add/")
    page.fill("#id_name", "laptop")
    shot(page, "passkey-add")
    with page.expect_navigation():
        page.locator("#mfa_webauthn_add").click()


def approve_asking_for_the_passkey(page, item, shot):
    """Approving asks for the passkey on the spot; until it is given, nothing is decided."""
    page.goto(f"/review/{item.pk}/")
    page.locator("#reason").fill("the customer was charged twice")
    with page.expect_navigation():
        page.locator("#decision-form button[name=decision][value=approve]").click()
    assert "/accounts/2fa/webauthn/reauthenticate/" in page.url
    shot(page, "step-up")
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN and not audit_events(item, "approve").exists()
    with page.expect_navigation():
        page.locator("#mfa_webauthn_reauthenticate").click()
    item.refresh_from_db()
    assert item.status == ReviewStatus.APPROVED


def wrong_codes(page, count):
    """`count` wrong codes in a row at the factor page (a recovery code's, the person's one kind of
    code here): the page as the last one left it."""
    page.goto("/accounts/2fa/reauthenticate/")
    for _ in range(count):
        page.fill("#id_code", WRONG_CODE)
        with page.expect_navigation():
            page.locator("#id_code").press("Enter")
    return page


def test_a_passkey_is_enrolled_asked_for_before_an_approval_and_signs_in(stack, page, people, api, limit, shot):
    request_refund(api, KEY, "ORD-7301", "750.00", "CUST-7301")
    item = ReviewItem.objects.get(action__operation_key=KEY, status=ReviewStatus.OPEN)
    credentials = virtual_authenticator(page)

    sign_in_with_password(page, "alice")
    enrol_passkey(page, shot)
    alice = people["alice"]
    assert Authenticator.objects.filter(user=alice, type=Authenticator.Type.WEBAUTHN).count() == 1
    assert len(credentials()) == 1  # the key pair lives in the authenticator; the server has its public half
    added = AuditEvent.objects.filter(verb="second_factor_added", actor="user:alice")
    assert {e.after["type"] for e in added} == {"webauthn", "recovery_codes"}

    approve_asking_for_the_passkey(page, item, shot)
    event = audit_events(item, "approve").get()
    assert event.reason == "the customer was charged twice"
    assert event.after["step_up"]["method"] == "webauthn"

    # Signing in again: the password, then the passkey.
    with page.expect_navigation():
        page.locator("form[action='/accounts/logout/'] button").click()
    sign_in_with_password(page, "alice")
    assert page.url.endswith("/accounts/2fa/authenticate/")
    with page.expect_navigation():
        page.locator("#mfa_webauthn_authenticate").click()
    assert page.url.endswith("/")
    signed_in = AuditEvent.objects.filter(verb="signed_in", actor="user:alice").latest("id")
    assert [(m["method"], m.get("type")) for m in signed_in.after["methods"]] == [("password", None), ("mfa", "webauthn")]
    assert not page.console_errors, page.console_errors


def test_a_passkey_given_starts_the_wrong_codes_count_again_and_five_in_a_row_still_sign_out(
        stack, page, people, api, limit, shot):
    request_refund(api, KEY, "ORD-7301", "750.00", "CUST-7301")
    item = ReviewItem.objects.get(action__operation_key=KEY, status=ReviewStatus.OPEN)
    virtual_authenticator(page)
    sign_in_with_password(page, "alice")
    enrol_passkey(page, shot)

    wrong_codes(page, STEP_UP_WRONG_CODES - 1)
    assert "Incorrect code" in page.content() and SIGNED_OUT not in page.content()
    approve_asking_for_the_passkey(page, item, shot)
    assert audit_events(item, "approve").get().after["step_up"]["method"] == "webauthn"

    # The passkey started the count again: as many wrong codes again sign nobody out, where the
    # count from before it would have ended the session at the first.
    wrong_codes(page, STEP_UP_WRONG_CODES - 1)
    assert "Incorrect code" in page.content() and SIGNED_OUT not in page.content()
    assert not AuditEvent.objects.filter(verb="session_locked_out").exists()

    # The fifth in a row since the passkey signs the session out.
    assert wrong_codes(page, 1).locator("#locked-out-title").inner_text() == SIGNED_OUT
    assert AuditEvent.objects.filter(verb="session_locked_out", object_id=str(people["alice"].pk)).count() == 1
    page.goto("/approvals/")
    assert "/accounts/login/" in page.url
    # The lockout's own answer is a 403 (which the browser reports too); nothing else failed.
    assert all("403" in error and "/accounts/2fa/reauthenticate/" in error for error in page.console_errors), \
        page.console_errors
