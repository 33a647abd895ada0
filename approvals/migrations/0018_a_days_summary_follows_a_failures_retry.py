"""A customer's daily total counts a failure that may be retried (approvals.intake.IN_DAILY_TOTAL):
a past day's summary goes stale when an action's error changes too (a failure given up, or allowed
a retry, keeps its status), and every summary made under the old count is stale once, to be made
again by the sweeper. PostgreSQL only, as the summaries are (0009)."""

from django.db import migrations

PG_FORWARD = """
DROP TRIGGER approvals_summary_stale_change ON ledger_action;
CREATE TRIGGER approvals_summary_stale_change
    AFTER UPDATE OF status, error, amount, customer, supersedes_id, action_type, currency, created_at OR DELETE
    ON ledger_action
    FOR EACH ROW WHEN (OLD.created_at < date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
    EXECUTE FUNCTION approvals_summary_stale();
UPDATE approvals_summaryday SET stale = true WHERE NOT stale;
"""
PG_BACKWARD = """
DROP TRIGGER approvals_summary_stale_change ON ledger_action;
CREATE TRIGGER approvals_summary_stale_change
    AFTER UPDATE OF status, amount, customer, supersedes_id, action_type, currency, created_at OR DELETE
    ON ledger_action
    FOR EACH ROW WHEN (OLD.created_at < date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
    EXECUTE FUNCTION approvals_summary_stale();
UPDATE approvals_summaryday SET stale = true WHERE NOT stale;
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0017_no_first_approval_after_its_window"),
    ]

    operations = [migrations.RunPython(forward, backward)]
