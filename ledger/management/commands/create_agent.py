from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from ledger.agents import agent_create
from ledger.models import Capability


class Command(BaseCommand):
    help = "Create an agent and print its token once, alone on the last line."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--grant", action="append", default=[],
                            help="an action type and/or workflow of that name (repeatable)")
        parser.add_argument("--owner", metavar="USERNAME", required=True,
                            help="the person responsible for the agent: four eyes keep them from deciding its "
                                 "requests (an existing user)")

    def handle(self, name, grant, owner, **options):
        try:
            owner = get_user_model().objects.get_by_natural_key(owner)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {owner!r}: create the person first (manage.py createsuperuser, "
                               "or the dashboard's admin)") from None
        try:
            with transaction.atomic():
                agent, token = agent_create(name, actor="system:create_agent", grants=grant, owner=owner)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        granted = ", ".join(str(c) for c in Capability.objects.filter(name__in=grant)) or "nothing"
        self.stdout.write(f"Agent {agent.name} created (owner {owner.get_username()}); granted: {granted}. "
                          "Its token (shown only now):")
        self.stdout.write(token)
