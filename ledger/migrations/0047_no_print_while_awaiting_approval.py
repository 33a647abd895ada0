"""An action waiting for approval carries no approval print (ledger.models.Action.release): a
person's release to approval wrote theirs there before, and a release after a later hold would
now take it for an approval (ledger.actions.action_release). Dropped from the rows that have
one; nothing to restore backwards (the executor never ran an action waiting for approval)."""

from django.db import migrations


def forward(apps, schema_editor):
    Action = apps.get_model("ledger", "Action")
    Action.objects.filter(status="awaiting_approval").exclude(approved_fingerprint="").update(approved_fingerprint="")


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0046_audit_label_hashed_checkpoints_linked"),
    ]

    operations = [
        migrations.RunPython(forward, migrations.RunPython.noop),
    ]
