from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from ledger import clock
from ledger.connectors.test_mode import version_now
from ledger.grants import REVIEW_DAYS, WAIT_SECONDS, GrantRefused, capability, grant_promote, workers_version
from ledger.models import ActionType, Agent, Capability, ReplayRun


class Command(BaseCommand):
    help = ("Make an agent's grant for an action type live (or renew it) until a review date, as the agents page "
            "does: by a person with the change_agent permission who is not the agent's owner, with a reason, "
            "only while the connector has a passing replay run for its current version: the version the workers "
            "run, which one of them is asked (this shell's settings do not count). Audited.")

    def add_arguments(self, parser):
        parser.add_argument("agent", help="the agent's name")
        parser.add_argument("action_type", choices=ActionType.values)
        parser.add_argument("--by", metavar="USERNAME", required=True, help="the person deciding (an existing user)")
        parser.add_argument("--reason", required=True, help="why: recorded in the audit log")
        parser.add_argument("--review-days", type=int, default=REVIEW_DAYS, metavar="N",
                            help=f"days until the grant falls back to shadow unless renewed (default {REVIEW_DAYS})")
        parser.add_argument("--wait", type=float, default=WAIT_SECONDS, metavar="SECONDS",
                            help=f"how long a worker may take to say which connector version it runs "
                                 f"(default {WAIT_SECONDS})")

    def handle(self, agent, action_type, by, reason, review_days, wait, **options):
        person = promoter(by)
        found = Agent.objects.filter(name=agent).first()
        if found is None:
            raise CommandError(f"no agent named {agent!r}")
        if not ReplayRun.objects.filter(action_type=action_type, passed=True).exists():
            # Refused whichever version the workers run: said at once, not after asking one.
            raise CommandError(f"not promoted: no replay run passed against the {action_type} connector yet: "
                               "run the replay set")
        if settings.RQ_ASYNC:
            self.stdout.write(f"Asking a worker which {action_type} connector it runs (waiting up to {wait:g} s)…")
        try:
            version = workers_version(action_type, wait)
        except GrantRefused as exc:
            raise CommandError(f"not promoted: {exc}") from None
        try:
            grant = grant_promote(found, capability(Capability.Kind.ACTION_TYPE, action_type), actor=person,
                                  reason=reason, review_by=clock.now() + timedelta(days=review_days),
                                  version=version)
        except (GrantRefused, OverflowError) as exc:
            raise CommandError(f"not promoted: {exc}") from None
        if version != version_now(action_type):
            self.stdout.write(f"Note: the {action_type} connector as this shell's settings configure it is not the "
                              f"one the workers run; the grant is bound to the workers' ({version[:12]}…).")
        self.stdout.write(promoted_line(found, action_type, grant, person))


def promoter(username):
    """The person who promotes: an active user with the change_agent permission, as the agents page
    asks of whoever promotes there (four eyes are grant_promote's to check)."""
    person = get_user_model().objects.filter(username=username, is_active=True).first()
    if person is None:
        raise CommandError(f"no active user named {username!r}")
    if not person.has_perm("ledger.change_agent"):
        raise CommandError(f"{username} may not promote grants: it needs the change_agent permission")
    return person


def promoted_line(agent, action_type, grant, person):
    """The line that says a grant was made live, and until when."""
    return (f"{agent.name} acts for real on {action_type} until {grant.live_until:%Y-%m-%d %H:%M} UTC "
            f"(promoted by {person.username}).")
