"""The policy form's rules for a limit, held by the database for every writer. On SQLite,
adding a constraint rebuilds approvals_limit, and the rebuild drops the triggers of 0004
that change the limits' version: they are created again afterwards."""

import importlib

from django.conf import settings
from django.db import migrations, models

_version = importlib.import_module("approvals.migrations.0004_limits_version")


def sqlite_triggers_again(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for drop, create in zip(_version.SQLITE_BACKWARD, _version.SQLITE_FORWARD[1:]):
            schema_editor.execute(drop.replace("DROP TRIGGER", "DROP TRIGGER IF EXISTS"))
            schema_editor.execute(create)


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0004_limits_version'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, sqlite_triggers_again),  # (last, when reversed)
        migrations.AddConstraint(
            model_name='limit',
            constraint=models.CheckConstraint(condition=models.Q(('daily_customer_total__isnull', True), ('daily_customer_total__gte', 0), _connector='OR'), name='limit_daily_total_nonnegative'),
        ),
        migrations.AddConstraint(
            model_name='limit',
            constraint=models.CheckConstraint(condition=models.Q(('review_deadline_hours__gte', 1), ('review_deadline_hours__lte', 8760)), name='limit_deadline_an_hour_to_a_year'),
        ),
        migrations.RunPython(sqlite_triggers_again, migrations.RunPython.noop),
    ]
