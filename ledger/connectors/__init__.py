"""Which connector serves which action type."""

from django.conf import settings


def connector_for(action_type):
    from .sandbox import SandboxConnector

    if settings.SANDBOX_ENABLED:
        return SandboxConnector()
    raise LookupError(f"no connector is configured for {action_type}")
