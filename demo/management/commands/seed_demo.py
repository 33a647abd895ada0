from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from demo.seed import demo_summary, demo_users_existing, seed_demo


class Command(BaseCommand):
    help = (
        "Development only: seed a realistic demo (roles, users with password 'demo', agents, limits, sandbox "
        "orders, actions and tasks in every state, review items, dead-letter entries with alerts). Every "
        "change goes through the product's functions and is audited. Does nothing if the demo users exist."
    )

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true",
                            help="seed even with DEBUG off or PRODUCTION on (never do this on a real system)")

    def handle(self, force, **options):
        if (settings.PRODUCTION or not settings.DEBUG) and not force:
            raise CommandError("seed_demo is for development: it refuses with PRODUCTION on or DEBUG off "
                               "(--force overrides)")
        existing = demo_users_existing()
        if existing:
            self.stdout.write("Demo data already seeded; nothing to do.")
            for line in demo_summary(existing):
                self.stdout.write(line)
            return
        demo = seed_demo()
        self.stdout.write(self.style.SUCCESS("Demo data seeded."))
        for line in demo_summary(demo_users_existing(), demo.tokens):
            self.stdout.write(line)
