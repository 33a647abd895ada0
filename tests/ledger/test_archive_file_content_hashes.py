"""An archive file's events are checked from their fields, not only by their links: each one's content
hash is recomputed. The file's SHA-256, which the database keeps, vouches only for the file as the
run wrote it, so an event whose detail was changed in the database behind the ledger's back (its
hashes left as sealed) and then archived would otherwise pass for the chain's."""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from dlq import archive as archiving
from ledger.evidence import evidence_actions, evidence_record, record_problems
from ledger.models import AuditEvent
from tests.dlq.test_archive_expired import agent, billing, checkpoints_every_five, ledger, lines, run  # noqa: F401
from tests.ledger.test_archive_trusted import behind_the_ledgers_back

pytestmark = pytest.mark.django_db


@pytest.fixture
def exported(ledger, tmp_path):
    """An evidence record of an action kept past its lifetime, saved before a run archives the
    event it cites (its agent's grant) with the events before the checkpoint."""
    record = evidence_record(evidence_actions().get(pk=ledger["open"].pk), [])
    saved = tmp_path / "evidence.json"
    saved.write_text(json.dumps(record))
    return record, saved


def test_an_event_altered_in_the_database_before_its_run_is_found_in_the_file(ledger, exported, tmp_path, monkeypatch):
    record, saved = exported
    cited = next(e for e in record["audit"]["events"] if e["seq"] is not None and e["seq"] < 5)
    behind_the_ledgers_back("UPDATE ledger_auditevent SET reason = %s WHERE id = %s",
                            ["granted by someone else", cited["id"]])
    archives = tmp_path / "archives"
    archives.mkdir()
    # A run walks its stretch now and refuses this one (tests/dlq/test_archive_vouched_stretch.py); a
    # run of the code before did not: its file is checked here, the run's walk skipped.
    monkeypatch.setattr(archiving, "_unvouched", lambda batch: None)
    archive, _ = run(archives)
    assert archive.checkpoint.seq == 5 and not AuditEvent.objects.filter(pk=cited["id"]).exists()
    archived = next(row for row in lines(archives / archive.file)[1:]
                    if (row["model"], row["pk"]) == ("ledger.auditevent", cited["id"]))
    # The file holds it as the run found it: its detail changed, its hashes and links as sealed.
    assert archived["fields"]["reason"] == "granted by someone else"
    assert (archived["fields"]["content_hash"], archived["fields"]["hash"]) == (cited["content_hash"], cited["hash"])

    problems = record_problems(record, archives=archives)
    assert f"archive {archive.file}: event #{cited['seq']} was altered after it was written (its fields are not " \
           "what its content hash was computed from)" in problems
    with pytest.raises(CommandError, match="was altered after it was written"):
        call_command("evidence_verify", str(saved), "--archives", str(archives))

