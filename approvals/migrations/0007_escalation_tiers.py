"""Escalation tiers: a limit names who is alerted when a review item is overdue and who next,
at a second deadline; review items record that deadline and their escalation. On SQLite,
adding the limit's columns rebuilds approvals_limit, and the rebuild drops the triggers of
0004 that change the limits' version: they are created again afterwards (as in 0005)."""

import importlib

from django.conf import settings
from django.db import migrations, models

_rules = importlib.import_module("approvals.migrations.0005_limit_rules_held_by_the_database")


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0006_four_eyes_held_by_the_database'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, _rules.sqlite_triggers_again),  # (last, when reversed)
        migrations.AddField(
            model_name='limit',
            name='escalate_after_hours',
            field=models.PositiveIntegerField(blank=True, help_text='Hours after the review deadline; required with a next tier.', null=True),
        ),
        migrations.AddField(
            model_name='limit',
            name='first_tier',
            field=models.CharField(blank=True, default='', help_text='E-mail addresses alerted when a review item is overdue, comma-separated (blank: the operations group).', max_length=500),
        ),
        migrations.AddField(
            model_name='limit',
            name='next_tier',
            field=models.CharField(blank=True, default='', help_text='E-mail addresses alerted when it is still open at the second deadline.', max_length=500),
        ),
        migrations.AddField(
            model_name='reviewitem',
            name='escalate_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='reviewitem',
            name='escalated_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='reviewitem',
            index=models.Index(condition=models.Q(('escalated_at__isnull', True), ('status', 'open')), fields=['escalate_at'], name='review_escalate_idx'),
        ),
        migrations.AddConstraint(
            model_name='limit',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('escalate_after_hours__isnull', True), ('next_tier', '')), models.Q(models.Q(('next_tier', ''), _negated=True), ('escalate_after_hours__gte', 1), ('escalate_after_hours__isnull', False), ('escalate_after_hours__lte', 8760)), _connector='OR'), name='limit_next_tier_with_its_deadline'),
        ),
        migrations.RunPython(_rules.sqlite_triggers_again, migrations.RunPython.noop),
    ]
