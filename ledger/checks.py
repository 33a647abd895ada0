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
