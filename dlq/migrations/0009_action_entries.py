"""Dead-letter entries for standalone actions too: an entry is about a task or an action, never
both or neither, and each is in the queue once."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dlq', '0008_incident_needs_alert'),
        ('ledger', '0017_chain_checks'),
    ]

    operations = [
        migrations.AddField(
            model_name='deadletter',
            name='action',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='dead_letters', to='ledger.action'),
        ),
        migrations.AlterField(
            model_name='deadletter',
            name='task',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='dead_letters', to='ledger.task'),
        ),
        migrations.AddConstraint(
            model_name='deadletter',
            constraint=models.UniqueConstraint(condition=models.Q(('status', 'open')), fields=('action',), name='deadletter_one_open_per_action'),
        ),
        migrations.AddConstraint(
            model_name='deadletter',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('action__isnull', True), ('task__isnull', False)), models.Q(('action__isnull', False), ('task__isnull', True)), _connector='OR'), name='deadletter_task_or_action'),
        ),
    ]
