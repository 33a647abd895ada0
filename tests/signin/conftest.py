"""The company's OpenID Connect provider (npm's oidc-provider in a node process, tests/signin/
oidc_provider.mjs) and the people who sign in through it, with the helpers that drive its login
and consent pages over HTTP as a browser would; people who sign in with a password and enrol an
authenticator app, whose codes are computed here as the app computes them."""

import base64
import hashlib
import hmac
import html
import json
import re
import struct
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from types import SimpleNamespace
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from allauth.mfa.totp.internal import auth as totp_auth
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command

from approvals.models import Limit
from tests.conftest import ROOT, free_port

CLIENT_ID = "surety-tests"
CLIENT_SECRET = "tests-only-client-secret"
# Where the provider sends the browser back: Django's test client is served as testserver.
CALLBACK = "http://testserver/accounts/oidc/company/login/callback/"
# The people the provider knows (its `sub` is the login name typed on its page).
ACCOUNTS = {
    "ada": {"email": "Ada@Company.example", "email_verified": True, "name": "Ada Admin"},
    "mallory": {"email": "mallory@company.example", "email_verified": True},
    # Claims the address of a person who exists here, which the provider has not verified.
    "eve": {"email": "ada@company.example", "email_verified": False},
}
PASSWORD = "correct-horse-battery-staple"


def app_time():
    """The clock of the authenticator app the codes here are computed as (`codes_checked_in_the_next_period`)."""
    return time.time()


def totp(secret, step=0):
    """RFC 6238's code for now (+ `step` periods of 30 s): HMAC-SHA1, dynamic truncation, 6 digits."""
    digest = hmac.new(base64.b32decode(secret), struct.pack(">Q", int(app_time()) // 30 + step), hashlib.sha1).digest()
    offset = digest[-1] & 0x0F
    return f"{(struct.unpack('>I', digest[offset:offset + 4])[0] & 0x7FFFFFFF) % 10**6:06d}"


FORM = re.compile(r'<form[^>]*action="([^"]+)"[^>]*>(.*?)</form>', re.S)
HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"')


@dataclass
class Provider:
    issuer: str

    def settings(self):
        """SOCIALACCOUNT_PROVIDERS as config/settings.py builds it from OIDC_ISSUER and the client."""
        return {"openid_connect": {"OAUTH_PKCE_ENABLED": True, "APPS": [{
            "provider_id": "company", "name": "Company SSO", "client_id": CLIENT_ID, "secret": CLIENT_SECRET,
            "settings": {"server_url": self.issuer},
        }]}}


@contextmanager
def provider_sending_back_to(redirect_uri, port):
    """tests/signin/oidc_provider.mjs on `port`, its client's redirect URI `redirect_uri`: its issuer."""
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "OIDC_PORT": str(port), "OIDC_CLIENT_ID": CLIENT_ID,
           "OIDC_CLIENT_SECRET": CLIENT_SECRET, "OIDC_REDIRECT_URI": redirect_uri,
           "OIDC_ACCOUNTS": json.dumps(ACCOUNTS)}
    process = subprocess.Popen(["node", "tests/signin/oidc_provider.mjs"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    issuer = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("oidc-provider did not start")
                time.sleep(0.1)
        yield issuer
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def step_up(settings):
    settings.STEP_UP_SECONDS = 300
    settings.MFA_TOTP_TOLERANCE = 1  # two codes within one 30 s period: the second one the next period's


@pytest.fixture
def alice():
    """An approver of refunds up to 500 EUR, with a password and no factor yet."""
    call_command("setup_roles", verbosity=0)
    user = get_user_model().objects.create_user("alice", password=PASSWORD)
    user.groups.add(Group.objects.get(name="approvers"))
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=None)
    return user


@pytest.fixture(scope="session")
def oidc_server():
    """The provider for the test client: it sends people back to testserver's callback."""
    with provider_sending_back_to(CALLBACK, free_port()) as issuer:
        yield Provider(issuer)


@pytest.fixture
def oidc(oidc_server, settings):
    settings.SOCIALACCOUNT_PROVIDERS = oidc_server.settings()
    return oidc_server


def at_provider(authorize_url, login):
    """Signs in at the provider as `login` and consents, as a person would in the browser:
    returns the callback URL (code and state) the provider sends the browser back with."""
    url = authorize_url
    with httpx.Client(timeout=10) as browser:
        for _ in range(10):
            answer = browser.get(url)
            while answer.is_redirect:
                url = urljoin(url, answer.headers["location"])
                if url.startswith("http://testserver/"):
                    return url
                answer = browser.get(url)
            action, body = FORM.search(answer.text).groups()
            fields = {name: html.unescape(value) for name, value in HIDDEN.findall(body)}
            if 'name="login"' in body:
                fields.update(login=login, password="any")
            answer = browser.post(urljoin(url, html.unescape(action)), data=fields)
            assert answer.is_redirect, answer.text
            url = urljoin(url, answer.headers["location"])
            if url.startswith("http://testserver/"):
                return url
    raise AssertionError("the provider never sent the browser back")


def start_sign_in(client):
    """The sign-in page's "Sign in with Company SSO" button: where it sends the browser."""
    answer = client.post("/accounts/oidc/company/login/")
    assert answer.status_code == 302, answer.content
    return answer["Location"]


def back_from_provider(client, callback_url):
    parts = urlsplit(callback_url)
    return client.get(f"{parts.path}?{parts.query}")


# --- people with a password and a second factor ----------------------------------------------

def someone(username, group):
    call_command("setup_roles", verbosity=0)
    user = get_user_model().objects.create_user(username, password=PASSWORD, email=f"{username}@surety.example")
    user.groups.add(Group.objects.get(name=group))
    return user


def sign_in(client, username, password=PASSWORD):
    return client.post("/accounts/login/", {"login": username, "password": password})


@pytest.fixture
def codes_checked_in_the_next_period(monkeypatch):
    """Every code computed here in the last millisecond of a 30 s period, and checked by allauth in
    the first of the next: the boundary a code computed right before its post may still cross.
    allauth takes a code of one period either side of its check's (MFA_TOTP_TOLERANCE = 1, set where
    the tests give codes), so the period before's code is refused then; and a code once taken is
    refused again within the window, so two codes a test gives are the current period's, then the
    next's."""
    period_ends = (int(time.time()) // 30 + 1) * 30
    monkeypatch.setattr(f"{__name__}.app_time", lambda: period_ends - 0.001)
    monkeypatch.setattr(totp_auth, "time", SimpleNamespace(time=lambda: period_ends + 0.001))


def enrol_totp(client):
    """The enrolment page shows the secret (and its QR code); the first code confirms it. The code
    is the current period's, computed right before it is posted, which a check that falls in the
    next period takes too (`codes_checked_in_the_next_period`); the period before's was refused
    then. Enrolling does not mark the code used: the next one given may be the same."""
    page = client.get("/accounts/2fa/totp/activate/")
    assert page.status_code == 200
    secret = re.search(rb'id="authenticator_secret"[^>]*value="([A-Z2-7]+)"|value="([A-Z2-7]+)"[^>]*id="authenticator_secret"',
                       page.content)
    secret = (secret.group(1) or secret.group(2)).decode()
    answer = client.post("/accounts/2fa/totp/activate/", {"code": totp(secret)})
    assert answer.status_code == 302, answer.content
    return secret
