from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from dlq.archive import ArchiveRefused, archive_expired


class Command(BaseCommand):
    help = ("Move what has outlived its retention into JSON-lines files in DIRECTORY: settled actions past their "
            "key's lifetime with what hangs off them, closed dead letters, resolved incidents, webhook events, audit "
            "events up to a checkpoint and the audit chain's checks; then remove it, one run (file, transaction, "
            "audit event `archived`) at a time.")

    def add_arguments(self, parser):
        parser.add_argument("directory", help="where the archive files are written (it must exist)")
        parser.add_argument("--dry-run", action="store_true", help="print what the first run would take; change nothing")
        parser.add_argument("--limit", type=int, default=10000,
                            help="actions, tasks, dead letters, incidents, webhook events and chain checks per run, "
                                 "each (default 10000)")

    def handle(self, directory, dry_run, limit, **options):
        if not Path(directory).is_dir():
            raise CommandError(f"{directory}: not a directory")
        if limit < 1:
            raise CommandError("--limit must be at least 1")
        runs = 0
        while True:
            try:
                archive, counts = archive_expired(directory, dry_run=dry_run, limit=limit)
            except ArchiveRefused as exc:  # recorded and logged by the run; said, not a traceback
                raise CommandError(str(exc)) from exc
            if dry_run:
                self.stdout.write("would archive: " + (_counts(counts) or "nothing"))
                return
            if archive is None:
                break
            runs += 1
            self.stdout.write(f"{archive.file} sha256 {archive.sha256}: {_counts(counts)}"
                              + (f"; the audit chain now starts at seq {archive.checkpoint.seq}"
                                 if archive.checkpoint else ""))
        self.stdout.write(f"{runs} archive file(s) written" if runs else "nothing to archive")


def _counts(counts):
    return ", ".join(f"{model} {n}" for model, n in counts.items())
