from django.core.management.base import BaseCommand, CommandError

from ledger.audit import audit_verify


class Command(BaseCommand):
    help = ("Verify the audit trail's hash chain from its first event (or, with --newest, from the end of the "
            "last intact check); print the first broken link or how far it holds, and record the result for "
            "the audit page. Exits non-zero on a break.")

    def add_arguments(self, parser):
        parser.add_argument("--newest", action="store_true", help="only what was sealed since the last intact check")

    def handle(self, newest, **options):
        report = audit_verify(whole=not newest)
        if report.broken_at is not None:
            raise CommandError(str(report))
        self.stdout.write(str(report))
