"""The sweeper's steps are led by one sweeper at a time: a lease per step (ledger.locks.StepLease)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0025_fingerprints_over_canonical_amounts'),
    ]

    operations = [
        migrations.CreateModel(
            name='StepLease',
            fields=[
                ('step', models.CharField(max_length=100, primary_key=True, serialize=False)),
                ('holder', models.CharField(max_length=200)),
                ('expires_at', models.DateTimeField()),
                ('ran_at', models.DateTimeField()),
                ('runs', models.BigIntegerField(default=0)),
            ],
            options={
                'db_table': 'ledger_step_lease',
            },
        ),
    ]
