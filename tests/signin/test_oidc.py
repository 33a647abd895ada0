"""Sign-in through the company's OpenID Connect provider, a real one (oidc-provider, in node): the
person it vouches for signs in; nobody else does, and a callback replayed or forged is refused."""

from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from ledger.models import AuditEvent
from tests.signin.conftest import at_provider, back_from_provider, start_sign_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def ada(db):
    """The person ada of the company is here: an admin made her, with her role."""
    return get_user_model().objects.create_user(username="ada", email="ada@company.example")


def signed_in_as(client):
    return client.session.get("_auth_user_id")


def test_the_person_the_provider_vouches_for_signs_in(oidc, ada, client):
    callback = at_provider(start_sign_in(client), "ada")
    answer = back_from_provider(client, callback)
    assert answer.status_code == 302 and answer["Location"] == "/"
    assert signed_in_as(client) == str(ada.pk)
    event = AuditEvent.objects.get(verb="signed_in")
    assert event.actor == "user:ada"
    assert event.after["methods"] == [{"method": "socialaccount", "provider": "company"}]
    # The sign-in page offers the provider by the name it is configured with.
    assert b"Sign in with Company SSO" in Client().get("/accounts/login/").content


def test_a_person_nobody_here_knows_is_refused_and_nobody_is_created(oidc, ada, client):
    people = get_user_model().objects.count()
    answer = back_from_provider(client, at_provider(start_sign_in(client), "mallory"))
    assert answer.status_code == 403 and b"You may not sign in here" in answer.content
    assert signed_in_as(client) is None and get_user_model().objects.count() == people
    refused = AuditEvent.objects.get(verb="sign_in_failed")
    assert refused.after["why"] == "not_allowed" and refused.after["who"] == "mallory@company.example"


def test_an_address_the_provider_did_not_verify_is_refused(oidc, ada, client):
    answer = back_from_provider(client, at_provider(start_sign_in(client), "eve"))
    assert answer.status_code == 403 and signed_in_as(client) is None
    assert AuditEvent.objects.get(verb="sign_in_failed").after["email_verified"] is False


def test_a_replayed_callback_is_refused(oidc, ada, client):
    callback = at_provider(start_sign_in(client), "ada")
    assert back_from_provider(client, callback).status_code == 302 and signed_in_as(client) == str(ada.pk)
    # Someone who saw the callback's address (a proxy's log, the browser's history) uses it again:
    # in another browser, and in the same one after signing out. Its state was used up.
    for replayer in (Client(), client):
        if replayer is client:
            client.post("/accounts/logout/")
        answer = back_from_provider(replayer, callback)
        assert answer.status_code == 401 and b"Third-Party Login Failure" in answer.content
        assert signed_in_as(replayer) is None
    assert AuditEvent.objects.filter(verb="signed_in").count() == 1
    refused = AuditEvent.objects.filter(verb="sign_in_failed")
    assert [(e.after["provider"], e.after["why"]) for e in refused] == [("company", "unknown")] * 2


def test_a_callback_with_a_forged_state_or_code_is_refused(oidc, ada, client):
    callback = at_provider(start_sign_in(client), "ada")
    parts = urlsplit(callback)
    query = dict(parse_qsl(parts.query))
    for forged in ({**query, "state": "forged-state"}, {**query, "code": "forged-code"}):
        answer = client.get(f"{parts.path}?{urlencode(forged)}")
        assert answer.status_code == 401 and signed_in_as(client) is None
    assert not AuditEvent.objects.filter(verb="signed_in").exists()
    assert AuditEvent.objects.filter(verb="sign_in_failed").count() == 2
    # The forged code used up the state it came with: the real callback of that sign-in is spent too.
    assert back_from_provider(client, callback).status_code == 401 and signed_in_as(client) is None


def test_a_person_who_signs_in_through_the_provider_cannot_set_a_password_here(oidc, ada, client):
    """allauth's page for setting a password where there is none took one from any session of a
    person who signs in through the provider, asking nothing: a way in past the company's provider."""
    back_from_provider(client, at_provider(start_sign_in(client), "ada"))
    assert signed_in_as(client) == str(ada.pk)
    assert client.get("/accounts/password/set/").status_code == 404
    client.post("/accounts/password/set/", {"password1": "a-password-of-my-own", "password2": "a-password-of-my-own"})
    assert not get_user_model().objects.get(pk=ada.pk).has_usable_password()
