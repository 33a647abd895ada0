"""Webhook events in partitions by ranges of id (PostgreSQL; ledger.partitions keeps them), and
their ids claimed apart (ledger.models.WebhookClaim): the unique (connector, event id) cannot stay
on a partitioned table, whose unique keys must hold the partition key. Every stored event is
claimed first, then the table is converted as the audit trail was in 0032. Not reversible."""

import importlib

import django.utils.timezone
from django.db import migrations, models

partition_by_id = importlib.import_module("ledger.migrations.0032_audit_trail_partitioned").partition_by_id

CLAIM_STORED = ("INSERT INTO ledger_webhookclaim (connector, event_id, received_at) "
                "SELECT connector, event_id, received_at FROM ledger_webhookevent")


def forward(apps, schema_editor):
    schema_editor.execute(CLAIM_STORED)
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            partition_by_id(cursor, "ledger_webhookevent", [])


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0032_audit_trail_partitioned'),
    ]

    operations = [
        migrations.CreateModel(
            name='WebhookClaim',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('connector', models.CharField(max_length=50)),
                ('event_id', models.CharField(max_length=255)),
                ('received_at', models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.AddConstraint(
            model_name='webhookclaim',
            constraint=models.UniqueConstraint(fields=('connector', 'event_id'), name='webhookclaim_unique_event'),
        ),
        migrations.RemoveConstraint(
            model_name='webhookevent',
            name='webhookevent_unique_event',
        ),
        migrations.RunPython(forward),
    ]
