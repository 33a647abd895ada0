"""A reconciliation run records the earlier records it read again for late failures: the schedule
reads the 30 days before its windows in parts, one per run, each where the last complete run's
stopped, rather than all 30 days in every run (decision 66). Runs made before have none: the
first run after reads from the oldest of them."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dlq', '0018_alert_redelivery_stamp'),
    ]

    operations = [
        migrations.AddField(
            model_name='reconciliationrun',
            name='late_since',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='reconciliationrun',
            name='late_until',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
