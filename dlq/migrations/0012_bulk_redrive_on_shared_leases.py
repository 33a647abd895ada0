"""A bulk redrive's run is leased as the sweeper's steps are (ledger.locks.StepLease, named
`bulk_redrive:<id>`, on the database's clock), not by columns of its own. A run active during
the upgrade has no lease row yet: the sweeper's next pass takes it and starts a job for it, as
for a run whose job was lost."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("dlq", "0011_bulk_redrive_runs"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="bulkredrive", name="bulkredrive_active_idx"),
        migrations.RemoveField(model_name="bulkredrive", name="lease_expires_at"),
        migrations.RemoveField(model_name="bulkredrive", name="lease_owner"),
        migrations.AddIndex(model_name="bulkredrive",
                            index=models.Index(fields=["status"], name="bulkredrive_status_idx")),
    ]
