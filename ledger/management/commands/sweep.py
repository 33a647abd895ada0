import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from ledger.metrics import sweeper_seen
from ledger.sweeper import sweep_once


class Command(BaseCommand):
    help = "Re-enqueue lost work and verify stale pending/unknown actions, every --interval seconds."

    def add_arguments(self, parser):
        parser.add_argument("--interval", type=float, default=settings.SWEEP_INTERVAL_SECONDS)
        parser.add_argument("--once", action="store_true", help="one pass, then exit")

    def handle(self, interval, once, **options):
        while True:
            counts = sweep_once()
            sweeper_seen()
            if any(counts.values()):
                self.stdout.write(f"swept: {counts}")
            if once:
                return
            close_old_connections()
            time.sleep(interval)
