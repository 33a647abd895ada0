from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dlq', '0005_stricter_checks'),
    ]

    operations = [
        migrations.AddConstraint(
            model_name='alertdelivery',
            constraint=models.UniqueConstraint(fields=('alert', 'channel', 'attempt'), name='alertdelivery_once_per_attempt'),
        ),
    ]
