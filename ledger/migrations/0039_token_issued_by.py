"""Who an agent's current token was shown to: four eyes hold for them as for its owner (approvals
0015). Agents made before are filled in from the audit trail: the person of each one's latest
`agent_created` or `token_rotated` event (none for a command's)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# approvals' four-eyes triggers name ledger_agent: on SQLite a rebuild of the table (going back,
# the column removed) fails while they exist, so they are set aside meanwhile, and put back.
FOUR_EYES_TRIGGERS = ("approvals_four_eyes_approval", "approvals_four_eyes_decision")
_set_aside = []


def issuers_from_the_trail(apps, schema_editor):
    Agent, AuditEvent = apps.get_model("ledger", "Agent"), apps.get_model("ledger", "AuditEvent")
    people = apps.get_model(settings.AUTH_USER_MODEL).objects
    for agent in Agent.objects.all():
        event = (AuditEvent.objects.filter(object_type="ledger.agent", object_id=str(agent.pk),
                                           verb__in=["agent_created", "token_rotated"]).order_by("-id").first())
        person = event and event.actor.startswith("user:") and people.filter(username=event.actor[5:]).first()
        if person:
            Agent.objects.filter(pk=agent.pk).update(token_issued_by=person)


def triggers_set_aside(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name IN (%s, %s)", FOUR_EYES_TRIGGERS)
        _set_aside[:] = [sql for (sql,) in cursor.fetchall()]
    for name in FOUR_EYES_TRIGGERS:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


def triggers_put_back(apps, schema_editor):
    for sql in _set_aside:
        schema_editor.execute(sql)
    _set_aside.clear()


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0038_refund_once_per_decision_in_tasks_too'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, triggers_put_back),
        migrations.AddField(
            model_name='agent',
            name='token_issued_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.RunPython(issuers_from_the_trail, triggers_set_aside),
    ]
