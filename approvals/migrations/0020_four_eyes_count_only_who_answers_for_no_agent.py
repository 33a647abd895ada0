"""Four eyes count the approvals at an item's move to approved, not only check each one at its
insert: an approval given by a person named the agent's owner since, or shown its token since (or
given for such a person by their delegate), counts no more, or the owner and one other would
approve. SQL frozen here as `manage.py dbrules approvals` printed it; the decision's function
(PostgreSQL) and trigger (SQLite) of 0015, narrowed. Backward: 0015's."""

import importlib

from django.db import migrations

PG_FORWARD = r"""
CREATE OR REPLACE FUNCTION approvals_four_eyes_decision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.decided_by_id IS NOT NULL AND EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = NEW.action_id AND (g.owner_id IN (NEW.decided_by_id, NEW.decided_for_id) OR g.token_issued_by_id IN (NEW.decided_by_id, NEW.decided_for_id))) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: the owner of the agent that asked, or who holds its token, may not decide it',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.status = 'approved' AND NEW.approvals_needed > 1 AND (SELECT count(*) FROM approvals_approval p WHERE p.item_id = NEW.id AND NOT EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = NEW.action_id AND (g.owner_id IN (p.user_id, p.on_behalf_of_id) OR g.token_issued_by_id IN (p.user_id, p.on_behalf_of_id)))) < NEW.approvals_needed THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: this item needs its approvals from different people, none of whom answers for the agent that asked',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
"""
SQLITE_DROP = "DROP TRIGGER approvals_four_eyes_decision"
SQLITE_CREATE = r"""CREATE TRIGGER approvals_four_eyes_decision BEFORE UPDATE OF status ON approvals_reviewitem
WHEN (NEW.decided_by_id IS NOT NULL AND EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = NEW.action_id AND (g.owner_id IN (NEW.decided_by_id, NEW.decided_for_id) OR g.token_issued_by_id IN (NEW.decided_by_id, NEW.decided_for_id))))
    OR (NEW.status = 'approved' AND NEW.approvals_needed > 1 AND (SELECT count(*) FROM approvals_approval p WHERE p.item_id = NEW.id AND NOT EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = NEW.action_id AND (g.owner_id IN (p.user_id, p.on_behalf_of_id) OR g.token_issued_by_id IN (p.user_id, p.on_behalf_of_id)))) < NEW.approvals_needed)
BEGIN
    SELECT RAISE(ABORT, 'four eyes: the owner of the agent that asked, or who holds its token, may not decide it nor count among its two approvals, and two approvals come from two people');
END"""

TOKEN_HOLDER = importlib.import_module("approvals.migrations.0015_four_eyes_for_the_token_holder")


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FORWARD)
        return
    for sql in [SQLITE_DROP, SQLITE_CREATE]:
        schema_editor.execute(sql)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TOKEN_HOLDER.PG_FORWARD)
        return
    for sql in [SQLITE_DROP, TOKEN_HOLDER.SQLITE_CREATE[1]]:
        schema_editor.execute(sql)


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0019_no_customer_shares_a_daily_total'),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
