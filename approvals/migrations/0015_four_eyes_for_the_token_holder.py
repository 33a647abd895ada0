"""Four eyes hold for the person an agent's token was shown to (ledger.Agent.token_issued_by: who
created it or last rotated its token), as for its owner: they can act as the agent, so they never
approve or decide its requests, nor does their delegate. SQL frozen here as `manage.py dbrules
approvals` printed it; the functions (PostgreSQL) and triggers (SQLite) of 0012, widened."""

import importlib

from django.db import migrations

PG_FORWARD = r"""
CREATE OR REPLACE FUNCTION approvals_four_eyes_approval() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = (SELECT action_id FROM approvals_reviewitem WHERE id = NEW.item_id) AND (g.owner_id IN (NEW.user_id, NEW.on_behalf_of_id) OR g.token_issued_by_id IN (NEW.user_id, NEW.on_behalf_of_id))) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: the owner of the agent that asked, or who holds its token, may not approve it',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM approvals_approval p WHERE p.item_id = NEW.item_id
                AND (p.user_id IN (NEW.user_id, NEW.on_behalf_of_id) OR p.on_behalf_of_id IN (NEW.user_id, NEW.on_behalf_of_id))) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: a person and their delegate give one approval between them',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION approvals_four_eyes_decision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.decided_by_id IS NOT NULL AND EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = NEW.action_id AND (g.owner_id IN (NEW.decided_by_id, NEW.decided_for_id) OR g.token_issued_by_id IN (NEW.decided_by_id, NEW.decided_for_id))) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: the owner of the agent that asked, or who holds its token, may not decide it',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.status = 'approved' AND NEW.approvals_needed > 1 AND (SELECT count(*) FROM approvals_approval WHERE item_id = NEW.id) < NEW.approvals_needed THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: this item needs its approvals from different people',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
"""
SQLITE_CREATE = [r"""CREATE TRIGGER approvals_four_eyes_approval BEFORE INSERT ON approvals_approval
WHEN EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = (SELECT action_id FROM approvals_reviewitem WHERE id = NEW.item_id) AND (g.owner_id IN (NEW.user_id, NEW.on_behalf_of_id) OR g.token_issued_by_id IN (NEW.user_id, NEW.on_behalf_of_id))) OR EXISTS (SELECT 1 FROM approvals_approval p WHERE p.item_id = NEW.item_id
                AND (p.user_id IN (NEW.user_id, NEW.on_behalf_of_id) OR p.on_behalf_of_id IN (NEW.user_id, NEW.on_behalf_of_id)))
BEGIN
    SELECT RAISE(ABORT, 'four eyes: the owner of the agent that asked, or who holds its token, may not approve it, and a person and their delegate give one approval between them');
END""",
                 r"""CREATE TRIGGER approvals_four_eyes_decision BEFORE UPDATE OF status ON approvals_reviewitem
WHEN (NEW.decided_by_id IS NOT NULL AND EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = NEW.action_id AND (g.owner_id IN (NEW.decided_by_id, NEW.decided_for_id) OR g.token_issued_by_id IN (NEW.decided_by_id, NEW.decided_for_id))))
    OR (NEW.status = 'approved' AND NEW.approvals_needed > 1 AND (SELECT count(*) FROM approvals_approval WHERE item_id = NEW.id) < NEW.approvals_needed)
BEGIN
    SELECT RAISE(ABORT, 'four eyes: the owner of the agent that asked, or who holds its token, may not decide it, and two approvals come from two people');
END"""]

DELEGATIONS = importlib.import_module("approvals.migrations.0012_delegations")


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FORWARD)
        return
    for sql in [*DELEGATIONS.SQLITE_DROP, *SQLITE_CREATE]:
        schema_editor.execute(sql)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DELEGATIONS.PG_FORWARD)
        return
    for sql in [*DELEGATIONS.SQLITE_DROP, *DELEGATIONS.SQLITE_CREATE]:
        schema_editor.execute(sql)


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0014_delegation_cap_held_by_the_database'),
        ('ledger', '0039_token_issued_by'),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
