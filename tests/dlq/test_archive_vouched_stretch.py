"""An archive run takes only the audit events its checkpoint vouches for, and an archive file counts
only tied to the checkpoints on either side of it.

Once a run has taken the events before its checkpoint C, every check starts at C: the walk and
`verify_chain` after checking C's own event, the daily check later still. The one link that ties
the taken events to anything signed is the one from the last of them into C's event. Events
rewritten behind the ledger's back after the last walk passed them (their content hashes
recomputed, each linked to the one before) break the chain there alone: a run that took them
without recomputing that link left nothing that could see them, and `evidence_verify --archives`,
which checked only the links inside each file, accepted them (found in review). So a run walks
its stretch first, through C's event, and refuses to take it if it breaks; and a file's events
are checked against the checkpoint's event after them (its header names that event's links; a
file written before it did is checked against the event itself, in the database or first in the
file after) and the checkpoint's before them. PostgreSQL: writing behind the ledger's back
switches its triggers off (session_replication_role)."""

import hashlib
import json
import logging

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from dlq import archive as archiving
from dlq.archive import archive_expired
from ledger import clock
from ledger.audit import chain_hash, content_hash
from ledger.evidence import evidence_actions, evidence_record, record_problems
from ledger.models import Action, AuditEvent, ChainCheckpoint
from ledger.retention import Archive, archive_signature
from tests.dlq.test_archive_expired import LATER, agent, billing, checkpoints_every_five, ledger  # noqa: F401
from tests.ledger.test_archive_trusted import behind_the_ledgers_back, whole_walk

pytestmark = pytest.mark.django_db


def rewrite(seqs, reason="rewritten"):
    """The events at `seqs` (consecutive) rewritten behind the ledger's back, as someone who knows
    how the chain is made would: each content hash recomputed, each event linked to the one before.
    Only the link into the event after the last one breaks."""
    prev_hash = AuditEvent.objects.get(seq=seqs[0] - 1).hash
    for seq in seqs:
        event = AuditEvent.objects.get(seq=seq)
        event.reason = reason
        content = content_hash(event.content_fields())
        new_hash = chain_hash(prev_hash, content, seq)
        behind_the_ledgers_back("UPDATE ledger_auditevent SET reason = %s, content_hash = %s, prev_hash = %s, "
                                "hash = %s WHERE id = %s", [reason, content, prev_hash, new_hash, event.pk])
        prev_hash = new_hash


def altered_in_place(seq):
    """An event's detail changed behind the ledger's back, its hashes left as sealed."""
    behind_the_ledgers_back("UPDATE ledger_auditevent SET reason = 'forged' WHERE seq = %s", [seq])


def run(directory):
    return archive_expired(directory, now=timezone.now() + LATER)


@pytest.mark.parametrize("tamper, broken_at, why", [
    (lambda: rewrite(range(2, 5)), 5,
     "chain broken at seq 5: it does not follow the event before it (intact through seq 4)"),
    (lambda: altered_in_place(3), 3,
     "chain broken at seq 3: its content was altered after it was written (intact through seq 2)"),
])
def test_a_run_refuses_events_its_checkpoint_does_not_vouch_for_and_takes_nothing(tmp_path, ledger, caplog, tamper,
                                                                                   broken_at, why):
    assert whole_walk().broken_at is None  # the walk passed the stretch before it was changed
    tamper()
    kept = (AuditEvent.objects.count(), Action.objects.count())

    with caplog.at_level(logging.ERROR, logger="surety.archive"), \
            pytest.raises(Exception, match="checkpoint at seq 5") as refused:
        run(tmp_path)

    assert isinstance(refused.value, archiving.ArchiveRefused)
    assert why in str(refused.value) and why in caplog.text
    assert (AuditEvent.objects.count() - 1, Action.objects.count()) == kept  # one more: the refusal's own
    assert not Archive.objects.exists() and not list(tmp_path.iterdir())
    event = AuditEvent.objects.get(verb="archive_refused")
    checkpoint = ChainCheckpoint.objects.get(seq=5)
    assert (event.actor, event.object_type, event.object_id) == ("system:archive", "ledger.chaincheckpoint",
                                                                 str(checkpoint.pk))
    assert event.after == {"checkpoint": 5, "why": why}
    # The events stay, and every check from the chain's start finds where it breaks.
    assert AuditEvent.objects.verify_chain() == broken_at


def as_written_before(directory, archive):
    """The file as a run of the code before wrote it (its header named the checkpoint's seq, hash
    and signature alone), with the SHA-256 and signature that run gave its Archive row."""
    path = directory / archive.file
    header, *rows = path.read_text().splitlines(keepends=True)
    header = json.loads(header)
    for name in ("prev_hash", "content_hash"):
        header["checkpoint"].pop(name, None)
    path.write_text(archiving._line(header) + "".join(rows))
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    behind_the_ledgers_back("UPDATE ledger_archive SET sha256 = %s, signature = %s WHERE id = %s",
                            [sha256, archive_signature(archive.file, sha256, archive.checkpoint), archive.pk])


def exported(ledger, tmp_path):
    """An evidence record of an action kept past its lifetime, which cites events the runs take."""
    record = evidence_record(evidence_actions().get(pk=ledger["open"].pk), [])
    saved = tmp_path / "evidence.json"
    saved.write_text(json.dumps(record))
    archives = tmp_path / "archives"
    archives.mkdir()
    return record, saved, archives


@pytest.mark.parametrize("written, checkpoints_event", [
    ("now", "named in its header"), ("before", "in the database"), ("before", "in the file after it")])
def test_a_file_whose_events_do_not_link_to_its_checkpoints_event_counts_for_nothing(
        tmp_path, ledger, monkeypatch, written, checkpoints_event):
    """A run that took a rewritten stretch (as the code before did; simulated here by skipping the
    run's walk) wrote a file whose events link one to the next: they are found out by the link
    into the checkpoint's event, wherever that is. The record, exported after the rewrite, cites
    them as rewritten: nothing else finds them."""
    rewrite(range(2, 5))
    record, saved, archives = exported(ledger, tmp_path)
    with monkeypatch.context() as before:
        before.setattr(archiving, "_unvouched", lambda batch: None, raising=False)
        first, _ = run(archives)
    assert first.checkpoint.seq == 5
    if written == "before":
        as_written_before(archives, first)
    if checkpoints_event == "in the file after it":
        second, _ = run(archives)
        assert second.checkpoint.seq == 10 and not AuditEvent.objects.filter(seq=5).exists()

    problem = (f"archive {first.file}: its last event is not the one the checkpoint's event at seq 5 follows: "
               "its events are not those the checkpoint vouches for")
    problems = record_problems(record, archives=archives)
    assert problem in problems
    cited = [e["seq"] for e in record["audit"]["events"] if e["seq"] is not None and e["seq"] < 5]
    assert cited and all(any(p.startswith(f"event #{seq}: not in the database's audit trail") for p in problems)
                         for seq in cited), problems
    with pytest.raises(CommandError, match="not those the checkpoint vouches for"):
        call_command("evidence_verify", str(saved), "--archives", str(archives))


def test_files_written_before_headers_named_the_checkpoints_event_still_verify(tmp_path, ledger):
    record, saved, archives = exported(ledger, tmp_path)
    while (archive := run(archives)[0]) is not None:
        as_written_before(archives, archive)
    assert Archive.objects.filter(checkpoint__isnull=False).count() > 1
    assert record_problems(record, archives=archives) == []
    call_command("evidence_verify", str(saved), "--archives", str(archives))


def test_a_file_that_does_not_start_at_the_event_the_checkpoint_before_it_vouches_for_counts_for_nothing(
        tmp_path, ledger, monkeypatch):
    """The checkpoint's event deleted behind the ledger's back after a run, and a run that did not
    look (the code before) took the stretch after it: the next file starts one event late."""
    record, saved, archives = exported(ledger, tmp_path)
    first, _ = run(archives)
    behind_the_ledgers_back("DELETE FROM ledger_auditevent WHERE seq = %s", [first.checkpoint.seq])
    monkeypatch.setattr(archiving, "_unvouched", lambda batch: None, raising=False)
    second, _ = run(archives)
    assert (first.checkpoint.seq, second.checkpoint.seq) == (5, 10)

    problem = f"archive {second.file}: it does not start at event #5, which the checkpoint before it vouches for"
    assert problem in record_problems(record, archives=archives)


def test_the_command_says_a_refusal_as_an_error_not_a_traceback(tmp_path, ledger, monkeypatch):
    rewrite(range(2, 5))
    # The command's runs read the database's clock (ledger.clock), which a test cannot move: a stand-in, moved.
    monkeypatch.setattr(clock, "now", lambda: timezone.now() + LATER)

    with pytest.raises(CommandError, match="archive refused: the audit events before the checkpoint at seq 5"):
        call_command("archive_expired", str(tmp_path))
    assert not Archive.objects.exists()
