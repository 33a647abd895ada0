"""The zero-configuration default, SQLite: the audit trail's rules hold there too, after every
migration (SQLite rebuilds a table to alter it, and a rebuild drops the table's triggers).

`make test` runs this module, and the other in-process ones named in the Makefile, a second
time on SQLite; on PostgreSQL these tests are skipped (test_audit_chain covers it there).
"""

import pytest
from django.db import DatabaseError, connection, transaction

from ledger.models import AuditEvent
from tests.factories import make_agent
# PostgreSQL's test, run here too: SQLite keeps a number's text, and the hash must hold there as well.
from tests.ledger.test_audit_chain import test_an_untouched_event_with_a_float_verifies  # noqa: F401

pytestmark = [
    # Not transaction=True: between such tests the database is emptied with DELETE, which
    # the rule under test refuses on SQLite (PostgreSQL empties with TRUNCATE).
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's own triggers"),
]


def refused(sql, params):
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


def test_events_can_be_sealed_once_and_never_changed_or_deleted():
    make_agent("billing")
    event = AuditEvent.objects.order_by("id").first()
    refused("UPDATE ledger_auditevent SET reason = 'rewritten' WHERE id = %s", [event.pk])
    refused("UPDATE ledger_auditevent SET seq = 1, reason = 'rewritten' WHERE id = %s", [event.pk])

    assert AuditEvent.objects.seal() == AuditEvent.objects.count() > 0
    assert AuditEvent.objects.verify_chain() is None

    refused("UPDATE ledger_auditevent SET seq = NULL WHERE id = %s", [event.pk])
    refused("UPDATE ledger_auditevent SET hash = 'x' WHERE id = %s", [event.pk])
    refused("DELETE FROM ledger_auditevent WHERE id = %s", [event.pk])
    assert AuditEvent.objects.get(pk=event.pk).reason == event.reason
