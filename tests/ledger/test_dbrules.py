"""The database holds the rules the code renders (ledger/dbrules.py and each app's): a status
added to an enum, or a rule changed in Python, without a migration installing the new
rendering fails here. Runs on PostgreSQL and, in `make test`'s second run, on SQLite."""

import pytest
from django.db import connection

from approvals.dbrules import RULES as APPROVALS_RULES
from dlq.dbrules import RULES as DLQ_RULES
from ledger import dbrules
from ledger.models import IN_FLIGHT_STATUSES, ActionStatus

RULES = [*dbrules.RULES, *APPROVALS_RULES, *DLQ_RULES]


@pytest.mark.django_db
@pytest.mark.parametrize("rule", RULES, ids=lambda rule: f"{type(rule).__name__}:{rule.name}")
def test_the_database_holds_each_rule_as_the_code_renders_it(rule):
    if rule not in dbrules.for_vendor(RULES, connection.vendor):
        pytest.skip(f"a {type(rule).__name__} is not for {connection.vendor}")
    assert dbrules.installed(connection, rule) == dbrules.rendered(rule), (
        f"{rule.name} differs from the database: add a migration with `manage.py dbrules`'s output")


def test_the_in_flight_list_in_sql_is_the_python_one():
    assert dbrules.IN_FLIGHT == "(" + ", ".join(f"'{s}'" for s in ActionStatus.values if s in IN_FLIGHT_STATUSES) + ")"
    assert all(f"'{status}'" in dbrules.IN_FLIGHT for status in IN_FLIGHT_STATUSES)


@pytest.mark.django_db
def test_a_status_missing_from_the_sql_is_caught(monkeypatch):
    """What the rules test does when Python moves on and the migrations do not."""
    rule = dbrules.SAME_SUBJECT if connection.vendor == "postgresql" else dbrules.SAME_SUBJECT_SQLITE
    field = "body" if connection.vendor == "postgresql" else "sql"
    drifted = type(rule)(**{**rule.__dict__, field: getattr(rule, field).replace("'needs_review'", "'needs_review', 'paused'")})
    assert dbrules.installed(connection, drifted) != dbrules.rendered(drifted)
