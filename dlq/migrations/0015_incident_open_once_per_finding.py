"""One open incident per finding, not one for ever: an incident resolved no longer answers for an
effect made after it (a third refund of one order), which reconciliation then reports anew."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dlq', '0014_reconciliation_runs_by_hand'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='incident',
            name='incident_once_per_finding',
        ),
        migrations.AddConstraint(
            model_name='incident',
            constraint=models.UniqueConstraint(condition=models.Q(('status', 'open')), fields=('connector', 'kind', 'subject'), name='incident_open_once_per_finding'),
        ),
    ]
