"""A fourth kind of reconciliation finding: an effect at the provider under the key of a ledger
entry that says none was made (failed, rejected, cancelled, expired, shadow, superseded)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("dlq", "0012_bulk_redrive_on_shared_leases"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="incident",
            name="incident_kind_valid",
        ),
        migrations.AlterField(
            model_name="incident",
            name="kind",
            field=models.CharField(choices=[("orphan_effect", "effect without a ledger entry"), ("double_effect", "more than one effect for an operation key"), ("amount_mismatch", "amount differs from the ledger"), ("denied_effect", "effect for a ledger entry that says none was made")], max_length=30),
        ),
        migrations.AddConstraint(
            model_name="incident",
            constraint=models.CheckConstraint(condition=models.Q(("kind__in", ["orphan_effect", "double_effect", "amount_mismatch", "denied_effect"])), name="incident_kind_valid"),
        ),
    ]
