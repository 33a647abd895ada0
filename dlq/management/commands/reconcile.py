from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from dlq.reconcile import run_finish, run_start
from ledger.validation import parse_moment


class Command(BaseCommand):
    help = ("Compare the ledger with each connector's records over a window and open an incident for each "
            "effect without a ledger entry, double effect or amount mismatch (the sweeper schedules this too).")

    def add_arguments(self, parser):
        parser.add_argument("--hours", type=float, help="the window is the last HOURS hours (default 24)")
        parser.add_argument("--since", help="start of the window (ISO 8601), instead of --hours; no earlier than "
                                             "OPERATION_KEY_LIFETIME_DAYS ago")
        parser.add_argument("--until", help="end of the window (ISO 8601; default now)")

    def handle(self, hours, since, until, **options):
        if hours is not None and since:
            raise CommandError("give --hours or --since, not both")
        end = self._moment(until, "--until") if until else timezone.now()
        try:
            start = self._moment(since, "--since") if since else end - timedelta(hours=24 if hours is None else hours)
            run = run_start(end, since=start)
        except OverflowError:
            raise CommandError(f"--hours {hours}: further back than a date can go") from None
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        run = run_finish(run.pk)
        self.stdout.write(f"{run}:")
        for connector, part in run.report.items():
            self.stdout.write(f"  {connector}: " + ", ".join(f"{k} {v}" for k, v in part.items()))
        if not run.complete:
            raise CommandError("not every connector could be read to the end; see above")

    def _moment(self, value, name):
        moment = parse_moment(value)
        if moment is None:
            raise CommandError(f"{name}: not a date and time: {value!r}")
        return moment
