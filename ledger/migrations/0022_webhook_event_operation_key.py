"""Each stored webhook event keeps the operation key its payload names in a column of its own,
indexed, so that an action's evidence finds its events without reading every payload. The
events stored before are given theirs from their payloads."""

from django.db import migrations, models

BATCH = 1000


def named_operation_key(data):
    """As ledger.models.named_operation_key read events when this migration was written (a
    migration keeps the rule it ran with)."""
    metadata = data.get("metadata") if isinstance(data, dict) else None
    key = metadata.get("operation_key") if isinstance(metadata, dict) else None
    return key if isinstance(key, str) else ""


def backfill(apps, schema_editor):
    WebhookEvent = apps.get_model("ledger", "WebhookEvent")
    naming = WebhookEvent.objects.filter(payload__data__metadata__has_key="operation_key").only("id", "payload")
    batch = []
    for event in naming.iterator(chunk_size=BATCH):
        event.operation_key = named_operation_key(event.payload.get("data"))[:255]
        batch.append(event)
        if len(batch) == BATCH:
            WebhookEvent.objects.bulk_update(batch, ["operation_key"])
            batch = []
    WebhookEvent.objects.bulk_update(batch, ["operation_key"])


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0021_superseded_has_version"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookevent",
            name="operation_key",
            field=models.CharField(blank=True, db_index=True, default="", max_length=255),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
