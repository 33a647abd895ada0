"""A booking a person did by hand (its dead letter resolved: ledger.actions.action_done_by_hand) is
failed for good and keeps its slot, confirmed; it holds its decision too, or the same decision
asked again under another key, its times moved, booked a second slot. No rows break the new rule:
nothing was done by hand before it."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0048_audit_sealed_only_after_the_chains_end'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='action',
            name='action_booking_once_per_decision',
        ),
        migrations.AddConstraint(
            model_name='action',
            constraint=models.UniqueConstraint(models.F('target'), models.F('customer'), models.F('decision_id'), condition=models.Q(('action_type', 'create_booking'), models.Q(('decision_id', ''), _negated=True), models.Q(('status__in', ['superseded', 'rejected', 'cancelled', 'expired', 'shadow']), _negated=True), models.Q(models.Q(('error__retryable', False), ('status', 'failed'), _negated=True), models.Q(('error__done_by_hand', True), ('status', 'failed')), _connector='OR')), name='action_booking_once_per_decision'),
        ),
    ]
