"""The partitions of the audit trail and of the webhook events (PostgreSQL): made ahead of the
ids by the sweeper, never needed from the default partition while it runs, dropped whole by the
archive once every row in them is archived; once the ids are past the ranges (the sweeper was
away), the next starts HEADROOM above them, so that the writers never reach it before it is
attached; the conversion keeps a populated table's rows, ids, indexes and trigger; a partitioned
trail still holds one event per seq (the seal's rule, on SQLite too), and a webhook event's id is
still claimed once.

Each test runs in one transaction that is rolled back, DDL included; only the id sequence,
which PostgreSQL never rolls back, is put back by hand. The test whose second session must see
its partitions commits them, and drops them when it ends."""

import importlib
import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.sweeper import sweep_once
from dlq.archive import archive_expired
from ledger.audit import chain_hash
from ledger.models import AuditEvent, WebhookClaim, WebhookEvent
from ledger.partitions import AUDIT, HEADROOM, WEBHOOKS, Partitioned
from tests.conftest import wait_until
from tests.factories import make_agent
from tests.ledger.test_webhooks import SECRET, deliver, event

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="partitions are PostgreSQL's")
conversion = importlib.import_module("ledger.migrations.0032_audit_trail_partitioned")


def query(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else None


@pytest.fixture
def sequence():
    """Where the next id of a table (the audit trail's unless told) will be; put back afterwards
    (a sequence is not rolled back)."""
    kept = {}

    def move(next_id, table=AUDIT.table):
        if table not in kept:
            kept[table] = query(f"SELECT last_value, is_called FROM {table}_id_seq")[0]
        query(f"SELECT setval('{table}_id_seq', %s, false)", [next_id])

    yield move
    for table, (last, called) in kept.items():
        query(f"SELECT setval('{table}_id_seq', %s, %s)", [last, called])


def noted(agent, n):
    with transaction.atomic():
        return [AuditEvent.objects.record(actor="system:test", verb="noted", obj=agent, reason=f"note {i}")
                for i in range(n)]


def partition_of(row):
    return query(f"SELECT tableoid::regclass::text FROM {row._meta.db_table} WHERE id = %s", [row.pk])[0][0]


def top(table=AUDIT):
    return table.ranges()[-1].high


@postgresql_only
def test_after_migrate_the_trail_is_partitioned_with_a_whole_partition_ahead_and_every_index(settings):
    assert AUDIT.active()
    (next_id,), = query("SELECT nextval('ledger_auditevent_id_seq')")
    assert top() - next_id >= settings.PARTITION_EVENTS
    assert query(f"SELECT count(*) FROM {AUDIT.default}") == [(0,)]
    indexes = {name for (name,) in query("SELECT indexname FROM pg_indexes WHERE tablename = %s",
                                         [AUDIT.table])}
    assert indexes == {index.name for index in AuditEvent._meta.indexes} | {"ledger_auditevent_pkey"}


@postgresql_only
def test_the_sweeper_makes_the_next_partition_before_the_ids_reach_it(settings, sequence):
    settings.PARTITION_EVENTS = 4
    agent, _ = make_agent("billing")
    current, ahead = AUDIT.ranges()[-1].name, top()
    sequence(ahead - 2)  # two ids left in the partitions made so far
    assert sweep_once()["partitions_made"] == 1
    events = noted(agent, 6)
    assert [partition_of(event) for event in events] == [current] * 2 + [f"{AUDIT.table}_{ahead}"] * 4
    assert sweep_once()["partitions_made"] == 2  # the one now written is full: two ahead again
    assert sweep_once()["partitions_made"] == 0
    # The seal updated each event in its own partition, in the chain's order.
    assert not AuditEvent.objects.filter(seq__isnull=True).exists()
    assert AuditEvent.objects.verify_chain() is None


@postgresql_only
def test_ids_the_default_partition_took_stay_there_and_the_next_range_starts_headroom_above_them(
        settings, sequence):
    settings.PARTITION_EVENTS = 4
    agent, _ = make_agent("billing")
    sequence(top() + 10)  # the sweeper was away while the ids passed every partition
    stray, = noted(agent, 1)
    assert partition_of(stray) == AUDIT.default
    assert AUDIT.extend(settings.PARTITION_EVENTS) == 2
    low = AUDIT.ranges()[-2].low
    assert low == stray.pk + 1 + HEADROOM
    after, = noted(agent, 1)
    assert partition_of(after) == AUDIT.default  # an id the writers could have taken during the pass
    sequence(low)
    reached, = noted(agent, 1)
    assert partition_of(reached) == f"{AUDIT.table}_{low}"
    assert partition_of(AuditEvent.objects.get(pk=stray.pk)) == AUDIT.default
    assert AuditEvent.objects.seal() == AuditEvent.objects.count()
    assert AuditEvent.objects.verify_chain() is None


@postgresql_only
def test_a_table_whose_every_range_the_archive_dropped_gets_the_next_above_its_ids(settings, sequence):
    settings.PARTITION_EVENTS = 4
    sequence(top(WEBHOOKS) + 10, WEBHOOKS.table)  # the ids passed every partition
    stray = webhook_event("evt_stray", timezone.now())
    for partition in WEBHOOKS.ranges():  # and an archive run dropped each one
        query(f"DROP TABLE {partition.name}")
    assert WEBHOOKS.extend(settings.PARTITION_EVENTS) == 2
    assert WEBHOOKS.ranges()[0].low == stray.pk + 1 + HEADROOM
    assert partition_of(stray) == WEBHOOKS.default


@postgresql_only
def test_a_partition_waits_for_the_next_pass_while_a_reader_holds_the_trail(settings, sequence, caplog):
    settings.PARTITION_EVENTS = 4
    sequence(top() - 2)
    params = connection.get_connection_params()
    with psycopg.connect(**{**params, "autocommit": False}) as reader:
        reader.execute("SELECT count(*) FROM ledger_auditevent")  # its lock is held until it ends
        assert AUDIT.extend(settings.PARTITION_EVENTS) == 0
        assert "stayed busy" in caplog.text
    assert AUDIT.extend(settings.PARTITION_EVENTS) == 1


def test_a_seal_at_a_seq_an_event_already_holds_is_refused():
    agent, _ = make_agent("billing")
    AuditEvent.objects.seal()
    held = AuditEvent.objects.filter(seq__isnull=False).order_by("-seq").first()
    before = AuditEvent.objects.get(seq=held.seq - 1)
    late, = noted(agent, 1)
    # The next link after `before` in every way but one: `held` is already there.
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=late.pk).update(
            seq=held.seq, prev_hash=before.hash, hash=chain_hash(before.hash, late.content_hash, held.seq))
    assert AuditEvent.objects.seal() == 1
    assert AuditEvent.objects.verify_chain() is None


@postgresql_only
def test_the_archive_drops_a_partition_whose_events_it_has_all_archived(settings, sequence, tmp_path):
    settings.PARTITION_EVENTS = 8
    agent, _ = make_agent("billing")
    AuditEvent.objects.seal()
    earlier = AuditEvent.objects.count()
    start = top()
    sequence(start)
    AUDIT.extend(settings.PARTITION_EVENTS)  # [start, start + 8) and [start + 8, start + 16)
    # The first checkpoint falls on the first event after the partition: the archive takes
    # every event before it.
    settings.AUDIT_CHECKPOINT_EVERY = earlier + 9
    events = noted(agent, 12)
    AuditEvent.objects.seal()
    assert {partition_of(event) for event in events[:8]} == {f"{AUDIT.table}_{start}"}

    with CaptureQueriesContext(connection) as queries:
        archive, counts = archive_expired(tmp_path, now=timezone.now() + timedelta(days=401))

    # The drop comes last: it holds the trail's parent, and every insert into it, until the commit.
    statements = [q["sql"] for q in queries]
    drops = [i for i, sql in enumerate(statements) if sql.startswith("DROP TABLE")]
    writes = [i for i, sql in enumerate(statements) if sql.startswith(("DELETE", "INSERT"))]
    assert drops and min(drops) > max(writes), statements
    assert archive.checkpoint.seq == earlier + 9
    assert counts["ledger.auditevent"] == earlier + 8
    names = {p.name for p in AUDIT.ranges()}
    assert f"{AUDIT.table}_{start}" not in names
    assert f"{AUDIT.table}_{start + 8}" in names  # it holds the checkpoint's event
    assert not AuditEvent.objects.filter(seq__lt=archive.checkpoint.seq).exists()
    assert sum(1 for line in (tmp_path / archive.file).read_text().splitlines()
               if '"model":"ledger.auditevent"' in line) == earlier + 8
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None


@postgresql_only
def test_the_conversion_keeps_a_populated_tables_rows_ids_indexes_and_trigger():
    query("CREATE TABLE scratch (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, note text NOT NULL)")
    query("CREATE INDEX scratch_note_idx ON scratch (note)")
    query("CREATE FUNCTION scratch_refuse() RETURNS trigger LANGUAGE plpgsql AS "
          "$$ BEGIN RAISE EXCEPTION 'refused'; END $$")
    trigger = "CREATE TRIGGER scratch_refuse BEFORE DELETE ON scratch FOR EACH ROW EXECUTE FUNCTION scratch_refuse()"
    query(trigger)
    query("INSERT INTO scratch (note) SELECT 'row ' || i FROM generate_series(1, 5) i")

    with connection.cursor() as cursor:
        conversion.partition_by_id(cursor, "scratch", [trigger])

    assert query("SELECT relkind FROM pg_class WHERE relname = 'scratch'") == [("p",)]
    assert query("SELECT id, tableoid::regclass::text FROM scratch ORDER BY id") == [
        (i, "scratch_first") for i in range(1, 6)]
    query("CREATE TABLE scratch_6 PARTITION OF scratch FOR VALUES FROM (6) TO (100)")
    assert query("INSERT INTO scratch (note) VALUES ('new') RETURNING id, tableoid::regclass::text") == [
        (6, "scratch_6")]
    assert {name for (name,) in query("SELECT indexname FROM pg_indexes WHERE tablename = 'scratch'")} == {
        "scratch_pkey", "scratch_note_idx"}
    with pytest.raises(DatabaseError, match="refused"), transaction.atomic():
        query("DELETE FROM scratch WHERE id = 1")


@postgresql_only
def test_a_run_takes_the_lowest_partition_whole_past_several_checkpoints_and_drops_it(settings, sequence, tmp_path):
    settings.PARTITION_EVENTS = 8
    agent, _ = make_agent("billing")
    AuditEvent.objects.seal()
    start = top()
    sequence(start)
    AUDIT.extend(settings.PARTITION_EVENTS)  # [start, start + 8) and [start + 8, start + 16)
    settings.AUDIT_CHECKPOINT_EVERY = 3  # three checkpoints fall inside the partition
    events = noted(agent, 12)
    AuditEvent.objects.seal()
    partition = f"{AUDIT.table}_{start}"
    last_in_it = AuditEvent.objects.get(pk=events[7].pk).seq

    found_by_each_run = []
    while partition in {p.name for p in AUDIT.ranges()} and len(found_by_each_run) < 10:
        found_by_each_run.append(query(f"SELECT count(*) FROM {partition}")[0][0])
        archive, _ = archive_expired(tmp_path, now=timezone.now() + timedelta(days=401))

    # The run that dropped it found all eight events there: no run before it deleted a stretch.
    assert found_by_each_run[-1] == 8, found_by_each_run
    assert archive.checkpoint.seq > last_in_it
    assert not AuditEvent.objects.filter(seq__lt=archive.checkpoint.seq).exists()
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None


@postgresql_only
def test_while_the_checkpoint_past_the_lowest_partition_is_too_young_no_audit_event_goes(
        settings, sequence, tmp_path, monkeypatch):
    settings.PARTITION_EVENTS = 8
    settings.AUDIT_CHECKPOINT_EVERY = 3
    assert not AuditEvent.objects.exists()
    start = top()
    sequence(start)
    AUDIT.extend(settings.PARTITION_EVENTS)  # [start, start + 8) and [start + 8, start + 16)
    now = timezone.now()
    with monkeypatch.context() as past:
        past.setattr(timezone, "now", lambda: now - timedelta(days=500))
        agent, _ = make_agent("billing")
        noted(agent, 3)  # the partition's first events, old enough soon
    noted(agent, start + 12 - query(f"SELECT nextval('{AUDIT.table}_id_seq')")[0][0])  # the rest, today's
    AuditEvent.objects.seal()
    partition = f"{AUDIT.table}_{start}"
    assert query(f"SELECT count(*), count(seq) FROM {partition}") == [(8, 8)]

    # 100 days on: the partition's first checkpoints are old enough, the one past its last event is not.
    assert archive_expired(tmp_path, now=now + timedelta(days=100)) == (None, {})
    assert query(f"SELECT count(*) FROM {partition}") == [(8,)]  # no stretch of it deleted

    archive, counts = archive_expired(tmp_path, now=now + timedelta(days=401))
    assert partition not in {p.name for p in AUDIT.ranges()}
    assert counts["ledger.auditevent"] == archive.checkpoint.seq - 1 >= 8


def webhook_event(event_id, received_at):
    WebhookClaim.objects.create(connector="sandbox", event_id=event_id)
    return WebhookEvent.objects.create(connector="sandbox", event_id=event_id, event_type="refund.succeeded",
                                       payload={}, received_at=received_at)


@postgresql_only
def test_webhook_events_are_partitioned_and_a_redelivery_still_finds_its_claim(client, settings):
    settings.SANDBOX_ENABLED, settings.SANDBOX_WEBHOOK_SECRET = True, SECRET
    assert WEBHOOKS.active()
    assert query(f"SELECT count(*) FROM {WEBHOOKS.default}") == [(0,)]
    assert deliver(client, event()).json()["received"]
    assert deliver(client, event()).json() == {"duplicate": True}
    stored = WebhookEvent.objects.get()
    assert partition_of(stored) == WEBHOOKS.table_of()(stored.pk) != WEBHOOKS.default
    assert WebhookClaim.objects.filter(connector="sandbox", event_id="evt_1").count() == 1


@postgresql_only
def test_the_archive_drops_a_webhook_partition_past_retention_and_the_claims_go_with_its_events(
        settings, sequence, tmp_path):
    settings.PARTITION_EVENTS = 4
    start = top(WEBHOOKS)
    sequence(start, WEBHOOKS.table)
    WEBHOOKS.extend(settings.PARTITION_EVENTS)  # [start, start + 4) and [start + 4, start + 8)
    now = timezone.now()
    later = now + timedelta(days=401)
    old = [webhook_event(f"evt_old_{i}", now) for i in range(5)]
    recent = webhook_event("evt_recent", later)  # within its retention at `later`: it stays
    assert {partition_of(event) for event in old[:4]} == {f"{WEBHOOKS.table}_{start}"}

    _, counts = archive_expired(tmp_path, now=later)

    assert counts["ledger.webhookevent"] == 5
    names = {p.name for p in WEBHOOKS.ranges()}
    assert f"{WEBHOOKS.table}_{start}" not in names
    assert f"{WEBHOOKS.table}_{start + 4}" in names  # it holds the recent event
    assert list(WebhookEvent.objects.all()) == [recent]
    assert list(WebhookClaim.objects.values_list("event_id", flat=True)) == ["evt_recent"]


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_partition_a_reader_holds_past_the_lock_timeout_is_emptied_row_by_row_instead(settings, sequence, tmp_path):
    settings.PARTITION_EVENTS = 4
    before = WEBHOOKS.ranges()
    start = before[-1].high
    sequence(start, WEBHOOKS.table)
    WEBHOOKS.extend(settings.PARTITION_EVENTS)  # [start, start + 4) and [start + 4, start + 8), committed
    held = f"{WEBHOOKS.table}_{start}"
    try:
        now = timezone.now()
        later = now + timedelta(days=401)
        for i in range(4):
            webhook_event(f"evt_old_{i}", now)
        recent = webhook_event("evt_recent", later)
        with psycopg.connect(**{**connection.get_connection_params(), "autocommit": False}) as reader:
            reader.execute(f"SELECT count(*) FROM {held}")  # its lock is held until it ends
            _, counts = archive_expired(tmp_path, now=later)

        assert counts["ledger.webhookevent"] == 4
        assert held in {p.name for p in WEBHOOKS.ranges()}  # not dropped: the reader held it past the lock timeout
        assert query(f"SELECT count(*) FROM {held}") == [(0,)]  # its rows deleted instead
        assert list(WebhookEvent.objects.all()) == [recent]
        assert list(WebhookClaim.objects.values_list("event_id", flat=True)) == ["evt_recent"]
    finally:
        for partition in WEBHOOKS.ranges():
            if partition.low >= start:
                query(f"DROP TABLE {partition.name}")
        # The run committed the drop of the (empty) ranges below `start`: made again, as they were,
        # for the tests after this one on this database (every one reads the last range's end).
        for partition in before:
            if partition.name not in {p.name for p in WEBHOOKS.ranges()}:
                low = "MINVALUE" if partition.low is None else partition.low
                query(f"CREATE TABLE {partition.name} PARTITION OF {WEBHOOKS.table} "
                      f"FOR VALUES FROM ({low}) TO ({partition.high})")


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_the_ranges_made_on_return_start_above_the_ids_written_meanwhile(settings, sequence):
    """The sweeper was away: the default partition took the ids. Back, it makes the next ranges
    while the writers go on: a range that held an id written meanwhile would fail the ATTACH
    (the default may not hold a row of another partition's) and end the sweeper, or fail the
    insert that took it (routed to the default before the ATTACH, checked against its bounds
    after)."""
    settings.PARTITION_EVENTS = 4
    agent, _ = make_agent("billing")
    start = top()
    sequence(start + 10)  # the ids passed every partition
    written, failed, stop = [], [], threading.Event()

    def writer():
        try:
            while not stop.is_set():
                written.extend(noted(agent, 1))
        except Exception as exc:  # noqa: BLE001 (asserted in the test's thread)
            failed.append(exc)
        finally:
            connection.close()  # the thread's own connection

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_until(lambda: len(written) >= 20 or failed, seconds=10, message="the writer to write")
        made = AUDIT.extend(settings.PARTITION_EVENTS)
        count = len(written)
        wait_until(lambda: len(written) >= count + 20 or failed, seconds=10, message="the writer to go on")
        stop.set()
        thread.join(10)
        assert not failed, failed
        assert made >= 1
        assert query(f"SELECT count(*) FROM {AUDIT.default} WHERE id >= %s", [AUDIT.ranges()[-made].low]) == [(0,)]
    finally:
        stop.set()
        thread.join(10)
        for partition in AUDIT.ranges():
            if partition.low is not None and partition.low >= start:
                query(f"DROP TABLE {partition.name}")


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_pass_the_writers_overtook_makes_nothing_and_the_next_starts_above_them(
        settings, sequence, monkeypatch, caplog):
    """Writes committed between a pass's read of the sequence and its ATTACH: one at the next id,
    as any writer's, and one past HEADROOM, as from writers faster than it. The first is below the
    new range; the second is in it, so the ATTACH refuses the range (a check violation, not the
    lock timeout of a busy table): the pass makes nothing, and the sweeper goes on."""
    settings.PARTITION_EVENTS = 4
    agent, _ = make_agent("billing")
    start = top()
    sequence(start + 10)  # the sweeper was away while the ids passed every partition
    stray, = noted(agent, 1)
    ranges, overtaken = Partitioned.ranges, []

    def ranges_then_writes(self):
        found = ranges(self)
        if self == AUDIT and not overtaken:
            overtaken.extend(written_elsewhere(agent))  # at the next id
            sequence(overtaken[0].pk + HEADROOM)  # the writers took HEADROOM ids meanwhile
            overtaken.extend(written_elsewhere(agent))
        return found

    monkeypatch.setattr(Partitioned, "ranges", ranges_then_writes)
    try:
        assert AUDIT.extend(settings.PARTITION_EVENTS) == 0
        assert "were written while it was made" in caplog.text
        assert AUDIT.extend(settings.PARTITION_EVENTS) == 2
        assert AUDIT.ranges()[-2].low == overtaken[-1].pk + 1 + HEADROOM
        assert {partition_of(event) for event in [stray, *overtaken]} == {AUDIT.default}
    finally:
        for partition in AUDIT.ranges():
            if partition.low is not None and partition.low >= start:
                query(f"DROP TABLE {partition.name}")


def written_elsewhere(agent):
    """An event written and committed by another connection (a writer's)."""
    written = []

    def write():
        try:
            written.extend(noted(agent, 1))
        finally:
            connection.close()  # the thread's own connection

    thread = threading.Thread(target=write)
    thread.start()
    thread.join(10)
    assert written, "the other connection did not write"
    return written
