"""An event's object_label is in its content hash (version 2, every event written since migration
0046): after an archive it is the only readable name of what the event was about, and it could be
rewritten unseen. The events before keep version 1, whose content hash is of their fields without
it, and verify as they always did: nothing is hashed again.

The attacker is the one of tests/ledger/test_archive_trusted.py: someone who writes to the database
behind the ledger's back (its triggers off) but does not hold its key."""

import json

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from ledger import audit
from ledger.audit import audit_verify, chain_hash, content_hash
from ledger.evidence import evidence_actions, evidence_record, record_digest, record_problems
from ledger.models import AuditEvent
from ledger.partitions import AUDIT
from tests.dlq.test_archive_expired import agent, billing, checkpoints_every_five, ledger, lines, run  # noqa: F401
from tests.ledger.test_archive_trusted import whole_walk

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql",
                                     reason="switching triggers off and partitions are PostgreSQL's")


def behind_the_ledgers_back(sql, params):
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(sql, params)


def as_the_code_before_writes_it(obj, reason):
    """An event as the code before migration 0046 writes it, against a migrated database (during
    the upgrade): an INSERT that names no hash_version, with a content hash of its fields without
    its label."""
    with transaction.atomic():
        event = AuditEvent.objects.event(actor="system:old-code", verb="noted", obj=obj, reason=reason)
    fields = {name: value for name, value in event.content_fields().items() if name != "object_label"}
    columns = ["occurred_at", "actor", "verb", "object_type", "object_id", "object_label", "reason", "request_id",
               "content_hash", "prev_hash", "hash"]
    values = [event.occurred_at, event.actor, event.verb, event.object_type, event.object_id, event.object_label,
              event.reason, event.request_id, content_hash(fields), "", ""]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO ledger_auditevent ({', '.join(columns)}) "
                       f"VALUES ({', '.join(['%s'] * len(values))})", values)
    return AuditEvent.objects.get(actor="system:old-code", reason=reason)


def test_an_event_written_now_hashes_its_label(agent):
    with transaction.atomic():
        event = AuditEvent.objects.record(actor="user:ops", verb="noted", obj=agent, reason="hello")
    stored = AuditEvent.objects.get(pk=event.pk)
    assert stored.hash_version == 2
    assert stored.content_fields()["object_label"] == stored.object_label == str(agent)
    assert stored.content_hash == content_hash(stored.content_fields())
    assert stored.content_hash != content_hash({k: v for k, v in stored.content_fields().items()
                                                if k != "object_label"})


@postgresql_only
def test_a_label_rewritten_behind_the_ledgers_back_breaks_the_chain(ledger):
    event = AuditEvent.objects.filter(verb="noted").order_by("-seq").first()
    assert AuditEvent.objects.verify_chain() is None and audit_verify().broken_at is None
    behind_the_ledgers_back("UPDATE ledger_auditevent SET object_label = %s WHERE id = %s",
                            ["refund:ORD-SOMEONE-ELSE", event.pk])

    assert AuditEvent.objects.verify_chain() == event.seq
    walked = whole_walk()
    assert (walked.broken_at, walked.why) == (event.seq, "its content was altered after it was written")


def test_an_event_the_code_before_writes_has_version_1_and_verifies_without_its_label(agent):
    old = as_the_code_before_writes_it(agent, "during the upgrade")
    assert old.hash_version == 1 and "object_label" not in old.content_fields()
    assert old.content_hash == content_hash(old.content_fields())
    with transaction.atomic():
        AuditEvent.objects.record(actor="user:ops", verb="noted", obj=agent, reason="after it")
    AuditEvent.objects.seal()
    assert set(AuditEvent.objects.values_list("hash_version", flat=True)) == {1, 2}
    assert AuditEvent.objects.verify_chain() is None
    if connection.vendor == "postgresql":
        # Its label is outside its content hash, as every event's was before: a change goes unseen.
        behind_the_ledgers_back("UPDATE ledger_auditevent SET object_label = 'relabelled' WHERE id = %s", [old.pk])
        assert AuditEvent.objects.verify_chain() is None


def test_the_seal_cannot_change_an_events_hash_version(agent):
    """Its version says which fields its content hash is of: the database's rule (PostgreSQL's
    compares the whole row, SQLite's each column) lets the seal change its links alone."""
    AuditEvent.objects.seal()
    with transaction.atomic():
        event = AuditEvent.objects.record(actor="user:ops", verb="noted", obj=agent, reason="to seal")
    seq, prev = AuditEvent.objects.filter(seq__isnull=False).order_by("-seq").values_list("seq", "hash").first() \
        or (0, "")
    seal = {"seq": seq + 1, "prev_hash": prev, "hash": chain_hash(prev, event.content_hash, seq + 1)}
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(**seal, hash_version=1)
    AuditEvent.objects.filter(pk=event.pk).update(**seal)  # the seal itself
    assert AuditEvent.objects.get(pk=event.pk).seq == seq + 1


@postgresql_only
def test_every_partition_takes_version_1_for_a_row_that_names_none(settings):
    AUDIT.extend(settings.PARTITION_EVENTS)
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname, pg_get_expr(d.adbin, d.adrelid) FROM pg_class c "
                       "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'hash_version' "
                       "LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum "
                       "WHERE c.oid = 'ledger_auditevent'::regclass OR c.oid IN ("
                       "    SELECT inhrelid FROM pg_inherits WHERE inhparent = 'ledger_auditevent'::regclass)")
        defaults = dict(cursor.fetchall())
    assert len(defaults) >= 4  # the parent, the first partition, the ranges made after, the default one
    assert set(defaults.values()) == {"1"}, defaults


def test_an_evidence_record_shows_a_label_changed_in_the_file_for_an_event_that_hashes_it(ledger):
    action = evidence_actions().get(pk=ledger["open"].pk)
    old = as_the_code_before_writes_it(action, "before the upgrade")
    AuditEvent.objects.seal()
    record = json.loads(json.dumps(evidence_record(evidence_actions().get(pk=action.pk), [])))
    assert record_problems(record) == []

    events = {e["id"]: e for e in record["audit"]["events"]}
    new = next(e for e in record["audit"]["events"] if e["id"] != old.pk)
    for event in (events[old.pk], new):
        event["object_label"] = "refund:ORD-SOMEONE-ELSE"
    record["integrity"]["digest"] = record_digest(record)  # written again to fit, as whoever changed it would
    assert record_problems(record, database=False) == [
        f"event #{new['seq']}: its fields are not what its content hash was computed from"]


def test_the_archive_file_keeps_each_events_version(tmp_path, ledger):
    archive, _ = run(tmp_path)
    events = [row for row in lines(tmp_path / archive.file)[1:] if row["model"] == "ledger.auditevent"]
    assert events and {e["fields"]["hash_version"] for e in events} == {2}
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None


def test_content_hashes_are_the_hash_of_either_version():
    fields = {"occurred_at": timezone.now().isoformat(), "actor": "user:ops", "verb": "noted",
              "object_type": "ledger.agent", "object_id": "1", "object_label": "billing", "before": None,
              "after": {"a": 1}, "reason": "", "request_id": ""}
    without = {k: v for k, v in fields.items() if k != "object_label"}
    assert audit.content_hashes({**fields, "id": 7, "seq": 3, "hash": "x"}) == {content_hash(without),
                                                                                content_hash(fields)}
