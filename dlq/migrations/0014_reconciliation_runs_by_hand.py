"""A reconciliation run by hand is not the schedule's: the schedule's next window starts from its
own last complete run, and only its runs take one `until` each. The runs before were all taken
as the schedule's."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("dlq", "0013_incidents_of_denied_effects"),
    ]

    operations = [
        migrations.AddField(
            model_name="reconciliationrun",
            name="scheduled",
            field=models.BooleanField(default=True),
        ),
        migrations.AlterField(
            model_name="reconciliationrun",
            name="until",
            field=models.DateTimeField(),
        ),
        migrations.AddConstraint(
            model_name="reconciliationrun",
            constraint=models.UniqueConstraint(condition=models.Q(("scheduled", True)), fields=("until",), name="reconciliationrun_one_per_slot"),
        ),
    ]
