"""What a move to succeeded reads back with its UPDATE (ledger.models.FAILURE_STORED): whether the
provider's failure of the effect it succeeded with is stored already (decision 60). A function on
PostgreSQL (ledger.dbrules.FAILURE_STORED), as ledger_held_nearby is (0035): its query reads what is
committed once the UPDATE has its row. SQL frozen as `manage.py dbrules ledger` printed it; a new
function, nothing else."""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_failure_stored(p_key text, p_effect text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM ledger_webhookevent e WHERE e.operation_key = p_key AND e.event_type IN ('refund.failed', 'message.failed', 'booking.failed') AND e.payload -> 'data' ->> 'id' = p_effect);
END $$;
"""
BACKWARD = "DROP FUNCTION ledger_failure_stored(text, text);"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0057_a_confirmed_booking_stays'),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
