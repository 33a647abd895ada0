"""The sandbox takes a `failed_after_commit` fault: it makes the effect, answers it made, then fails it and
sends its failure event, as Stripe fails a refund after it succeeded (decision 60). Only the field's choices
change: nothing in the database."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sandbox', '0007_refund_status'),
    ]

    operations = [
        migrations.AlterField(
            model_name='sandboxfault',
            name='fault',
            field=models.CharField(choices=[('timeout_after_commit', 'Timeout After Commit'), ('timeout_before_commit', 'Timeout Before Commit'), ('error_500', 'Error 500'), ('decline', 'Decline'), ('failed_after_commit', 'Failed After Commit'), ('lookup_error', 'Lookup Error')], max_length=30),
        ),
    ]
