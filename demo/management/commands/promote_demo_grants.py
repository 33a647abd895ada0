from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from demo.grants import demo_grants, live_on
from ledger.grants import GrantRefused, capability, grant_promote, passing_run, workers_version
from ledger.management.commands.grant_promote import promoted_line, promoter
from ledger.models import Capability


class Command(BaseCommand):
    help = ("The demo's stack only, once its web app and workers are up: for each action type "
            "the demo agents hold a grant for, the replay set against its connector unless the connector the "
            "workers run has a passing run, then each of those grants not yet live on that connector promoted by "
            "--by, as grant_promote does (audited). Exits 1 unless every type passed and its grants are live on it.")

    def add_arguments(self, parser):
        parser.add_argument("--by", default="ada", metavar="USERNAME",
                            help="the demo person who promotes (default ada, the demo's admin; not an agent's owner)")

    def handle(self, by, **options):
        if settings.PRODUCTION:
            raise CommandError("promote_demo_grants is for the demo's stack: in production a person promotes a grant")
        person = promoter(by)
        grants = demo_grants()
        if not grants:
            self.stdout.write("No demo agents here (seed_demo makes them): nothing to promote.")
            return
        not_ready = [action_type for action_type, held in grants.items()
                     if not self.promoted(action_type, held, person)]
        if not_ready:
            raise CommandError(f"not live on their connectors: the demo's {', '.join(not_ready)} grants (the lines "
                               "above say why; the connectors page shows the replay runs)", returncode=1)

    def promoted(self, action_type, held, person):
        """Whether every one of `held` (the demo's grants for `action_type`) ends live on the connector
        the workers run, its replay set run first unless that connector passed it."""
        try:
            version = workers_version(action_type)
        except GrantRefused as exc:
            self.stdout.write(f"{action_type}: nothing promoted: {exc}")
            return False
        run = passing_run(action_type, version=version)
        if run is None:
            try:
                call_command("replay_check", action_type, stdout=self.stdout)
            except CommandError as exc:
                self.stdout.write(f"{exc}: nothing promoted")
                return False
        else:
            self.stdout.write(f"replay run {run.pk} of {action_type} passed against the connector the workers run "
                              f"({run.started_at:%Y-%m-%d}): not run again")
        ready = True
        for agent, grant in held:
            if live_on(grant, version):
                self.stdout.write(f"{agent.name}'s {action_type} grant is live on that connector already: "
                                  "nothing promoted.")
                continue
            try:
                grant = grant_promote(agent, capability(Capability.Kind.ACTION_TYPE, action_type), actor=person,
                                      version=version, reason=f"the demo's grant, made live in {person.username}'s "
                                      "name (the demo person) by promote_demo_grants once its replay set passed")
            except GrantRefused as exc:
                self.stdout.write(f"{agent.name}'s {action_type} grant: not promoted: {exc}")
                ready = False
                continue
            self.stdout.write(promoted_line(agent, action_type, grant, person))
        return ready
