"""Shadow grants and replay runs: an action may be recorded `shadow` (never executed), a grant's
live state and review date live beside its permission, and every replay run is kept.

On SQLite, changing the status check rebuilds ledger_action: the triggers that name it (its
own, and those of the apps built on the ledger) would stop the rebuild or go with the old
table, so they are set aside first and created again, as they were, afterwards."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

_set_aside = []


def sqlite_triggers_aside(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND sql LIKE '%ledger_action%'")
        _set_aside[:] = cursor.fetchall()
    for name, _ in _set_aside:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


def sqlite_triggers_back(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    for _, sql in _set_aside:
        schema_editor.execute(sql)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0018_every_agent_has_an_owner'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(sqlite_triggers_aside, sqlite_triggers_back),
        migrations.RemoveConstraint(
            model_name='action',
            name='action_status_valid',
        ),
        migrations.AlterField(
            model_name='action',
            name='status',
            field=models.CharField(choices=[('queued', 'Queued'), ('awaiting_approval', 'Awaiting Approval'), ('held', 'Held'), ('pending', 'Pending'), ('unknown', 'Unknown'), ('needs_review', 'Needs Review'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('rejected', 'Rejected'), ('cancelled', 'Cancelled'), ('shadow', 'Shadow')], default='queued', max_length=20),
        ),
        migrations.AddConstraint(
            model_name='action',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review', 'succeeded', 'failed', 'rejected', 'cancelled', 'shadow'])), name='action_status_valid'),
        ),
        migrations.RunPython(sqlite_triggers_back, sqlite_triggers_aside),
        migrations.CreateModel(
            name='ReplayRun',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('action_type', models.CharField(max_length=40)),
                ('connector', models.CharField(blank=True, default='', max_length=50)),
                ('connector_class', models.CharField(blank=True, default='', max_length=255)),
                ('connector_options', models.JSONField(blank=True, default=dict)),
                ('connector_version', models.CharField(blank=True, default='', max_length=64)),
                ('ran_by', models.CharField(max_length=255)),
                ('started_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('passed', models.BooleanField(null=True)),
                ('cases', models.JSONField(blank=True, default=list)),
            ],
            options={
                'ordering': ['-started_at', '-id'],
                'indexes': [models.Index(fields=['action_type', '-started_at'], name='replayrun_recent_idx')],
            },
        ),
        migrations.CreateModel(
            name='Grant',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('live_until', models.DateTimeField(blank=True, null=True)),
                ('promoted_at', models.DateTimeField(blank=True, null=True)),
                ('agent', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='grant_states', to='ledger.agent')),
                ('capability', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='ledger.capability')),
                ('promoted_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('agent', 'capability'), name='grant_unique_agent_capability'), models.CheckConstraint(condition=models.Q(('live_until__isnull', True), models.Q(('promoted_by__isnull', False), ('promoted_at__isnull', False)), _connector='OR'), name='grant_live_has_promoter')],
            },
        ),
    ]
