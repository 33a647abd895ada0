"""System checks: what must hold before the ledger starts (run by every manage.py command)."""

from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from .connectors import check_connectors
from .models import ActionType
from .runner import renewed_below


@checks.register()
def connectors_configured(app_configs=None, **kwargs):
    errors = []
    if set(settings.ACTION_TYPES) != set(ActionType.values):
        errors.append(checks.Error(f"settings.ACTION_TYPES {settings.ACTION_TYPES} differ from the ledger's "
                                   f"{tuple(ActionType.values)}", id="surety.E000"))
    return errors + check_connectors(ActionType.values)


@checks.register()
def lease_holds_a_call(app_configs=None, **kwargs):
    """A claim's lease must hold a call (CONNECTOR_TIMEOUT and the margin, or no call ever starts)
    and, for a failure tried again, the look before it (ledger.executor: one more timeout). A task's
    lease must hold the same from a step's start, where its run renews it only once less than
    `renewed_below` is left (ledger.runner): else the sweeper takes back a run whose step is out."""
    lease, timeout, margin = settings.LEASE_SECONDS, settings.CONNECTOR_TIMEOUT, settings.LEASE_MARGIN_SECONDS
    if lease <= timeout + margin:
        return [checks.Error(f"LEASE_SECONDS {lease:g} is not more than CONNECTOR_TIMEOUT {timeout:g} + "
                             f"LEASE_MARGIN_SECONDS {margin:g}: no provider call could ever start",
                             id="surety.E004")]
    if lease <= 2 * timeout + margin:
        return [checks.Warning(f"LEASE_SECONDS {lease:g} is not more than 2 x CONNECTOR_TIMEOUT {timeout:g} + "
                               f"LEASE_MARGIN_SECONDS {margin:g}: a failure tried again may look at the provider "
                               "and have too little lease left to call, and wait for the sweeper",
                               id="surety.W004")]
    if renewed_below() <= 2 * timeout + margin:
        return [checks.Warning(f"a task's step may start with {renewed_below():g} s of its lease left (half of "
                               f"LEASE_SECONDS {lease:g}), not more than 2 x CONNECTOR_TIMEOUT {timeout:g} + "
                               f"LEASE_MARGIN_SECONDS {margin:g}: its look and call may outlast it, and the sweeper "
                               "take back a run that is well (its attempt spent; on the last one, the task "
                               "dead-lettered as worker_lost)",
                               hint=f"set LEASE_SECONDS above {2 * (2 * timeout + margin):g}", id="surety.W008")]
    return []


# Domains reserved so that they never receive mail (RFC 2606; example.com, .net and .org publish a
# null MX, RFC 7505), and their subdomains. ALERT_EMAILS' default, operations@surety.example, is at one.
NO_MAIL_DOMAINS = ("example", "invalid", "example.com", "example.net", "example.org")


@checks.register(checks.Tags.security, deploy=True)
def sandbox_secrets(app_configs=None, **kwargs):
    """`check --deploy`: the sandbox on with DEBUG off (PRODUCTION unset, or SANDBOX_ENABLED) and the
    repository's own key or webhook secret. Anyone could reset it, arm its faults, send its events
    anywhere, and sign an event its webhook takes as the provider's, settling an open action."""
    if settings.DEBUG or not settings.SANDBOX_ENABLED:
        return []
    public = [name for name, value in settings.SANDBOX_DEV_SECRETS.items() if getattr(settings, name) == value]
    return [checks.Error(f"the sandbox is on with the repository's public {' and '.join(public)}",
                         hint="set PRODUCTION=true (the sandbox is then off unless SANDBOX_ENABLED), or set "
                              f"{' and '.join(public)} to values of this deployment's own", id="surety.E009")
            ] if public else []


@checks.register()
def alert_channels(app_configs=None, **kwargs):
    """In production, alert settings that cannot work stop the start, rather than showing at the
    first alert's delivery; and alerts that would reach nobody are warned of."""
    if not settings.PRODUCTION:
        return []
    problems = []
    url = settings.ALERT_WEBHOOK_URL
    if url and not _http_address(url):
        problems.append(checks.Error(f"ALERT_WEBHOOK_URL {url!r} is not an http(s) address with a host",
                                     id="surety.E005"))
    for address in settings.ALERT_EMAILS:
        try:
            validate_email(address)
        except ValidationError:
            problems.append(checks.Error(f"ALERT_EMAILS names {address!r}, which is not an e-mail address",
                                         id="surety.E006"))
    if not url and all(_never_receives(address) for address in settings.ALERT_EMAILS):
        why = (f"names only addresses at domains that never receive mail ({', '.join(settings.ALERT_EMAILS)})"
               if settings.ALERT_EMAILS else "is empty")
        problems.append(checks.Warning(
            f"alerts reach nobody: ALERT_WEBHOOK_URL is not set and ALERT_EMAILS {why}",
            hint="set ALERT_EMAILS to operations' own addresses, or ALERT_WEBHOOK_URL", id="surety.W007"))
    return problems


def _http_address(url):
    try:
        parts = urlsplit(url)
        parts.port  # raises ValueError for a port that is no number, or out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _never_receives(address):
    domain = address.rpartition("@")[2].lower().rstrip(".")
    return any(domain == reserved or domain.endswith(f".{reserved}") for reserved in NO_MAIL_DOMAINS)
