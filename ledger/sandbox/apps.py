from django.apps import AppConfig


class SandboxConfig(AppConfig):
    name = "ledger.sandbox"
    label = "sandbox"
    verbose_name = "Sandbox provider"
