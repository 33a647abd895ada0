"""The audit trail's partitions (PostgreSQL): made ahead of the ids by the sweeper, never
needed from the default partition while it runs, dropped whole by the archive once every event
in them is archived; the conversion keeps a populated table's rows, ids, indexes and trigger;
a partitioned trail still holds one event per seq (the seal's rule, on SQLite too).

Each test runs in one transaction that is rolled back, DDL included; only the id sequence,
which PostgreSQL never rolls back, is put back by hand."""

import importlib
from datetime import timedelta

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from console.sweeper import sweep_once
from dlq.archive import archive_expired
from ledger import partitions
from ledger.audit import chain_hash
from ledger.models import AuditEvent
from tests.factories import make_agent

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="partitions are PostgreSQL's")
conversion = importlib.import_module("ledger.migrations.0032_audit_trail_partitioned")


def query(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else None


@pytest.fixture
def sequence():
    """Where the next id will be; put back afterwards (a sequence is not rolled back)."""
    (last, called), = query("SELECT last_value, is_called FROM ledger_auditevent_id_seq")
    yield lambda next_id: query("SELECT setval('ledger_auditevent_id_seq', %s, false)", [next_id])
    query("SELECT setval('ledger_auditevent_id_seq', %s, %s)", [last, called])


def noted(agent, n):
    with transaction.atomic():
        return [AuditEvent.objects.record(actor="system:test", verb="noted", obj=agent, reason=f"note {i}")
                for i in range(n)]


def partition_of(event):
    return query("SELECT tableoid::regclass::text FROM ledger_auditevent WHERE id = %s", [event.pk])[0][0]


def top():
    return partitions.ranges()[-1].high


@postgresql_only
def test_after_migrate_the_trail_is_partitioned_with_a_whole_partition_ahead_and_every_index(settings):
    assert partitions.partitioned()
    (next_id,), = query("SELECT nextval('ledger_auditevent_id_seq')")
    assert top() - next_id >= settings.AUDIT_PARTITION_EVENTS
    assert query(f"SELECT count(*) FROM {partitions.DEFAULT}") == [(0,)]
    indexes = {name for (name,) in query("SELECT indexname FROM pg_indexes WHERE tablename = %s",
                                         [partitions.PARENT])}
    assert indexes == {index.name for index in AuditEvent._meta.indexes} | {"ledger_auditevent_pkey"}


@postgresql_only
def test_the_sweeper_makes_the_next_partition_before_the_ids_reach_it(settings, sequence):
    settings.AUDIT_PARTITION_EVENTS = 4
    agent, _ = make_agent("billing")
    current, ahead = partitions.ranges()[-1].name, top()
    sequence(ahead - 2)  # two ids left in the partitions made so far
    assert sweep_once()["audit_partitions_made"] == 1
    events = noted(agent, 6)
    assert [partition_of(event) for event in events] == [current] * 2 + [f"{partitions.PARENT}_{ahead}"] * 4
    assert sweep_once()["audit_partitions_made"] == 2  # the one now written is full: two ahead again
    assert sweep_once()["audit_partitions_made"] == 0
    # The seal updated each event in its own partition, in the chain's order.
    assert not AuditEvent.objects.filter(seq__isnull=True).exists()
    assert AuditEvent.objects.verify_chain() is None


@postgresql_only
def test_ids_the_default_partition_took_stay_there_and_the_next_range_starts_above_them(settings, sequence):
    settings.AUDIT_PARTITION_EVENTS = 4
    agent, _ = make_agent("billing")
    sequence(top() + 10)  # the sweeper was away while the ids passed every partition
    stray, = noted(agent, 1)
    assert partition_of(stray) == partitions.DEFAULT
    assert partitions.audit_partitions_extend() == 2
    assert partitions.ranges()[-2].low == stray.pk + 1
    after, = noted(agent, 1)
    assert partition_of(after) == f"{partitions.PARENT}_{stray.pk + 1}"
    assert partition_of(AuditEvent.objects.get(pk=stray.pk)) == partitions.DEFAULT
    assert AuditEvent.objects.seal() == AuditEvent.objects.count()
    assert AuditEvent.objects.verify_chain() is None


@postgresql_only
def test_a_partition_waits_for_the_next_pass_while_a_reader_holds_the_trail(settings, sequence, caplog):
    settings.AUDIT_PARTITION_EVENTS = 4
    sequence(top() - 2)
    params = connection.get_connection_params()
    with psycopg.connect(**{**params, "autocommit": False}) as reader:
        reader.execute("SELECT count(*) FROM ledger_auditevent")  # its lock is held until it ends
        assert partitions.audit_partitions_extend() == 0
        assert "stayed busy" in caplog.text
    assert partitions.audit_partitions_extend() == 1


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
    settings.AUDIT_PARTITION_EVENTS = 8
    agent, _ = make_agent("billing")
    AuditEvent.objects.seal()
    earlier = AuditEvent.objects.count()
    start = top()
    sequence(start)
    partitions.audit_partitions_extend()  # [start, start + 8) and [start + 8, start + 16)
    # The first checkpoint falls on the first event after the partition: the archive takes
    # every event before it.
    settings.AUDIT_CHECKPOINT_EVERY = earlier + 9
    events = noted(agent, 12)
    AuditEvent.objects.seal()
    assert {partition_of(event) for event in events[:8]} == {f"{partitions.PARENT}_{start}"}

    archive, counts = archive_expired(tmp_path, now=timezone.now() + timedelta(days=401))

    assert archive.checkpoint.seq == earlier + 9
    assert counts["ledger.auditevent"] == earlier + 8
    names = {p.name for p in partitions.ranges()}
    assert f"{partitions.PARENT}_{start}" not in names
    assert f"{partitions.PARENT}_{start + 8}" in names  # it holds the checkpoint's event
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
