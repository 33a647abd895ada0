"""A chain check keeps the chain's hash where it ended, which the next check compares: events removed
from the chain's end and their seqs sealed again left a chain as long as before, which linked. The checks
before this keep none (null) and vouch for the chain's length alone."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0042_a_retry_goes_before_what_it_held"),
    ]

    operations = [
        migrations.AddField(
            model_name="chaincheck",
            name="through_hash",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
    ]
