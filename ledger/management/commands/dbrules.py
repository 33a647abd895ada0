from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils.module_loading import import_string

from ledger.dbrules import for_vendor


class Command(BaseCommand):
    requires_system_checks = []  # it only prints SQL
    help = ("Print the SQL that installs an app's database rules (APP/dbrules.py) as the code renders them now, "
            "for this database's vendor: paste it into a new migration when the rules test finds a difference.")

    def add_arguments(self, parser):
        parser.add_argument("app", choices=["ledger", "approvals", "dlq"])

    def handle(self, app, **options):
        try:
            rules = import_string(f"{app}.dbrules.RULES")
        except ImportError as exc:
            raise CommandError(str(exc)) from exc
        for rule in for_vendor(rules, connection.vendor):
            self.stdout.write(rule.create_sql())
