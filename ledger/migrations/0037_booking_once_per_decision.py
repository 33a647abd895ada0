"""One booking per resource, customer and decision, whatever key asks for it (as refunds and
messages already are): a second key with the times moved booked a second slot for one decision."""

from django.db import migrations, models
from django.db.models import Count


def refuse_bookings_made_twice(apps, schema_editor):
    """Bookings already recorded twice for one decision cannot be merged or deleted: they are
    history. The upgrade stops and names them, so that a person looks at them (one of them may be
    a slot booked by mistake) before the rule holds."""
    Action = apps.get_model("ledger", "Action")
    twice = (Action.objects.filter(action_type="create_booking").exclude(decision_id="").exclude(status="superseded")
             .values("target", "customer", "decision_id").annotate(n=Count("id")).filter(n__gt=1))
    found = [f"{row['target']} / {row['customer']} / {row['decision_id']} ({row['n']} bookings)" for row in twice[:20]]
    if found:
        raise RuntimeError("bookings recorded more than once for the same resource, customer and decision (under "
                           "different operation keys): " + "; ".join(found) + ". Look at them (and release the slot "
                           "booked by mistake) before the rule can be added.")


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0036_try_lock_subjects'),
    ]

    operations = [
        migrations.RunPython(refuse_bookings_made_twice, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='action',
            constraint=models.UniqueConstraint(models.F('target'), models.F('customer'), models.F('decision_id'), condition=models.Q(('action_type', 'create_booking'), models.Q(('decision_id', ''), _negated=True), models.Q(('status', 'superseded'), _negated=True)), name='action_booking_once_per_decision'),
        ),
    ]
