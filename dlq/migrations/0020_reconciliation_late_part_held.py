"""A reconciliation run's late part is held by the database: both ends or neither, a span of its own
ending no later than the run's window starts (the schedule's round goes on from its end)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dlq', '0019_reconciliation_late_span'),
    ]

    operations = [
        migrations.AddConstraint(
            model_name='reconciliationrun',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('late_since__isnull', True), ('late_until__isnull', True)), models.Q(('late_since__isnull', False), ('late_until__gt', models.F('late_since')), ('late_until__isnull', False), ('late_until__lte', models.F('since'))), _connector='OR'), name='reconciliationrun_late_part'),
        ),
    ]
