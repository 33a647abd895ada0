"""Four eyes held by the database (approvals/dbrules.py): the owner of the agent that asked
never approves (approvals_approval) nor decides (approvals_reviewitem.decided_by, new) its
request, and an item that needs two approvals is approved only with two rows, which are
unique per person. The SQL is frozen here as `manage.py dbrules approvals` printed it."""


import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

PG_FORWARD = r"""
CREATE OR REPLACE FUNCTION approvals_four_eyes_approval() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = (SELECT action_id FROM approvals_reviewitem WHERE id = NEW.item_id) AND g.owner_id = NEW.user_id) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: the owner of the agent that asked may not approve it',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION approvals_four_eyes_decision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.decided_by_id IS NOT NULL AND EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = NEW.action_id AND g.owner_id = NEW.decided_by_id) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: the owner of the agent that asked may not decide it',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.status = 'approved' AND NEW.approvals_needed > 1 AND (SELECT count(*) FROM approvals_approval WHERE item_id = NEW.id) < NEW.approvals_needed THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: this item needs its approvals from different people',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER approvals_four_eyes_approval BEFORE INSERT ON approvals_approval
    FOR EACH ROW EXECUTE FUNCTION approvals_four_eyes_approval();
CREATE TRIGGER approvals_four_eyes_decision BEFORE UPDATE OF status ON approvals_reviewitem
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION approvals_four_eyes_decision();
"""

PG_BACKWARD = """
DROP TRIGGER approvals_four_eyes_decision ON approvals_reviewitem;
DROP TRIGGER approvals_four_eyes_approval ON approvals_approval;
DROP FUNCTION approvals_four_eyes_decision();
DROP FUNCTION approvals_four_eyes_approval();
"""

SQLITE_FORWARD = [
    r"""CREATE TRIGGER approvals_four_eyes_approval BEFORE INSERT ON approvals_approval
WHEN EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = (SELECT action_id FROM approvals_reviewitem WHERE id = NEW.item_id) AND g.owner_id = NEW.user_id)
BEGIN
    SELECT RAISE(ABORT, 'four eyes: the owner of the agent that asked may not approve it');
END""",
    r"""CREATE TRIGGER approvals_four_eyes_decision BEFORE UPDATE OF status ON approvals_reviewitem
WHEN (NEW.decided_by_id IS NOT NULL AND EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = NEW.action_id AND g.owner_id = NEW.decided_by_id))
    OR (NEW.status = 'approved' AND NEW.approvals_needed > 1 AND (SELECT count(*) FROM approvals_approval WHERE item_id = NEW.id) < NEW.approvals_needed)
BEGIN
    SELECT RAISE(ABORT, 'four eyes: the owner of the agent that asked may not decide it, and two approvals come from two people');
END""",
]

SQLITE_BACKWARD = ["DROP TRIGGER approvals_four_eyes_decision;", "DROP TRIGGER approvals_four_eyes_approval;"]


def forward(apps, schema_editor):
    for sql in [PG_FORWARD] if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD:
        schema_editor.execute(sql)


def backward(apps, schema_editor):
    for sql in [PG_BACKWARD] if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD:
        schema_editor.execute(sql)


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0005_limit_rules_held_by_the_database'),
        # After the ledger's own: on SQLite a trigger naming another app's table breaks that
        # table's rebuild, so these come once ledger_agent's owner is NOT NULL.
        ('ledger', '0018_every_agent_has_an_owner'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='reviewitem',
            name='decided_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.RunPython(forward, backward),
    ]
