"""Which connector serves which action type: the registry, read from `SURETY_CONNECTORS`.

Each entry names a `Connector` subclass and the options it is built with, once per process
(rebuilt when a test changes the setting). A type without an entry, a class that cannot be
imported or a connector whose `check()` finds a problem (a missing credential) stops
`manage.py check`, and so every start, with a clear message: never a `LookupError` on the
request path.
"""

import functools

from django.conf import settings
from django.core import checks
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from ..compiled import register_cache


class NoConnector(LookupError):
    """No connector is configured for an action type."""


@functools.cache
def connector_for(action_type):
    entry = settings.SURETY_CONNECTORS.get(action_type)
    if entry is None:
        raise NoConnector(f"no connector is configured for {action_type} (SURETY_CONNECTORS)")
    return import_string(entry["class"])(**entry.get("options", {}))


def connector_name(action_type):
    """The name of the connector serving `action_type` for the pages, or "" without one."""
    try:
        return connector_for(action_type).name
    except (NoConnector, ImportError):
        return ""


register_cache("ledger.connectors.connector_for", holds="each action type's connector, built once",
               stale_when="SURETY_CONNECTORS changes (tests: the setting_changed signal empties it)",
               clear=connector_for.cache_clear)


@receiver(setting_changed)
def _forget_connectors(setting, **kwargs):
    if setting in ("SURETY_CONNECTORS", "SANDBOX_ENABLED"):
        connector_for.cache_clear()


def check_connectors(action_types):
    """System-check errors for the registry: every action type served, every connector ready."""
    errors = []
    for action_type in action_types:
        entry = settings.SURETY_CONNECTORS.get(action_type)
        if entry is None:
            errors.append(checks.Error(
                f"no connector serves the action type {action_type!r}",
                hint=f"set CONNECTOR_{action_type.upper()} (or SURETY_CONNECTORS['{action_type}'])",
                id="surety.E001",
            ))
            continue
        try:
            connector = connector_for(action_type)
        except (ImportError, TypeError, ValueError) as exc:
            errors.append(checks.Error(f"the connector for {action_type!r} cannot be built: {exc}",
                                       hint=f"check SURETY_CONNECTORS['{action_type}']", id="surety.E002"))
            continue
        errors.extend(checks.Error(f"{connector.name} connector for {action_type!r}: {problem}", id="surety.E003")
                      for problem in connector.check())
    return errors
