"""Approvals bound to the params a person saw (approved_fingerprint), versions of an action a
person edited down (supersedes; the original ends `superseded`) and approval waits that
expire (`expired`, whose error says approval_expired, held by a check).

On SQLite the changes rebuild the tables they touch, and a rebuild drops the triggers on
them and is stopped by triggers naming them: every trigger naming a rebuilt table is set
aside first and created again, as it was, afterwards (as in 0019). The database rules'
renderings did not change (the in-flight list is the same), so nothing else is installed."""

import django.db.models.deletion
from django.db import migrations, models


class TriggersAside:
    """SQLite: the triggers naming any of `tables`, dropped before and created again after."""

    def __init__(self, *tables):
        self.tables, self.kept = tables, []

    def aside(self, apps, schema_editor):
        if schema_editor.connection.vendor != "sqlite":
            return
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
            self.kept[:] = [(name, sql) for name, sql in cursor.fetchall() if any(t in sql for t in self.tables)]
        for name, _ in self.kept:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")

    def back(self, apps, schema_editor):
        if schema_editor.connection.vendor != "sqlite":
            return
        for _, sql in self.kept:
            schema_editor.execute(sql)

    def around(self, operations):
        return [migrations.RunPython(self.aside, self.back), *operations, migrations.RunPython(self.back, self.aside)]


_action = TriggersAside("ledger_action")


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0019_shadow_grants_and_replay_runs'),
    ]

    operations = _action.around([
        migrations.RemoveConstraint(
            model_name='action',
            name='action_status_valid',
        ),
        migrations.AddField(
            model_name='action',
            name='approved_fingerprint',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='action',
            name='supersedes',
            field=models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='superseded_by', to='ledger.action'),
        ),
        migrations.AlterField(
            model_name='action',
            name='status',
            field=models.CharField(choices=[('queued', 'Queued'), ('awaiting_approval', 'Awaiting Approval'), ('held', 'Held'), ('pending', 'Pending'), ('unknown', 'Unknown'), ('needs_review', 'Needs Review'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('rejected', 'Rejected'), ('cancelled', 'Cancelled'), ('shadow', 'Shadow'), ('expired', 'Expired'), ('superseded', 'Superseded')], default='queued', max_length=20),
        ),
        migrations.AddConstraint(
            model_name='action',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review', 'succeeded', 'failed', 'rejected', 'cancelled', 'shadow', 'expired', 'superseded'])), name='action_status_valid'),
        ),
        migrations.AddConstraint(
            model_name='action',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('status', 'expired'), _negated=True), ('error__code', 'approval_expired'), _connector='OR'), name='action_expired_says_so'),
        ),
    ])
