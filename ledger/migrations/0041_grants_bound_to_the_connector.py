"""A live grant is bound to the connector version it was promoted against, and falls back to
shadow when the connector changes. Grants promoted before keep "" (bound to none): they stay live
until their review date, at most MAX_REVIEW_DAYS away, and a renewal binds them."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0040_archives_signed_and_append_only"),
    ]

    operations = [
        migrations.AddField(
            model_name="grant",
            name="connector_version",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
    ]
