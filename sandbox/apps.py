from django.apps import AppConfig


class SandboxConfig(AppConfig):
    name = "sandbox"
    label = "sandbox"
    verbose_name = "Sandbox provider"
