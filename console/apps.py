from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class ConsoleConfig(AppConfig):
    default = True  # this module's other config is the admin's, named in INSTALLED_APPS
    name = "console"
    verbose_name = "Console"

    def ready(self):
        from . import signin  # noqa: F401 (connects the sign-in audit trail's receivers)


class AdminConfig(admin_apps.AdminConfig):
    """Django's admin, on a site whose changes ask for a second factor (console.admin_site)."""

    default = False
    default_site = "console.admin_site.AdminSite"
