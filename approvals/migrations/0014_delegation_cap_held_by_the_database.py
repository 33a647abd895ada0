"""A delegation lasts DELEGATION_MAX_DAYS (90) at the most, held by the database as well as by
approvals.delegation (which gives the friendly answer). Every stored delegation was refused
beyond it already, so the check holds on a populated table."""

import datetime
import django.db.models.expressions
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
            constraint=models.CheckConstraint(condition=models.Q(('ends_at__lte', django.db.models.expressions.CombinedExpression(models.F('starts_at'), '+', models.Value(datetime.timedelta(days=90))))), name='delegation_at_most_max_days'),
        ),
    ]
