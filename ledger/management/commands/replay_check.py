import json

from django.core.management.base import BaseCommand, CommandError

from ledger.models import ActionType
from ledger.replay import replay_check


class Command(BaseCommand):
    help = ("Run the replay set against the connector of an action type, in its test mode, and keep the run. "
            "Exits 1 unless every case passed.")

    def add_arguments(self, parser):
        parser.add_argument("action_type", choices=ActionType.values)

    def handle(self, action_type, **options):
        run = replay_check(action_type, actor="system:replay_check")
        for case in run.cases:
            self.stdout.write(f"{case['outcome']:>14}  {case['case']}")
            if case["outcome"] == "failed":
                self.stdout.write("                " + json.dumps(case["evidence"], default=str)[:2000])
        verdict = "passed" if run.passed else "failed"
        summary = f"replay run {run.pk} of {action_type} against {run.connector or 'no connector'}: {verdict}"
        if not run.passed:
            raise CommandError(summary, returncode=1)
        self.stdout.write(summary)
