"""`manage.py check --deploy` refuses a deployment whose sandbox is on with the repository's own key
or webhook secret: with DEBUG off but PRODUCTION unset the sandbox is on by default, and with the
public key anyone could reset it, arm its faults and sign an event its webhook takes as the
provider's, settling an open action. (The suite itself runs so: DEBUG off, the sandbox on.)"""

import pytest
from django.core import checks


def said(settings, **overrides):
    for name, value in overrides.items():
        setattr(settings, name, value)
    return [message for message in checks.run_checks(include_deployment_checks=True)
            if message.id == "surety.E009"]


def test_the_public_key_and_secret_are_refused_for_a_deployment(settings):
    [refused] = said(settings, DEBUG=False, SANDBOX_ENABLED=True)
    assert "SANDBOX_API_KEY and SANDBOX_WEBHOOK_SECRET" in refused.msg


@pytest.mark.parametrize("overrides", [
    {"DEBUG": True, "SANDBOX_ENABLED": True},
    {"DEBUG": False, "SANDBOX_ENABLED": False},
    {"DEBUG": False, "SANDBOX_ENABLED": True, "SANDBOX_API_KEY": "k-of-its-own", "SANDBOX_WEBHOOK_SECRET": "s-own"},
])
def test_development_a_sandbox_off_or_secrets_of_its_own_pass(settings, overrides):
    assert said(settings, **overrides) == []


def test_only_the_public_one_is_named(settings):
    [refused] = said(settings, DEBUG=False, SANDBOX_ENABLED=True, SANDBOX_API_KEY="k-of-its-own")
    assert "public SANDBOX_WEBHOOK_SECRET" in refused.msg and "SANDBOX_API_KEY" not in refused.msg
