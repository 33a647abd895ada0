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

    def handle(self, name, grant, **options):
        try:
            with transaction.atomic():
                agent, token = agent_create(name, actor="system:create_agent", grants=grant)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        granted = ", ".join(str(c) for c in Capability.objects.filter(name__in=grant)) or "nothing"
        self.stdout.write(f"Agent {agent.name} created; granted: {granted}. Its token (shown only now):")
        self.stdout.write(token)
