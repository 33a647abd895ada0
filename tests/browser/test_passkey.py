"""A passkey, with Chromium's virtual authenticator (over CDP): enrolled, asked for when a money
decision needs a step-up, and used to sign in. The stack here requires the second factor and
step-up, as production does, and is reached as localhost: WebAuthn refuses an IP address as the
relying party's id."""

import pytest
from allauth.mfa.models import Authenticator

from approvals.models import ReviewItem, ReviewStatus
from ledger.models import AuditEvent
from tests.browser.conftest import PASSWORD, request_refund
from tests.conftest import running_server
from tests.factories import audit_events

pytestmark = pytest.mark.browser
KEY = "refund:ORD-7301:full:dec-7301"


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


def test_a_passkey_is_enrolled_asked_for_before_an_approval_and_signs_in(stack, page, people, api, limit, shot):
    request_refund(api, KEY, "ORD-7301", "750.00", "CUST-7301")
    item = ReviewItem.objects.get(action__operation_key=KEY, status=ReviewStatus.OPEN)
    credentials = virtual_authenticator(page)

    # Signed in with a password alone, an approver must enrol a second factor before any page.
    sign_in_with_password(page, "alice")
    page.goto("/approvals/")
    assert page.url.endswith("/accounts/2fa/")
    page.goto("/accounts/2fa/webauthn/add/")
    page.fill("#id_name", "laptop")
    shot(page, "passkey-add")
    with page.expect_navigation():
        page.locator("#mfa_webauthn_add").click()
    alice = people["alice"]
    assert Authenticator.objects.filter(user=alice, type=Authenticator.Type.WEBAUTHN).count() == 1
    assert len(credentials()) == 1  # the key pair lives in the authenticator; the server has its public half
    added = AuditEvent.objects.filter(verb="second_factor_added", actor="user:alice")
    assert {e.after["type"] for e in added} == {"webauthn", "recovery_codes"}

    # Approving asks for the passkey on the spot; until it is given, nothing is decided.
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
