"""A task's replay is answered from its row, as an action's is (decisions 07 and 71): a body equal
to the one recorded was valid when it was recorded, and the contract promises its same answer,
`200`, for the key's lifetime, whatever rules came since. The rule here: which currencies are
tender today. ledger.currencies reads the day from the host's calendar (django.utils.timezone in
that module), which the test sets, for that module alone, to a day before and then a day after
Bulgaria stopped taking the lev (31 January 2026 in CLDR's data).

No live server: the test client, and the run's own Redis for the doorbell (no worker listens),
so nothing is executed."""

import json
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger import currencies
from ledger.models import AuditEvent, Task
from tests.factories import make_agent_on

BODY = {"workflow": "refund", "input": {"order_id": "ORD-BG", "amount": "25.00", "currency": "BGN",
                                         "customer": "CUST-BG"}}


@pytest.fixture
def billing(client, db, jobs_to_test_redis):
    return make_agent_on(client)


def post_task(client, task_id, body):
    return client.post("/api/v1/tasks", json.dumps(body), content_type="application/json",
                       headers={"Idempotency-Key": task_id})


def on_the_hosts_calendar(monkeypatch, day):
    """The day ledger.currencies takes for today."""
    moment = datetime(*day, 12, tzinfo=UTC)
    monkeypatch.setattr(currencies, "timezone", SimpleNamespace(now=lambda: moment))


def statements(queries):
    control = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
    return [q["sql"] for q in queries.captured_queries if not q["sql"].lstrip().upper().startswith(control)]


def test_a_task_recorded_in_a_currency_no_longer_tender_is_replayed_as_it_was_answered(client, billing, monkeypatch):
    on_the_hosts_calendar(monkeypatch, (2026, 1, 15))
    first = post_task(client, "refund-bg-1", BODY)
    assert first.status_code == 201, first.content

    on_the_hosts_calendar(monkeypatch, (2026, 2, 15))
    refused = post_task(client, "refund-bg-2", BODY)  # a new task in the lev is refused now
    assert refused.status_code == 400 and "input.currency" in refused.json()["errors"]
    events = AuditEvent.objects.count()
    with CaptureQueriesContext(connection) as queries:
        again = post_task(client, "refund-bg-1", BODY)

    assert again.status_code == 200, again.content
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    # Answered from the row: no transaction, no lock, no write.
    assert not any(q["sql"].startswith(("BEGIN", "INSERT", "UPDATE")) for q in queries.captured_queries)
    assert not any(" FOR " in sql for sql in statements(queries)), statements(queries)
    assert AuditEvent.objects.count() == events and Task.objects.count() == 1


def test_a_task_asked_in_another_spelling_is_validated_as_it_is_asked_today(client, billing, monkeypatch):
    """Only the very body recorded is answered from the row: another spelling of it takes the full
    path, and today's rules."""
    on_the_hosts_calendar(monkeypatch, (2026, 1, 15))
    assert post_task(client, "refund-bg-1", BODY).status_code == 201
    assert post_task(client, "refund-bg-1", {**BODY, "input": {**BODY["input"], "currency": "bgn"}}).status_code == 200

    on_the_hosts_calendar(monkeypatch, (2026, 2, 15))
    spelled = post_task(client, "refund-bg-1", {**BODY, "input": {**BODY["input"], "currency": "bgn"}})
    assert spelled.status_code == 400


def test_a_new_task_costs_no_more_looks_before_its_transaction(client, billing):
    """The look that answers a replay from the row is the intake's own look for the id."""
    body = {"workflow": "refund", "input": {"order_id": "ORD-1", "amount": "25.00", "currency": "EUR",
                                            "customer": "CUST-1"}}
    assert post_task(client, "refund-1", body).status_code == 201  # the grant is now cached
    with CaptureQueriesContext(connection) as queries:
        assert post_task(client, "refund-2", {**body, "input": {**body["input"], "order_id": "ORD-2"}}
                         ).status_code == 201

    sql = [q["sql"] for q in queries.captured_queries]
    before = sql[:next(i for i, q in enumerate(sql) if q.startswith(("BEGIN", "SAVEPOINT")))]
    assert len(before) == 2 and "ledger_agent" in before[0] and "ledger_task" in before[1], before
