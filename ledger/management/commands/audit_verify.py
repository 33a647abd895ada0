from django.core.management.base import BaseCommand, CommandError

from ledger.audit import audit_verify, audit_walk
from ledger.models import ChainWalk


class Command(BaseCommand):
    help = ("Verify the audit trail's hash chain from its last checkpoint (its signature and hash first; from the "
            "first event while there is none), or with --newest from the end of the last intact check; print the "
            "first broken link or how far it holds, and record the result for the audit page. With --whole, walk "
            "the whole chain, resuming the walk in progress from the seq it reached, and print its progress. "
            "Exits non-zero on a break.")

    def add_arguments(self, parser):
        scope = parser.add_mutually_exclusive_group()
        scope.add_argument("--newest", action="store_true", help="only what was sealed since the last intact check")
        scope.add_argument("--whole", action="store_true", help="the whole chain, resumable (the sweeper's daily walk)")

    def handle(self, newest, whole, **options):
        if whole:
            return self.walk()
        report = audit_verify(since_checkpoint=not newest)
        if report.broken_at is not None:
            raise CommandError(str(report))
        self.stdout.write(str(report))

    def walk(self):
        """Stretch after stretch (each one's progress stored) until the walk is done: the walk in
        progress, from the seq it reached, or a new one."""
        if not ChainWalk.objects.filter(finished_at__isnull=True).exists():
            audit_walk(start=True)
        walk = ChainWalk.objects.first()
        while walk is not None and walk.finished_at is None:
            self.stdout.write(str(walk))
            audit_walk()
            walk.refresh_from_db()
        if walk is None:
            self.stdout.write("nothing sealed yet: nothing to walk")
        elif walk.broken_at is not None:
            raise CommandError(f"{walk}: broken at seq {walk.broken_at}: {walk.why}")
        else:
            self.stdout.write(f"{walk} ({walk.events} events checked)")
