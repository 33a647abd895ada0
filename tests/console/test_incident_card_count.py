"""The overview's incidents card is polled every 3 s: how many open incidents this person may work is
counted as far as the open ones are (OPEN_EXACT_UP_TO, "10,000+" past it), never every open one."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dlq.incidents import Incident, IncidentKind
from dlq.reconcile import Finding
from tests.factories import person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


def orphan(n):
    key = f"refund:ORD-{n}:full:dec-{n}"
    effect = {"external_ref": f"re_{n}", "amount": "80.00", "currency": "EUR",
              "created_at": timezone.now().isoformat()}
    return Incident.objects.open_for(Finding(IncidentKind.ORPHAN_EFFECT, "sandbox", "refund", key, key,
                                             effects=[effect]), actor="system:reconcile")


def test_the_incidents_this_person_may_work_are_counted_only_up_to_the_cap(client, monkeypatch):
    monkeypatch.setattr("console.incident_views.OPEN_EXACT_UP_TO", 2)
    for n in range(4):
        orphan(n)
    client.force_login(person("olga", "operators"))
    with CaptureQueriesContext(connection) as queries:
        page = client.get("/", {"partial": "counts"}, headers={"HX-Request": "true"}).content.decode()
    card = page.split('data-queue="incidents"')[1].split("</a>")[0]
    assert '<span class="count" id="incidents-open">2+</span> open' in card
    assert "<strong>2+</strong> waiting for me" in card
    # Read no further than the cap and one, as the open ones are.
    counts = [q["sql"] for q in queries.captured_queries if 'FROM "dlq_incident"' in q["sql"] and "COUNT(" in q["sql"]]
    assert len(counts) == 2 and all("LIMIT 3" in sql for sql in counts)
