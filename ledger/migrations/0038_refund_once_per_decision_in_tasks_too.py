"""One refund per order and decision now holds for a task's refund too, which carries the
decision its input names (else its task's id): a refund task and a direct refund for one
decision, or two tasks for one decision, refunded twice."""

from django.db import migrations, models
from django.db.models import Count


def refuse_refunds_made_twice(apps, schema_editor):
    """As 0024 did for direct refunds: refunds already recorded twice for one order and decision
    (a task's decision is its id until now, so only a direct refund whose decision is a task's id
    can clash) stop the upgrade, named, for a person to reconcile with the provider."""
    Action = apps.get_model("ledger", "Action")
    twice = (Action.objects.filter(action_type="refund").exclude(decision_id="").exclude(status="superseded")
             .values("target", "decision_id").annotate(n=Count("id")).filter(n__gt=1))
    found = [f"{row['target']} / {row['decision_id']} ({row['n']} refunds)" for row in twice[:20]]
    if found:
        raise RuntimeError("refunds recorded more than once for the same order and decision: " + "; ".join(found)
                           + ". Reconcile them with the provider; the rule cannot be added while they exist.")


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0037_booking_once_per_decision'),
    ]

    operations = [
        migrations.RunPython(refuse_refunds_made_twice, migrations.RunPython.noop),
        migrations.RemoveConstraint(
            model_name='action',
            name='action_refund_once_per_decision',
        ),
        migrations.AddConstraint(
            model_name='action',
            constraint=models.UniqueConstraint(models.F('target'), models.F('decision_id'), condition=models.Q(('action_type', 'refund'), models.Q(('decision_id', ''), _negated=True), models.Q(('status', 'superseded'), _negated=True)), name='action_refund_once_per_decision'),
        ),
    ]
