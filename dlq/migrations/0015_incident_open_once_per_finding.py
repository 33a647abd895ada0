"""One open incident per finding, not one for ever: an incident resolved no longer answers for an
effect made after it (a third refund of one order), which reconciliation then reports anew. And an
index on a denied effect's key, which a dead letter's redrive asks about.

Not undone once used: back, the constraint of one incident per finding, whatever its status, is
refused by a database that holds a resolved incident and a later one for the same finding."""

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
        migrations.AddIndex(
            model_name='incident',
            index=models.Index(condition=models.Q(('kind', 'denied_effect')), fields=['operation_key'], name='incident_denied_key_idx'),
        ),
        migrations.AddConstraint(
            model_name='incident',
            constraint=models.UniqueConstraint(condition=models.Q(('status', 'open')), fields=('connector', 'kind', 'subject'), name='incident_open_once_per_finding'),
        ),
    ]
