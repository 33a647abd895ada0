"""A passkey's answer is the browser's JSON, and a client can post any: one allauth cannot parse is
a wrong passkey (the page again, with its error, or the way back), never a 500. allauth catches
some of fido2's errors in parsing, not a missing field (KeyError), nor, when a passkey is added,
an id that is not its rawId or client data that is not JSON (ValueError)."""

import hashlib
import json
import os

import pytest
from allauth.mfa.webauthn.internal.auth import WebAuthn
from cryptography.hazmat.primitives.asymmetric import ec
from fido2.cose import ES256
from fido2.utils import websafe_encode
from fido2.webauthn import (Aaguid, AttestationObject, AttestedCredentialData, AuthenticatorData,
                            CollectedClientData)

from tests.signin.conftest import enrol_totp, sign_in, someone

pytestmark = pytest.mark.django_db

# fido2 reads these as the browser would send them: base64url, the client data a JSON object.
NOT_JSON = "bm90IGpzb24"  # "not json"
EMPTY_MAP = "oA"  # CBOR's {}
MALFORMED = [
    {"id": "AA"},
    {"id": "AA", "rawId": "AQ", "type": "public-key", "response": {
        "clientDataJSON": "e30", "attestationObject": EMPTY_MAP, "authenticatorData": "AA", "signature": "AA"}},
    {"id": "AA", "rawId": "AA", "type": "public-key", "response": {
        "clientDataJSON": NOT_JSON, "attestationObject": EMPTY_MAP, "authenticatorData": "AA", "signature": "AA"}},
]


@pytest.fixture
def require_mfa(settings):
    settings.MFA_REQUIRED = True
    settings.MFA_TOTP_TOLERANCE = 1  # enrol_totp's code is taken in the period after the one it was computed in too


def a_passkey(user):
    """A passkey of the person's, kept as allauth keeps one it enrolled: a real key pair's public key,
    attested with "none". Made here, not through the enrolment page, which only a browser's
    authenticator answers (tests/browser/test_passkey.py enrols one there)."""
    credential_id = os.urandom(16)
    public_key = ES256.from_cryptography_key(ec.generate_private_key(ec.SECP256R1()).public_key())
    auth_data = AuthenticatorData.create(
        hashlib.sha256(b"testserver").digest(), AuthenticatorData.FLAG.UP | AuthenticatorData.FLAG.AT, 0,
        AttestedCredentialData.create(Aaguid.NONE, credential_id, public_key))
    client_data = CollectedClientData.create(CollectedClientData.TYPE.CREATE, os.urandom(16), "http://testserver")
    WebAuthn.add(user, "key", {
        "id": websafe_encode(credential_id), "rawId": websafe_encode(credential_id), "type": "public-key",
        "response": {"clientDataJSON": websafe_encode(client_data),
                     "attestationObject": websafe_encode(AttestationObject.create("none", auth_data, {}))},
        "clientExtensionResults": {}})


def refused(answer):
    """A 500 raises here (the test client's default); what came back refused the passkey."""
    return answer.status_code in (200, 302, 400)


@pytest.mark.parametrize("credential", MALFORMED)
def test_a_malformed_passkey_at_sign_in_is_a_wrong_one(client, require_mfa, credential):
    someone("alice", "approvers")
    sign_in(client, "alice")
    enrol_totp(client)
    client.logout()
    sign_in(client, "alice")
    client.get("/accounts/2fa/authenticate/")
    answer = client.post("/accounts/2fa/authenticate/", {"credential": json.dumps(credential)})
    assert refused(answer) and "_auth_user_id" not in client.session


@pytest.mark.parametrize("credential", MALFORMED)
def test_a_malformed_passkey_given_to_confirm_is_a_wrong_one(client, require_mfa, credential):
    alice = someone("alice", "approvers")
    sign_in(client, "alice")
    enrol_totp(client)
    a_passkey(alice)
    assert client.get("/accounts/2fa/webauthn/reauthenticate/").status_code == 200
    answer = client.post("/accounts/2fa/webauthn/reauthenticate/", {"credential": json.dumps(credential)})
    assert refused(answer)


@pytest.mark.parametrize("credential", MALFORMED)
def test_a_malformed_passkey_enrolled_is_refused(client, require_mfa, credential):
    someone("alice", "approvers")
    sign_in(client, "alice")
    client.get("/accounts/2fa/webauthn/add/")
    answer = client.post("/accounts/2fa/webauthn/add/", {"name": "key", "credential": json.dumps(credential)})
    assert refused(answer) and not client.get("/accounts/2fa/").context["authenticators"]
