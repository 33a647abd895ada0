"""A shadow action (recorded under a shadow grant, never executed) holds no effect, so it no longer
holds its decision: once the grant is live, the same refund or message asked again under another key
is recorded and runs, where it was answered with the shadow row and never ran. Both rules only leave
rows out, so no row breaks them."""

import django.db.models.fields.json
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0049_booking_done_by_hand_holds_its_decision'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='action',
            name='action_message_once_per_decision',
        ),
        migrations.RemoveConstraint(
            model_name='action',
            name='action_refund_once_per_decision',
        ),
        migrations.AddConstraint(
            model_name='action',
            constraint=models.UniqueConstraint(models.F('target'), django.db.models.fields.json.KeyTextTransform('message_type', 'params'), models.F('decision_id'), condition=models.Q(('action_type', 'send_message'), models.Q(('decision_id', ''), _negated=True), models.Q(('status', 'shadow'), _negated=True)), name='action_message_once_per_decision'),
        ),
        migrations.AddConstraint(
            model_name='action',
            constraint=models.UniqueConstraint(models.F('target'), models.F('decision_id'), condition=models.Q(('action_type', 'refund'), models.Q(('decision_id', ''), _negated=True), models.Q(('status__in', ['superseded', 'shadow']), _negated=True)), name='action_refund_once_per_decision'),
        ),
    ]
