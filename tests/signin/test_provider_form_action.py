"""The sign-in page's provider button is a form posted here, which allauth answers with a redirect
to the provider: browsers hold the redirect a form submission follows to the page's CSP
form-action (Chromium refuses one to an origin it does not name), so the policy the settings build
from OIDC_ISSUER must name the origin that redirect goes to, or nobody signs in through it."""

import re
import runpy
from urllib.parse import urlsplit

import pytest

from tests.conftest import ROOT
from tests.signin.conftest import CLIENT_ID, CLIENT_SECRET

pytestmark = pytest.mark.django_db

PROVIDER_BUTTON = re.compile(r'<form method="post" action="(/accounts/oidc/company/login/[^"]*)"')
DEFAULT_PORTS = {"http": 80, "https": 443}


def settings_built_with(monkeypatch, **env):
    """config/settings.py run afresh with `env` over this process's environment: its globals."""
    for name in ("OIDC_ISSUER", "OIDC_CLIENT_ID", "OIDC_CLIENT_SECRET", "PASSWORD_SIGN_IN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(ROOT / "config" / "settings.py"))


def directive(policy, name):
    """The sources of one directive of a Content-Security-Policy header."""
    for part in policy.split(";"):
        words = part.split()
        if words and words[0].lower() == name:
            return words[1:]
    return None


def origin(url):
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or DEFAULT_PORTS.get(parts.scheme)


def admits(sources, url, self_origin):
    """Whether a CSP source list lets a navigation go to `url`: 'self', `*`, a scheme source or a
    host source naming its scheme, host and port (a source's path is ignored for a redirect)."""
    scheme = urlsplit(url).scheme
    for source in sources:
        if source == "*" or source == f"{scheme}:":
            return True
        if source == "'self'":
            if origin(url) == origin(self_origin):
                return True
        elif "://" in source and origin(url) == origin(source):
            return True
    return False


def test_the_login_pages_form_action_admits_where_the_provider_button_sends(oidc_server, monkeypatch, settings, client):
    built = settings_built_with(monkeypatch, OIDC_ISSUER=oidc_server.issuer, OIDC_CLIENT_ID=CLIENT_ID,
                                OIDC_CLIENT_SECRET=CLIENT_SECRET, PASSWORD_SIGN_IN="false")
    settings.SOCIALACCOUNT_PROVIDERS = built["SOCIALACCOUNT_PROVIDERS"]
    settings.CONTENT_SECURITY_POLICY = built["CONTENT_SECURITY_POLICY"]
    settings.SOCIALACCOUNT_ONLY = built["SOCIALACCOUNT_ONLY"]

    page = client.get("/accounts/login/")
    assert page.status_code == 200
    button = PROVIDER_BUTTON.search(page.content.decode())
    assert button, "the sign-in page offers no provider button"
    # The button, pressed: allauth sends the browser to the provider's authorization endpoint.
    answer = client.post(button.group(1).replace("&amp;", "&"))
    assert answer.status_code == 302, answer.content
    authorize = answer["Location"]
    assert authorize.startswith(f"{oidc_server.issuer}/"), authorize

    form_action = directive(page["Content-Security-Policy"], "form-action")
    assert form_action is not None, page["Content-Security-Policy"]
    assert admits(form_action, authorize, "http://testserver"), (
        f"form-action {' '.join(form_action)} refuses the redirect to {authorize}")
    # Only that origin is added: the rest of the policy does not name the provider.
    policy = page["Content-Security-Policy"]
    assert policy.count(oidc_server.issuer) == 1, policy

    # Without a provider, form-action names this site alone.
    plain = settings_built_with(monkeypatch)
    assert plain["CONTENT_SECURITY_POLICY"]["DIRECTIVES"]["form-action"] == ["'self'"]
