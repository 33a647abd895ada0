from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from ledger.site_url import site_url_problem


class Command(BaseCommand):
    help = ("Check that SITE_URL reaches this deployment (a signed probe only it can answer): the replay set's "
            "webhook case posts there. Exits 1 otherwise.")

    def handle(self, **options):
        problem = site_url_problem(settings.SITE_URL)
        if problem:
            raise CommandError(problem, returncode=1)
        self.stdout.write(f"SITE_URL {settings.SITE_URL} reaches this deployment")
