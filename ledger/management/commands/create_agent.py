from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from ledger.agents import agent_create
from ledger.models import UNASSIGNED_OWNER, Capability


class Command(BaseCommand):
    help = "Create an agent and print its token once, alone on the last line."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--grant", action="append", default=[],
                            help="an action type and/or workflow of that name (repeatable)")
        parser.add_argument("--owner", metavar="USERNAME",
                            help="the person responsible for the agent: four eyes keep them from deciding its "
                                 f"requests (an existing user); without it, the placeholder {UNASSIGNED_OWNER}, "
                                 "which keeps nobody from it")

    def handle(self, name, grant, owner, **options):
        people = get_user_model().objects
        try:
            owner = people.get_by_natural_key(owner) if owner else None
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {owner!r}: create the person first (manage.py createsuperuser, "
                               "or the dashboard's admin)") from None
        try:
            with transaction.atomic():
                if owner is None:
                    # The contract's `create_agent NAME`: the placeholder of agents made before
                    # owners were required (migration 0018), which the agents page flags.
                    owner, _ = people.get_or_create(username=UNASSIGNED_OWNER,
                                                    defaults={"is_active": False, "password": "!"})
                agent, token = agent_create(name, actor="system:create_agent", grants=grant, owner=owner)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if owner.get_username() == UNASSIGNED_OWNER:
            self.stderr.write(self.style.WARNING(
                f"No --owner: {agent.name} belongs to the placeholder {UNASSIGNED_OWNER!r}, which nobody signs in "
                "as, so four eyes keep nobody from deciding its requests or making its grants live until a "
                "person is named its owner (on the agents page, under Manage)."))
        granted = ", ".join(str(c) for c in Capability.objects.filter(name__in=grant)) or "nothing"
        self.stdout.write(f"Agent {agent.name} created (owner {owner.get_username()}); granted: {granted}. "
                          "Its token (shown only now):")
        self.stdout.write(token)
