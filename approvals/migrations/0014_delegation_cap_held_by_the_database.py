"""A delegation lasts DELEGATION_MAX_DAYS (90) at the most, held by the database as well as by
approvals.delegation (which gives the friendly answer), as a length, whatever the session's time
zone. Every stored delegation was refused beyond it already, so the check holds on a populated
table."""

import datetime
import django.db.models.expressions
import django.db.models.lookups
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0013_summary_day_stale_once'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddConstraint(
            model_name='delegation',
            constraint=models.CheckConstraint(condition=django.db.models.lookups.LessThanOrEqual(models.ExpressionWrapper(django.db.models.expressions.CombinedExpression(models.F('ends_at'), '-', models.F('starts_at')), output_field=models.DurationField()), datetime.timedelta(days=90)), name='delegation_at_most_max_days'),
        ),
    ]
