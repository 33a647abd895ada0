from django.core.management.base import BaseCommand

from ledger.roles import EXTRA_MODEL_PERMS, OBJECT_PERMS, ROLE_APPS, roles_setup


class Command(BaseCommand):
    help = (
        "Create the dashboard's groups (operators, approvers, auditors, admins) and their permissions: "
        f"view on every model of {', '.join(ROLE_APPS)} for all; admins also "
        f"{', '.join(EXTRA_MODEL_PERMS['admins'])}; object permissions per action type and workflow "
        "(django-guardian). Idempotent: adds what is missing, removes nothing; each change is audited."
    )

    def handle(self, **options):
        changes = roles_setup()
        if options["verbosity"] >= 2:
            for change in changes:
                self.stdout.write(f"  {change}")
        if options["verbosity"] >= 1:
            if changes:
                self.stdout.write(f"Roles set up: {len(changes)} change(s).")
            else:
                self.stdout.write("Roles already set up: nothing to change.")
            for kind, grants in OBJECT_PERMS.items():
                for role, perms in grants.items():
                    self.stdout.write(f"  {role:<10} on every {kind}: {', '.join(perms)}")
