"""A sandbox refund carries its status as Stripe's Refund does, so that the Stripe wire format can list
one the provider failed after it was made (decision 60)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sandbox', '0006_claim_names_effect_id'),
    ]

    operations = [
        migrations.AddField(
            model_name='sandboxrefund',
            name='status',
            field=models.CharField(default='succeeded', max_length=20),
        ),
    ]
