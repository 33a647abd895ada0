"""In production, alert settings that cannot work stop the start (a system check), instead of
showing at the first alert's delivery; alerts that would reach nobody are warned of."""

import pytest

from ledger.checks import alert_channels
from tests.ledger.test_production_settings import manage

REAL = "operations@surety-ops.net"


def said(settings, **alerts):
    """The ids the check gives in production with these ALERT_* settings."""
    settings.PRODUCTION = True
    for name, value in {"ALERT_WEBHOOK_URL": None, "ALERT_EMAILS": [REAL], **alerts}.items():
        setattr(settings, name, value)
    return [problem.id for problem in alert_channels()]


@pytest.mark.parametrize("url", [
    "alerts.internal/surety",              # no scheme
    "ftp://alerts.internal/surety",        # not http(s)
    "https:///surety",                     # no host
    "https://:8443/surety",                # a port, no host
    "https://alerts.internal:port/surety",  # a port that is no number
    "https://[::1/surety",                 # an address cut short
])
def test_a_malformed_webhook_url_is_refused(settings, url):
    assert said(settings, ALERT_WEBHOOK_URL=url) == ["surety.E005"]


@pytest.mark.parametrize("url", ["https://alerts.internal/surety", "http://10.0.0.5:9000/hook", "https://[::1]/a"])
def test_an_http_address_with_a_host_is_taken(settings, url):
    assert said(settings, ALERT_WEBHOOK_URL=url) == []


def test_a_malformed_address_is_refused_and_named(settings):
    settings.PRODUCTION = True
    settings.ALERT_WEBHOOK_URL, settings.ALERT_EMAILS = None, [REAL, "operations", "ops@@corp.example.org"]

    problems = alert_channels()

    assert [problem.id for problem in problems] == ["surety.E006", "surety.E006"]
    assert "'operations'" in problems[0].msg and "'ops@@corp.example.org'" in problems[1].msg


@pytest.mark.parametrize("emails", [
    ["operations@surety.example"],  # the default
    ["ops@example.com", "oncall@alerts.example.org"],
    ["ops@corp.invalid"],
    [],  # none at all
])
def test_alerts_that_reach_nobody_are_warned_of(settings, emails):
    assert said(settings, ALERT_EMAILS=emails) == ["surety.W007"]


def test_a_webhook_or_one_address_that_receives_mail_is_enough(settings):
    assert said(settings, ALERT_EMAILS=["operations@surety.example"], ALERT_WEBHOOK_URL="https://alerts.internal/s") == []
    assert said(settings, ALERT_EMAILS=["operations@surety.example", REAL]) == []
    assert said(settings, ALERT_EMAILS=["ops@example.company.com"]) == []  # a domain that merely looks like one


def test_outside_production_nothing_is_said(settings):
    settings.PRODUCTION = False
    settings.ALERT_WEBHOOK_URL, settings.ALERT_EMAILS = "not a url", ["not an address"]

    assert alert_channels() == []


def test_production_refuses_to_start_with_a_malformed_alert_setting_and_warns_of_the_default():
    """Through manage.py with production's own settings, as a host starts."""
    refused = manage("check", ALERT_WEBHOOK_URL="alerts.internal/surety", ALERT_WEBHOOK_SECRET="s" * 40)
    assert refused.returncode != 0
    assert "surety.E005" in refused.stderr and "'alerts.internal/surety'" in refused.stderr

    refused = manage("check", ALERT_EMAILS="operations@corp.example.org, on call")
    assert refused.returncode != 0
    assert "surety.E006" in refused.stderr and "'on call'" in refused.stderr

    warned = manage("check")  # ALERT_EMAILS' default, no webhook
    assert warned.returncode == 0, warned.stderr
    assert "surety.W007" in warned.stderr and "operations@surety.example" in warned.stderr

    assert "surety.W007" not in manage("check", ALERT_EMAILS=REAL).stderr
