"""A run that drops partitions of both the webhook events and the audit trail never deletes rows while
it holds either table's parent (PostgreSQL).

A drop holds its table's parent until the commit, and every insert into that table waits behind it.
The drops came one table after the other (webhook events first), and a partition whose parent stayed
busy past the lock timeout (a reader of the trail) was emptied row by row right then: up to
PARTITION_EVENTS audit events deleted through the trigger while every webhook the intake received
waited (found in review). Decisions 52 and 55 promise a stall of the lock timeout at most. Here a
session holds one of the trail's rows while the run deletes them (standing for a delete that takes
long: a whole partition's events), and a webhook event is inserted meanwhile from another connection;
only that insert is timed.

The run commits (its locks must end for the insert to be timed at all), so the partitions made here
stay; the test leaves each table a whole partition ahead of its ids, as the sweeper keeps them."""

import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from dlq.archive import archive_expired
from ledger.models import AuditEvent
from ledger.partitions import AUDIT, WEBHOOKS
from tests.conftest import wait_until
from tests.factories import make_agent
from tests.ledger.test_partitions import noted, query, top, webhook_event

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's partitions and locks")]

LOCK_TIMEOUT = 0.2  # ledger.partitions.DDL_LOCK_TIMEOUT
# How long the trail's row stays locked once the run's delete waits for it: how long the insert
# waited while the run held the webhook events' parent. Far above the bound on a loaded machine.
HELD = 4.0
# The longest the insert may take: the lock timeout, and a second for a loaded 2-core machine.
BOUND = LOCK_TIMEOUT + 1.0


def deleting_behind(pid):
    """Whether a DELETE waits for a lock the session `pid` holds."""
    return query("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid)) "
                 "AND query ILIKE 'DELETE%%'", [pid])[0][0]


def test_a_webhook_insert_waits_no_longer_than_the_lock_timeout_while_the_trails_rows_are_deleted(settings, tmp_path):
    size = settings.PARTITION_EVENTS
    settings.PARTITION_EVENTS = 8
    agent, _ = make_agent("billing")
    AuditEvent.objects.seal()
    earlier = AuditEvent.objects.count()
    trail, hooks = top(), top(WEBHOOKS)
    try:
        query(f"SELECT setval('{AUDIT.table}_id_seq', %s, false)", [trail])
        query(f"SELECT setval('{WEBHOOKS.table}_id_seq', %s, false)", [hooks])
        AUDIT.extend(8)  # [trail, trail + 8) and [trail + 8, trail + 16)
        WEBHOOKS.extend(8)  # the same for the webhook events
        settings.AUDIT_CHECKPOINT_EVERY = earlier + 9  # on the first event past the trail's partition
        events = noted(agent, 12)
        AuditEvent.objects.seal()
        now = timezone.now()
        later = now + timedelta(days=401)
        for i in range(8):
            webhook_event(f"evt_old_{i}", now)  # the whole first partition, past its retention later
        webhook_event("evt_recent", later)

        params = connection.get_connection_params()
        outcome, waited = {}, []

        def archive():
            try:
                outcome["counts"] = archive_expired(tmp_path, now=later)[1]
            except Exception as exc:  # raised in the test below
                outcome["error"] = exc
            finally:
                connection.close()

        def insert(writer):
            started = time.monotonic()
            writer.execute("INSERT INTO ledger_webhookevent (connector, event_id, event_type, payload, operation_key, "
                           "received_at, outcome) VALUES ('sandbox', 'evt_meanwhile', 'refund.succeeded', '{}', '', "
                           "now(), '')")
            waited.append(time.monotonic() - started)

        with psycopg.connect(**{**params, "autocommit": False}) as reader, \
                psycopg.connect(**{**params, "autocommit": True}) as writer:
            # Held until it ends: the trail's parent (its drop stays busy) and one of its rows.
            reader.execute(f"SELECT id FROM {AUDIT.table} WHERE id = %s FOR UPDATE", [events[0].pk])
            run = threading.Thread(target=archive)
            run.start()
            wait_until(lambda: deleting_behind(reader.info.backend_pid) or "error" in outcome, seconds=60,
                       interval=0.02, message="the run to delete the trail's rows")
            intake = threading.Thread(target=insert, args=(writer,))
            intake.start()
            intake.join(HELD)
            reader.rollback()
            intake.join()
            run.join()
        if "error" in outcome:
            raise outcome["error"]

        assert waited[0] < BOUND, f"a webhook insert waited {waited[0]:.2f} s while the trail's rows were deleted"
        assert outcome["counts"]["ledger.webhookevent"] == 8
        assert outcome["counts"]["ledger.auditevent"] == earlier + 8
        assert f"{WEBHOOKS.table}_{hooks}" not in {p.name for p in WEBHOOKS.ranges()}  # dropped, last
        assert f"{AUDIT.table}_{trail}" in {p.name for p in AUDIT.ranges()}  # busy: its rows deleted instead
        assert query(f"SELECT count(*) FROM {AUDIT.table}_{trail}") == [(0,)]
        assert not AuditEvent.objects.filter(seq__lt=earlier + 9).exists()
        assert AuditEvent.objects.verify_chain() is None
    finally:
        AUDIT.extend(size)
        WEBHOOKS.extend(size)
