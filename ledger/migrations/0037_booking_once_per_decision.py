"""One booking per resource, customer and decision while it holds its slot, whatever key asks for
it (as refunds and messages are): a second key with the times moved booked a second slot for one
decision."""

from django.db import migrations, models
from django.db.models import Count


def refuse_bookings_made_twice(apps, schema_editor):
    """Bookings already holding their slot twice for one decision (under two keys) cannot be
    merged or deleted: they are history. The upgrade stops and names them, so that a person
    looks at them (one of them may be a slot booked by mistake) before the rule holds. Those that
    never held it or let it go (rejected, cancelled, expired, failed for good, shadow, superseded)
    are left out, as the rule leaves them out: a decision could always be asked again after them."""
    Action = apps.get_model("ledger", "Action")
    held = (Action.objects.filter(action_type="create_booking").exclude(decision_id="")
            .exclude(status__in=["superseded", "rejected", "cancelled", "expired", "shadow"])
            .exclude(status="failed", error__retryable=False))
    twice = held.values("target", "customer", "decision_id").annotate(n=Count("id")).filter(n__gt=1)
    found = [f"{row['target']} / {row['customer']} / {row['decision_id']} ({row['n']} bookings)" for row in twice[:20]]
    if found:
        raise RuntimeError("bookings holding their slots more than once for the same resource, customer and decision "
                           "(under different operation keys): " + "; ".join(found) + ". Cancel the one booked by "
                           "mistake before the rule can be added.")


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0036_try_lock_subjects'),
    ]

    operations = [
        migrations.RunPython(refuse_bookings_made_twice, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='action',
            constraint=models.UniqueConstraint(models.F('target'), models.F('customer'), models.F('decision_id'), condition=models.Q(('action_type', 'create_booking'), models.Q(('decision_id', ''), _negated=True), models.Q(('status__in', ['superseded', 'rejected', 'cancelled', 'expired', 'shadow']), _negated=True), models.Q(('error__retryable', False), ('status', 'failed'), _negated=True)), name='action_booking_once_per_decision'),
        ),
    ]
