from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Console"

    def ready(self):
        from . import signin  # noqa: F401 (connects the sign-in audit trail's receivers)
