from django.core.management.base import BaseCommand
from django.db import transaction

from ledger import executor, runner  # noqa: F401 (the hot paths: their statements register when imported)
from ledger.compiled import CACHES, STATEMENTS


class Command(BaseCommand):
    help = "List the speed tricks: each statement compiled once, with its SQL, and each cache a process keeps."

    def handle(self, **options):
        self.stdout.write("Statements compiled once (ledger/compiled.py):")
        with transaction.atomic():  # a locking statement is compiled inside one only
            for statement in STATEMENTS:
                self.stdout.write(f"\n  {statement}\n    {statement.sql()}")
        self.stdout.write("\nCaches:")
        for cache in CACHES.values():
            self.stdout.write(f"\n  {cache.name}: {cache.holds}\n    stale: {cache.stale_when}")
