"""System checks: what must hold before the ledger starts (run by every manage.py command)."""

from django.conf import settings
from django.core import checks

from .connectors import check_connectors
from .models import ActionType


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
    and, for a failure tried again, the look before it (ledger.executor: one more timeout)."""
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
    return []
