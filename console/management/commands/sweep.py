from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from console.sweeper import sweep_forever, sweep_once
from ledger.metrics import sweeper_seen


class Command(BaseCommand):
    help = ("Re-enqueue lost work and verify stale pending/unknown actions, every --interval seconds, through "
            "database and Redis outages; with other sweepers, each step is led by one of them.")

    def add_arguments(self, parser):
        parser.add_argument("--interval", type=float, default=settings.SWEEP_INTERVAL_SECONDS)
        parser.add_argument("--once", action="store_true", help="one pass of every step, then exit")

    def handle(self, interval, once, **options):
        if once:
            counts = sweep_once()
            sweeper_seen()
            self.stdout.write(f"swept: {counts}")
            return
        if settings.SWEEP_LEASE_SECONDS <= interval:
            raise CommandError(f"SWEEP_LEASE_SECONDS ({settings.SWEEP_LEASE_SECONDS:g}) must exceed the interval "
                               f"({interval:g} s): a leader's lease would lapse between its passes")
        sweep_forever(interval)
