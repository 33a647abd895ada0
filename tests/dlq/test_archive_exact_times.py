"""An archive file holds each row's times as the database holds them, to the microsecond: an
archived audit event's content hash is recomputed from the file's fields alone (ledger.audit's
`content_fields` writes its time whole, as `isoformat` does), and a row read back from the file
has the time it had in the database."""

import pytest
from django.core import serializers

from ledger.audit import content_hashes
from ledger.models import Action, AuditEvent
from tests.dlq.test_archive_expired import agent, billing, checkpoints_every_five, ledger, lines, run  # noqa: F401

pytestmark = pytest.mark.django_db


def test_an_archived_events_content_hash_is_recomputed_from_its_file(tmp_path, ledger):
    times = dict(AuditEvent.objects.filter(seq__lt=5).values_list("seq", "occurred_at"))
    assert any(moment.microsecond % 1000 for moment in times.values()), "no event with microseconds to lose"
    archive, _ = run(tmp_path)

    events = [row for row in lines(tmp_path / archive.file)[1:] if row["model"] == "ledger.auditevent"]
    assert [event["fields"]["seq"] for event in events] == [1, 2, 3, 4]
    for event in events:
        fields = event["fields"]
        assert fields["content_hash"] in content_hashes(fields), f"seq {fields['seq']}: {fields['occurred_at']}"
        assert fields["occurred_at"] == times[fields["seq"]].isoformat()


def test_a_row_read_back_from_the_file_has_the_databases_times(tmp_path, ledger):
    created = dict(Action.objects.filter(operation_key__in=["old-done", "old-resolved"])
                   .values_list("pk", "created_at"))
    assert any(moment.microsecond % 1000 for moment in created.values()), "no time with microseconds to lose"
    archive, _ = run(tmp_path)

    rows = [row for row in lines(tmp_path / archive.file)[1:] if row["model"] == "ledger.action"]
    read = {found.object.pk: found.object.created_at for found in serializers.deserialize("python", rows)}
    assert read == created
