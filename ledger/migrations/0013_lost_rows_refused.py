from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0012_audit_seal_checked_by_the_database'),
    ]

    operations = [
        migrations.AddConstraint(
            model_name='action',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('status__in', ['queued', 'unknown']), _negated=True), ('next_attempt_at__isnull', False), _connector='OR'), name='action_due_has_time'),
        ),
        migrations.AddConstraint(
            model_name='action',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('status', 'pending'), _negated=True), ('lease_expires_at__isnull', False), _connector='OR'), name='action_pending_has_lease'),
        ),
        migrations.AddConstraint(
            model_name='task',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state', 'queued'), _negated=True), ('next_attempt_at__isnull', False), _connector='OR'), name='task_queued_has_time'),
        ),
        migrations.AddConstraint(
            model_name='task',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state', 'running'), _negated=True), ('lease_expires_at__isnull', False), _connector='OR'), name='task_running_has_lease'),
        ),
    ]
