"""An entry's page offers its reader the reasons they gave for their latest redrives: the page's query
reads them from an index of the redriven entries by who redrove them, newest first, not by reading and
sorting every redriven entry (PostgreSQL's plan of the very statement the page sent)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dlq.models import Alert, DeadLetter, EntryStatus
from tests.factories import make_action, make_agent, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis"),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plans")]
PEOPLE = 50


def test_the_redrive_reasons_on_an_entrys_page_are_read_from_their_index(client):
    agent, _ = make_agent("billing")
    action = make_action(agent, "failed", key="refund:ORD-1:full:dec-1", target="ORD-1")
    entry = DeadLetter.objects.open_for_action(action, actor="system:executor")
    now = timezone.now()
    # Entries redriven by many people over time: each person's are a small part of them.
    redriven = DeadLetter.objects.bulk_create(
        DeadLetter(action=action, status=EntryStatus.REDRIVEN, snapshot={}, attempts=1,
                   decided_by=f"user:p{n % PEOPLE}" if n % PEOPLE else "user:olga",
                   decided_at=now - timedelta(minutes=n), note=f"provider fixed ({n % 7})")
        for n in range(5000))
    # Every entry has its alert (the database checks it at the commit).
    Alert.objects.bulk_create(Alert(kind=Alert.Kind.DEAD_LETTER, dead_letter=e, subject="dead letter", link="/dlq/")
                              for e in redriven)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE dlq_deadletter")
    client.force_login(person("olga", "operators"))

    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/dlq/{entry.pk}/").content.decode()
    assert 'value="provider fixed (0)"' in page
    [reasons] = [q["sql"] for q in queries.captured_queries if '"decided_by" = ' in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {reasons}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "deadletter_redriven_by_idx" in plan, plan
    assert "Sort" not in plan and "Seq Scan" not in plan, plan
