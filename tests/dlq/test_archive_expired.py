"""`archive_expired`: what outlived its retention goes to a JSON-lines file and out of the
database, one run (file, transaction, audit event) at a time; nothing unsettled or undecided
goes; the audit chain stays verifiable from the checkpoint the archive names; a run killed
before its commit removes nothing; a dry run changes nothing. "Later" is a `now` past the
lifetime: audit events cannot be back-dated (they are append-only)."""

import hashlib
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from dlq import archive as archiving
from dlq.archive import archive_expired
from dlq.models import Alert, DeadLetter
from ledger.audit import audit_verify, audit_walk
from ledger.evidence import evidence_actions, evidence_record, record_problems
from ledger.models import Action, ArchivedKey, AuditEvent, ChainCheck, ChainCheckpoint, WebhookEvent
from ledger.retention import Archive
from tests.factories import make_action, make_agent, post_action_in_process, refund_body

pytestmark = pytest.mark.django_db

LATER = timedelta(days=401)  # past the default 400-day lifetime and retentions


@pytest.fixture(autouse=True)
def checkpoints_every_five(settings):
    settings.AUDIT_CHECKPOINT_EVERY = 5


@pytest.fixture
def billing():
    return make_agent("billing")  # the agent and its token


@pytest.fixture
def agent(billing):
    return billing[0]


@pytest.fixture
def ledger(agent):
    """Two settled actions (one with a resolved dead letter and its alert), and what must stay:
    one queued, one failed that may be retried, one with an open dead letter, one recent."""
    with transaction.atomic():
        done = make_action(agent, "succeeded", key="old-done", target="ORD-1")
        resolved = make_action(agent, "failed", key="old-resolved", target="ORD-2", retryable=False)
        entry = DeadLetter.objects.open_for_action(resolved, actor="system:executor")
        entry.resolve(actor="user:ops", note="refunded by hand")
        kept = {
            "queued": make_action(agent, "queued", key="old-queued", target="ORD-3"),
            "retryable": make_action(agent, "failed", key="old-retryable", target="ORD-4", retryable=True),
            "open": make_action(agent, "failed", key="old-open", target="ORD-5", retryable=False),
            "recent": make_action(agent, "succeeded", key="recent", target="ORD-6",
                                  created_at=timezone.now() + LATER - timedelta(days=10)),
        }
        DeadLetter.objects.open_for_action(kept["open"], actor="system:executor")
        for i in range(12):  # enough events for checkpoints at 5, 10, ...
            AuditEvent.objects.record(actor="system:test", verb="noted", obj=done, reason=f"note {i}")
        WebhookEvent.objects.create(connector="sandbox", event_id="evt_old", event_type="refund.succeeded",
                                    payload={}, operation_key="old-done")
    if connection.vendor == "postgresql":
        # As at the commit of each of these in production: the entries' deferred checks (an
        # alert each) run now, not at the end of the test's one transaction, after the archive.
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    AuditEvent.objects.seal()
    return {"done": done, "resolved": resolved, "entry": entry, **kept}


def run(tmp_path, **kwargs):
    return archive_expired(tmp_path, now=timezone.now() + LATER, **kwargs)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_moves_the_settled_and_expired_to_a_file_and_keeps_the_rest(tmp_path, ledger):
    archive, counts = run(tmp_path)

    assert counts["ledger.action"] == 2 and counts["dlq.deadletter"] == 1 and counts["dlq.alert"] == 1
    assert counts["ledger.webhookevent"] == 1
    assert set(Action.objects.values_list("operation_key", flat=True)) == {"old-queued", "old-retryable", "old-open",
                                                                          "recent"}
    assert not DeadLetter.objects.filter(pk=ledger["entry"].pk).exists()
    assert DeadLetter.objects.filter(action=ledger["open"], status="open").exists()
    assert Alert.objects.filter(dead_letter__action=ledger["open"]).exists()
    assert not WebhookEvent.objects.exists()
    assert set(ArchivedKey.objects.values_list("operation_key", flat=True)) == {"old-done", "old-resolved"}

    path = tmp_path / archive.file
    assert hashlib.sha256(path.read_bytes()).hexdigest() == archive.sha256
    header, *rows = lines(path)
    assert header["counts"] == counts == archive.removed
    archived_actions = {r["fields"]["operation_key"] for r in rows if r["model"] == "ledger.action"}
    assert archived_actions == {"old-done", "old-resolved"}
    event = AuditEvent.objects.get(verb="archived")
    assert (event.actor, event.object_id) == ("system:archive", str(archive.pk))
    assert event.after == {"file": archive.file, "sha256": archive.sha256, "removed": counts, "checkpoint": 5}


def test_the_chain_stays_verifiable_from_the_checkpoint_the_file_names(tmp_path, ledger):
    archive, _ = run(tmp_path)
    checkpoint = archive.checkpoint
    assert checkpoint == ChainCheckpoint.objects.get(seq=5)
    assert not AuditEvent.objects.filter(seq__lt=5).exists()

    header, *rows = lines(tmp_path / archive.file)
    assert header["checkpoint"] == {"seq": 5, "hash": checkpoint.hash, "signature": checkpoint.signature}
    events = [r for r in rows if r["model"] == "ledger.auditevent"]
    assert [e["fields"]["seq"] for e in events] == [1, 2, 3, 4]
    # The file's last link is the one the checkpoint's event follows.
    assert events[-1]["fields"]["hash"] == AuditEvent.objects.get(seq=5).prev_hash

    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None
    assert audit_verify(since_checkpoint=True).broken_at is None
    audit_walk(start=True)
    while audit_walk():
        pass
    whole = ChainCheck.objects.filter(scope=ChainCheck.Scope.WHOLE).latest("id")
    assert (whole.broken_at, whole.from_seq) == (None, 6)


def test_the_database_still_refuses_deleting_audit_events_past_the_archives_checkpoint(tmp_path, ledger):
    run(tmp_path)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(seq=5).delete()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(seq__isnull=True).delete()


def test_re_runs_take_a_checkpoints_stretch_each_until_nothing_is_left(tmp_path, ledger):
    call_command("archive_expired", str(tmp_path))  # today: nothing is old enough
    assert not list(tmp_path.iterdir())
    first, _ = run(tmp_path)
    second, counts = run(tmp_path)
    assert (first.checkpoint.seq, second.checkpoint.seq) == (5, 10)
    assert counts == {"ledger.auditevent": 5}
    while run(tmp_path)[0] is not None:
        pass
    assert run(tmp_path) == (None, {})
    assert Action.objects.count() == 4


def test_a_run_killed_before_its_commit_removes_nothing(tmp_path, ledger, monkeypatch):
    def killed(batch, archive):
        raise KeyboardInterrupt

    monkeypatch.setattr(archiving, "_remove", killed)
    before = (Action.objects.count(), AuditEvent.objects.count(), WebhookEvent.objects.count())
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path)
    assert (Action.objects.count(), AuditEvent.objects.count(), WebhookEvent.objects.count()) == before
    assert not Archive.objects.exists() and not ArchivedKey.objects.exists()
    orphan = list(tmp_path.iterdir())
    assert len(orphan) == 1  # written, named by no Archive

    monkeypatch.undo()
    archive, counts = run(tmp_path)
    assert archive.file != orphan[0].name and counts["ledger.action"] == 2


def test_a_dry_run_changes_nothing(tmp_path, ledger):
    before = (Action.objects.count(), AuditEvent.objects.count(), WebhookEvent.objects.count())
    assert run(tmp_path, dry_run=True) == (None, {
        "dlq.alert": 1, "dlq.deadletter": 1, "ledger.action": 2, "ledger.webhookevent": 1, "ledger.auditevent": 4})
    assert (Action.objects.count(), AuditEvent.objects.count(), WebhookEvent.objects.count()) == before
    assert not list(tmp_path.iterdir())


def test_an_archived_key_answers_410_and_is_never_recorded_again(tmp_path, ledger, client, billing):
    run(tmp_path)
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {billing[1]}"
    for answer in (post_action_in_process(client, "old-done", refund_body(order="ORD-1")),
                   client.get("/api/v1/actions/old-done")):
        assert (answer.status_code, answer.json()["code"]) == (410, "operation_key_expired")
    assert not Action.objects.filter(operation_key="old-done").exists()


def test_a_failure_that_could_be_retried_goes_once_a_person_closed_its_dead_letter(tmp_path, ledger, agent):
    with connection.cursor() as cursor:  # its alert is written after it, as in one commit
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        entry = DeadLetter.objects.open_for_action(ledger["retryable"], actor="system:executor")
        entry.discard(actor="user:ops", reason="the customer was refunded by bank transfer")
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    _, counts = run(tmp_path)
    assert not Action.objects.filter(pk=ledger["retryable"].pk).exists()
    assert counts["ledger.action"] == 3  # with the two settled ones


def test_the_archives_checkpoint_still_vouches_after_the_secret_key_is_rotated(tmp_path, ledger, settings):
    """The checkpoint an archive starts the chain from can never be signed again (append-only,
    and the events before it are gone): the old key, kept as a fallback, goes on vouching."""
    run(tmp_path)
    old = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "rotated-secret-key-" + "x" * 40, [old]
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None
    audit_walk(start=True)
    while audit_walk():
        pass
    whole = ChainCheck.objects.filter(scope=ChainCheck.Scope.WHOLE).latest("id")
    assert (whole.broken_at, whole.from_seq) == (None, 6)

    settings.SECRET_KEY_FALLBACKS = []  # the old key dropped: what it signed proves nothing any more
    assert AuditEvent.objects.verify_chain() == 5


def test_an_evidence_record_exported_before_a_run_still_verifies_against_the_runs_files(tmp_path, ledger):
    """An action kept past its lifetime (its dead letter is open) cites events a run takes out
    of the database (its agent's grants, its own): they are checked in the archives' files,
    which the database vouches for by their SHA-256. A changed file vouches for nothing."""
    exported = evidence_record(evidence_actions().get(pk=ledger["open"].pk), [])
    saved = tmp_path / "evidence.json"
    saved.write_text(json.dumps(exported))
    archives = tmp_path / "archives"
    archives.mkdir()
    while archive_expired(archives, now=timezone.now() + LATER)[0] is not None:
        pass

    cited = {e["id"] for e in exported["audit"]["events"]}
    assert cited - set(AuditEvent.objects.filter(pk__in=cited).values_list("id", flat=True))  # some are gone
    assert any("not in the database's audit trail" in p for p in record_problems(exported))
    assert record_problems(exported, archives=archives) == []
    call_command("evidence_verify", str(saved), "--archives", str(archives))

    first = sorted(archives.iterdir())[0]
    first.write_text(first.read_text().replace('"verb":"', '"verb":"x', 1))
    assert any("not the file the ledger wrote" in p for p in record_problems(exported, archives=archives))
