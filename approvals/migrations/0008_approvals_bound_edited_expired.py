"""Approvals bound to the params a person saw (the print on each approval and decision), items
ended by an edit into a new version (`edited`) or by a limit's approval window (`expired`,
`expires_at`, the limit's approval_expires_after_hours). On SQLite the rebuilt tables' triggers
are set aside and created again (ledger 0020)."""

import importlib

from django.conf import settings
from django.db import migrations, models


_aside = importlib.import_module("ledger.migrations.0020_approvals_bound_versions_expiry").TriggersAside(
    "approvals_limit", "approvals_reviewitem", "approvals_approval")


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0007_escalation_tiers'),
        ('ledger', '0020_approvals_bound_versions_expiry'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = _aside.around([
        migrations.RemoveConstraint(
            model_name='reviewitem',
            name='review_status_valid',
        ),
        migrations.AddField(
            model_name='approval',
            name='fingerprint',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='limit',
            name='approval_expires_after_hours',
            field=models.PositiveIntegerField(blank=True, help_text='Hours after which an approval nobody decided expires (blank: never).', null=True),
        ),
        migrations.AddField(
            model_name='reviewitem',
            name='decided_fingerprint',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='reviewitem',
            name='expires_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='reviewitem',
            name='status',
            field=models.CharField(choices=[('open', 'Open'), ('approved', 'Approved'), ('rejected', 'Rejected'), ('resolved', 'Resolved'), ('closed', 'Closed'), ('edited', 'Edited'), ('expired', 'Expired')], default='open', max_length=20),
        ),
        migrations.AddIndex(
            model_name='reviewitem',
            index=models.Index(condition=models.Q(('expires_at__isnull', False), ('status', 'open')), fields=['expires_at'], name='review_expiry_idx'),
        ),
        migrations.AddConstraint(
            model_name='limit',
            constraint=models.CheckConstraint(condition=models.Q(('approval_expires_after_hours__isnull', True), models.Q(('approval_expires_after_hours__gte', 1), ('approval_expires_after_hours__lte', 8760)), _connector='OR'), name='limit_expiry_an_hour_to_a_year'),
        ),
        migrations.AddConstraint(
            model_name='reviewitem',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['open', 'approved', 'rejected', 'resolved', 'closed', 'edited', 'expired'])), name='review_status_valid'),
        ),
    ])
