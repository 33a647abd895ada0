"""The admin's own sign-in page is the product's: Django's form at /admin/login/ signed a staff
person in with a password alone, past their second factor, past the failed-attempt limit and
where PASSWORD_SIGN_IN is off. It sends people to the sign-in pages instead."""

import pytest
from django.contrib.auth import get_user_model

from tests.signin.conftest import PASSWORD, enrol_totp, sign_in, totp

pytestmark = pytest.mark.django_db

ADMIN_LOGIN = "/admin/login/?next=/admin/"


@pytest.fixture
def root():
    return get_user_model().objects.create_superuser("root", "root@surety.example", PASSWORD)


def signed_in(client):
    return "_auth_user_id" in client.session


def test_the_admins_sign_in_page_sends_people_to_the_products(client, root):
    answer = client.get(ADMIN_LOGIN)
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")


def test_a_password_posted_to_the_admins_sign_in_page_skips_no_second_factor(client, root, settings):
    settings.MFA_REQUIRED = True
    settings.MFA_TOTP_TOLERANCE = 1  # enrol_totp's code is taken in the period after the one it was computed in too
    sign_in(client, "root")
    enrol_totp(client)
    client.logout()

    client.post(ADMIN_LOGIN, {"username": "root", "password": PASSWORD})

    assert not signed_in(client)
    assert sign_in(client, "root")["Location"].startswith("/accounts/2fa/authenticate/")  # the product's way in


def test_the_admins_sign_in_page_takes_no_password_where_password_sign_in_is_off(client, root, settings):
    settings.SOCIALACCOUNT_ONLY = True  # PASSWORD_SIGN_IN=false
    client.post(ADMIN_LOGIN, {"username": "root", "password": PASSWORD})
    assert not signed_in(client)


def test_the_admins_sign_in_page_guesses_no_passwords_past_the_limit(client, root):
    for _ in range(8):
        client.post(ADMIN_LOGIN, {"username": "root", "password": "wrong"})
    client.post(ADMIN_LOGIN, {"username": "root", "password": PASSWORD})
    assert not signed_in(client)


def test_a_signed_in_staff_session_cannot_become_another_persons_with_a_password(client, root, settings):
    """Django's admin sign-in form took a password from a session already signed in: staff member A,
    signed in with A's second factor, posted B's name and password there and the session became B's,
    past B's second factor and past the failed-attempt limit (unlimited guesses of B's password)."""
    settings.MFA_TOTP_TOLERANCE = 1  # enrol_totp's code is taken in the period after the one it was computed in too
    b = get_user_model().objects.create_superuser("bea", "bea@surety.example", PASSWORD)
    sign_in(client, "bea")
    enrol_totp(client)
    client.logout()
    sign_in(client, "root")
    secret = enrol_totp(client)
    client.logout()
    sign_in(client, "root")
    assert client.post("/accounts/2fa/authenticate/", {"code": totp(secret)}).status_code == 302
    assert client.session["_auth_user_id"] == str(root.pk)

    answer = client.post(ADMIN_LOGIN, {"username": "bea", "password": PASSWORD})

    assert client.session["_auth_user_id"] == str(root.pk) != str(b.pk)
    assert answer.status_code == 302 and answer["Location"] == "/admin/"


def test_the_admins_sign_in_page_refuses_a_signed_in_person_who_is_not_staff(client, root):
    get_user_model().objects.create_user("aldo", "aldo@surety.example", PASSWORD)
    sign_in(client, "aldo")
    assert client.post(ADMIN_LOGIN, {"username": "root", "password": PASSWORD}).status_code == 403
    assert client.session["_auth_user_id"] != str(root.pk)
