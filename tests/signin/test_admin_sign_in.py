"""The admin's own sign-in page is the product's: Django's form at /admin/login/ signed a staff
person in with a password alone, past their second factor, past the failed-attempt limit and
where PASSWORD_SIGN_IN is off. It sends people to the sign-in pages instead."""

import pytest
from django.contrib.auth import get_user_model

from tests.signin.conftest import PASSWORD, enrol_totp, sign_in

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
