"""An evidence record exported while one of its events was still unsealed (its seq null in the
record), checked after an archive run took that event: it is found in the archive's file by its id
and content hash, the record's only marks of it. On both databases, as test_archive_expired."""

import pytest
from django.db import transaction
from django.utils import timezone

from dlq.archive import archive_expired
from ledger.evidence import evidence_actions, evidence_record, record_problems
from ledger.models import AuditEvent
from tests.dlq.test_archive_expired import LATER, agent, billing, checkpoints_every_five, ledger  # noqa: F401

pytestmark = pytest.mark.django_db


def test_a_record_with_an_event_unsealed_at_export_verifies_against_the_archives(tmp_path, ledger):
    with transaction.atomic():
        AuditEvent.objects.record(actor="user:ops", verb="noted", obj=ledger["open"], reason="looked at it")
    exported = evidence_record(evidence_actions().get(pk=ledger["open"].pk), [])
    assert exported["audit"]["unsealed"] == 1
    with transaction.atomic():
        for i in range(12):  # a checkpoint past it, for a run to archive it
            AuditEvent.objects.record(actor="system:test", verb="noted", obj=ledger["done"], reason=f"more {i}")
    AuditEvent.objects.seal()
    assert record_problems(exported) == []

    archives = tmp_path / "archives"
    archives.mkdir()
    while archive_expired(archives, now=timezone.now() + LATER)[0] is not None:
        pass
    assert not AuditEvent.objects.filter(reason="looked at it").exists()
    assert record_problems(exported, archives=archives) == []

    unsealed = next(e for e in exported["audit"]["events"] if e["seq"] is None)
    unsealed["content_hash"] = "0" * 64  # the digest then differs too: only the event's problem is asserted
    assert f"event #{unsealed['id']}: not as its archive file holds it" in record_problems(exported, archives=archives)
