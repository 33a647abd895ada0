"""Every agent has an owner, the person four eyes keep from deciding its requests. Agents made
without one get a placeholder user (inactive, no password) until a person is named, and the
agents page says so; from now on the database refuses an agent without an owner."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

UNASSIGNED_OWNER = "owner-to-be-named"  # ledger.models.UNASSIGNED_OWNER


def owners_for_ownerless_agents(apps, schema_editor):
    Agent = apps.get_model("ledger", "Agent")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    if Agent.objects.filter(owner__isnull=True).exists():
        placeholder, _ = User.objects.get_or_create(username=UNASSIGNED_OWNER, defaults={"is_active": False,
                                                                                        "password": "!"})
        Agent.objects.filter(owner__isnull=True).update(owner=placeholder)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0017_chain_checks"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]
    operations = [
        migrations.RunPython(owners_for_ownerless_agents, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="agent",
            name="owner",
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="owned_agents",
                                    to=settings.AUTH_USER_MODEL),
        ),
    ]
