"""An Idempotency-Key's claim names its effect by the id the provider shows, written with the
claim itself, instead of by row number, written by a second statement."""

from django.db import migrations, models

# scope (the effect's model name) -> (model, its id field), as they stood when this ran.
KINDS = {
    "sandboxrefund": ("SandboxRefund", "refund_id"),
    "sandboxmessage": ("SandboxMessage", "message_id"),
    "sandboxbooking": ("SandboxBooking", "booking_id"),
}


def fill_effect_ids(apps, schema_editor):
    Claim = apps.get_model("sandbox", "SandboxIdempotencyKey")
    for scope, (model_name, id_field) in KINDS.items():
        model = apps.get_model("sandbox", model_name)
        ids = dict(model.objects.values_list("pk", id_field))
        for claim in Claim.objects.filter(scope=scope, effect_pk__isnull=False):
            claim.effect_id = ids.get(claim.effect_pk, "")
            claim.save(update_fields=["effect_id"])


class Migration(migrations.Migration):

    dependencies = [
        ("sandbox", "0005_lookup_fault"),
    ]

    operations = [
        migrations.AddField(
            model_name="sandboxidempotencykey",
            name="effect_id",
            field=models.CharField(blank=True, default="", max_length=40),
        ),
        migrations.RunPython(fill_effect_ids, migrations.RunPython.noop),
        migrations.RemoveField(
            model_name="sandboxidempotencykey",
            name="effect_pk",
        ),
    ]
