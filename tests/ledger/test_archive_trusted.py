"""The chain's checks trust an archive only as this ledger wrote it: signed, and never changed
(the archive run itself: tests/dlq/test_archive_expired.py); and the checkpoint an archive leaves
vouches for its own event's content too, which every walk after it takes on trust."""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from dlq.archive import archive_expired
from ledger.audit import audit_walk, chain_start
from ledger.evidence import evidence_actions, evidence_record
from ledger.models import AuditEvent, ChainCheck, ChainCheckpoint
from ledger.retention import Archive
from tests.dlq.test_archive_expired import LATER, agent, billing, checkpoints_every_five, ledger, run  # noqa: F401

pytestmark = pytest.mark.django_db


def whole_walk():
    audit_walk(start=True)
    while audit_walk():
        pass
    return ChainCheck.objects.filter(scope=ChainCheck.Scope.WHOLE).latest("id")


def behind_the_ledgers_back(sql, params):
    """A statement with the ledger's triggers off, as only a database owner could."""
    if connection.vendor != "postgresql":
        pytest.skip("switching triggers off is PostgreSQL's (session_replication_role)")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(sql, params)


def test_an_archive_row_written_behind_the_ledgers_back_does_not_hide_the_events_it_let_go(ledger):
    newest = ChainCheckpoint.objects.order_by("-seq").first()
    # Not through the model (which signs it): a plain INSERT, which the database accepts.
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO ledger_archive (file, sha256, removed, checkpoint_id, archived_at, signature) "
                       "VALUES ('forged.jsonl', %s, '{}', %s, %s, '')", ["0" * 64, newest.pk, timezone.now()])
    deleted, _ = AuditEvent.objects.filter(seq__lt=newest.seq).delete()  # the database's rule lets them go
    assert deleted > 0
    assert chain_start() is None  # so the checks start at seq 1, and find the events gone
    assert AuditEvent.objects.verify_chain() is not None
    assert whole_walk().broken_at is not None


def test_an_archive_row_without_a_signature_is_refused(ledger):
    """As a run of the code from before the signature would write it, against a migrated database."""
    checkpoint = ChainCheckpoint.objects.order_by("-seq").first()
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("INSERT INTO ledger_archive (file, sha256, removed, checkpoint_id, archived_at) "
                       "VALUES ('old.jsonl', %s, '{}', %s, %s)", ["0" * 64, checkpoint.pk, timezone.now()])
    assert not Archive.objects.exists()


def test_an_archive_row_is_never_changed_or_removed(tmp_path, ledger):
    archive, _ = run(tmp_path)
    assert archive.vouched() and chain_start() == archive.checkpoint
    newer = ChainCheckpoint.objects.order_by("-seq").first()
    assert newer != archive.checkpoint
    for change in (lambda: Archive.objects.filter(pk=archive.pk).update(checkpoint=newer),
                   lambda: Archive.objects.filter(pk=archive.pk).delete()):
        with pytest.raises(DatabaseError), transaction.atomic():
            change()
    # Changed all the same, behind the ledger's back: its signature no longer holds.
    behind_the_ledgers_back("UPDATE ledger_archive SET checkpoint_id = %s WHERE id = %s", [newer.pk, archive.pk])
    assert not Archive.objects.get(pk=archive.pk).vouched()
    assert chain_start() is None


def test_the_event_an_archives_checkpoint_vouches_for_is_checked_for_its_content(tmp_path, ledger):
    archive, _ = run(tmp_path)
    seq = archive.checkpoint.seq
    assert AuditEvent.objects.verify_chain() is None
    behind_the_ledgers_back("UPDATE ledger_auditevent SET reason = 'forged' WHERE seq = %s", [seq])
    assert AuditEvent.objects.verify_chain() == seq
    assert whole_walk().broken_at == seq


def test_evidence_verify_walks_the_chain_from_an_archives_checkpoint(tmp_path, ledger):
    saved = tmp_path / "evidence.json"
    saved.write_text(json.dumps(evidence_record(evidence_actions().get(pk=ledger["open"].pk), [])))
    archives = tmp_path / "archives"
    archives.mkdir()
    while archive_expired(archives, now=timezone.now() + LATER)[0] is not None:
        pass
    assert chain_start() is not None
    AuditEvent.objects.seal()
    call_command("evidence_verify", str(saved), "--archives", str(archives), "--chain")
    behind_the_ledgers_back("UPDATE ledger_auditevent SET reason = 'forged' WHERE seq = %s",
                            [AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first()])
    with pytest.raises(CommandError, match="the database's chain"):
        call_command("evidence_verify", str(saved), "--archives", str(archives), "--chain")


def test_a_record_of_an_action_recorded_before_the_chains_start_names_where_its_earlier_events_went(tmp_path, ledger):
    def record(action):
        return evidence_record(evidence_actions().get(pk=action.pk), [])["audit"]

    assert record(ledger["open"])["archived"] is None
    cited = [event["seq"] for event in record(ledger["open"])["events"]]
    while run(tmp_path)[0] is not None:  # until every old event is archived, the open action's first ones too
        pass
    start = chain_start()
    assert min(cited) < start.seq  # some of the events its record cited are gone from the database
    files = [{"file": a.file, "sha256": a.sha256} for a in Archive.objects.filter(checkpoint__isnull=False).order_by("id")]
    assert len(files) > 1
    assert record(ledger["open"])["archived"] == {"before_seq": start.seq, "files": files}
    # Recorded after the chain's start, none of its own events went, but the policies in force when
    # it was requested (its limit's last change, its agent's grant) may have: the record says where.
    assert record(ledger["recent"])["archived"] == {"before_seq": start.seq, "files": files}
