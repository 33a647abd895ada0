from django.apps import AppConfig


class SandboxConfig(AppConfig):
    name = "sandbox"
    label = "sandbox"
    verbose_name = "Sandbox provider"

    def ready(self):
        from ledger import hooks

        from .webhooks import webhooks_redeliver_stale

        # An event whose delivery job Redis lost is sent all the same.
        hooks.on_sweep("sandbox_webhooks_redelivered", webhooks_redeliver_stale)
