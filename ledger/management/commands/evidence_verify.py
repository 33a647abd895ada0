import json

from django.core.management.base import BaseCommand, CommandError

from ledger.audit import AuditEvent
from ledger.evidence import record_problems


class Command(BaseCommand):
    help = ("Check an action's evidence record (the JSON file from the dashboard or the API): each audit event's "
            "hashes recomputed from its fields, the links between consecutive events and the record's digest; then, "
            "unless --offline, the signature and every event against the audit chain in the database (--chain also "
            "walks the chain from the record's first event to its end). Exits non-zero on any mismatch.")

    def add_arguments(self, parser):
        parser.add_argument("file", help="the evidence record, a JSON file")
        parser.add_argument("--offline", action="store_true", help="check the file alone, without the database")
        parser.add_argument("--chain", action="store_true",
                            help="also verify the database's chain from the record's first sealed event on")
        parser.add_argument("--archives", metavar="DIRECTORY",
                            help="the directory of archive_expired's files: an event an archive run took out of the "
                                 "database is checked in its file (whose SHA-256 the database keeps)")

    def handle(self, file, offline, chain, archives, **options):
        try:
            with open(file, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read {file}: {exc}") from None
        problems = record_problems(record, database=not offline, archives=archives)
        if chain and not offline and not problems:
            problems += chain_problems(record)
        if problems:
            raise CommandError(f"{file}: {len(problems)} problem(s):\n" + "\n".join(f"- {p}" for p in problems))
        where = "the file alone" if offline else "the database's audit chain"
        # The agent's record withholds staff's addresses from some events: from the file alone only
        # their links hold, their content is the database's to check.
        withheld = sum(1 for event in record["audit"]["events"] if event.get("redacted"))
        note = "" if not withheld else f"; {withheld} with values withheld" + (
            ": their content hashes cannot be recomputed from the file, check it against the database"
            if offline else ", checked with the chain's values put back")
        events = len(record["audit"]["events"])
        self.stdout.write(f"{file}: intact: {events} audit events checked against {where}{note}")


def chain_problems(record):
    """The database's chain from the record's first sealed event to its end; from the checkpoint
    an archive left, checked first, where the archive took the events before it (the record's
    own events in the archive's file are checked with --archives; `AuditEvent.objects.report_from`)."""
    sealed = [e["seq"] for e in record["audit"]["events"] if isinstance(e.get("seq"), int)]
    if not sealed:
        return []
    report = AuditEvent.objects.report_from(min(sealed))
    return [] if report.broken_at is None else [f"the database's chain: {report}"]
