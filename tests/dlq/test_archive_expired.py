"""`archive_expired`: what outlived its retention goes to a JSON-lines file and out of the
database, one run (file, transaction, audit event) at a time; nothing unsettled or undecided
goes; the audit chain stays verifiable from the checkpoint the archive names; a run killed
before its commit removes nothing; a dry run changes nothing; everything a run removes is in its
file, a partition's rows included, and runs take turns. "Later" is a `now` past the lifetime:
audit events cannot be back-dated (they are append-only)."""

import hashlib
import json
import os
from datetime import timedelta

import psycopg
import pytest
from django.core.management import call_command
from django.db import DatabaseError, OperationalError, connection, transaction
from django.utils import timezone

from approvals.models import DecisionLink, ReviewItem
from dlq import archive as archiving
from dlq.archive import archive_expired
from dlq.incidents import Incident, incident_resolve
from dlq.reconcile import incident_open_for_failed_effect
from dlq.models import Alert, DeadLetter
from ledger import locks
from ledger.audit import audit_verify, audit_walk, chain_hash
from ledger.evidence import evidence_actions, evidence_record, record_problems
from ledger.models import Action, ArchivedKey, AuditEvent, ChainCheck, ChainCheckpoint, WebhookClaim, WebhookEvent
from ledger.partitions import AUDIT, WEBHOOKS
from ledger.retention import Archive
from tests.factories import make_action, make_agent, post_action_in_process, refund_body
from tests.ledger.test_partitions import noted, partition_of, query, sequence, top, webhook_event  # noqa: F401

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's partitions and locks")

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
    # With its event's links, which hash to the checkpoint's: the file is tied to it alone.
    event = AuditEvent.objects.get(seq=5)
    assert header["checkpoint"] == {"seq": 5, "hash": checkpoint.hash, "signature": checkpoint.signature,
                                    "prev_hash": event.prev_hash, "content_hash": event.content_hash}
    assert chain_hash(event.prev_hash, event.content_hash, 5) == checkpoint.hash
    events = [r for r in rows if r["model"] == "ledger.auditevent"]
    assert [e["fields"]["seq"] for e in events] == [1, 2, 3, 4]
    # The file's last link is the one the checkpoint's event follows.
    assert events[-1]["fields"]["hash"] == event.prev_hash

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


def test_an_unsealed_event_cannot_be_sealed_among_the_archived_and_deleted_with_them(tmp_path, ledger):
    archive, _ = run(tmp_path)
    assert archive.checkpoint.seq == 5 and not AuditEvent.objects.filter(seq__lt=5).exists()
    with transaction.atomic():  # a person's approval, committed, waiting for the sealer
        event = AuditEvent.objects.record(actor="user:ops", verb="approved", obj=ledger["done"], reason="ok")
    # Free seqs among the archived, after '': seq 1's link is right; SQLite, which checks no link, took 3 too.
    for seq in (1, 3):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("UPDATE ledger_auditevent SET seq = %s, prev_hash = '', hash = %s WHERE id = %s",
                           [seq, chain_hash("", event.content_hash, seq), event.pk])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).delete()

    assert AuditEvent.objects.get(pk=event.pk).seq is None
    AuditEvent.objects.seal()
    assert AuditEvent.objects.order_by("-seq").first().pk == event.pk
    assert audit_verify(since_checkpoint=True).broken_at is None


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


def test_an_action_an_open_incident_names_stays_until_the_incident_is_resolved(tmp_path, ledger):
    """The provider failed a refund after it succeeded (a failed_effect incident): archived while
    the incident was open, its row and evidence were gone from the person resolving it, and a later
    webhook about its effect found no action."""
    done = ledger["done"]
    with connection.cursor() as cursor:  # its alert is written after it, as in one commit
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        incident_open_for_failed_effect(done, connector="sandbox", external_ref="re_1", actor="system:tests",
                                        evidence={"webhook": "refund.failed"})
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    run(tmp_path)
    assert Action.objects.filter(pk=done.pk).exists()
    incident_resolve(Incident.objects.get(), actor="user:ops", reason="refunded again by hand")
    run(tmp_path)
    assert not Action.objects.filter(pk=done.pk).exists()


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


def archived_models(archive, tmp_path):
    return [row["model"] for row in lines(tmp_path / archive.file)[1:]]


def test_a_review_items_decision_links_go_into_the_file_with_it(tmp_path, ledger, agent):
    """The database deletes an item's links with it (CASCADE): the run takes them first, so
    nothing leaves that its file does not hold."""
    now = timezone.now()
    item = ReviewItem.objects.create(kind="unknown_outcome", action=ledger["done"], status="closed", deadline=now,
                                     decided_at=now, decided_by_label="system:test")
    DecisionLink.objects.create(digest="a" * 64, user=agent.owner, item=item, fingerprint="f",
                                expires_at=now + timedelta(hours=1))
    archive, counts = run(tmp_path)
    assert counts["approvals.reviewitem"] == counts["approvals.decisionlink"] == 1
    assert archived_models(archive, tmp_path).count("approvals.decisionlink") == 1
    assert not DecisionLink.objects.exists()


def test_the_files_directory_is_synced_before_an_archive_names_the_file(tmp_path, ledger, monkeypatch):
    """The file's own fsync does not make its name durable: a power loss after the commit could
    leave an Archive naming a file its directory lost."""
    synced = []
    fsync = os.fsync

    def recorded(fd):
        if os.path.samestat(os.fstat(fd), os.stat(tmp_path)):
            synced.append(Archive.objects.exists())
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recorded)
    run(tmp_path)
    assert synced == [False]


@postgresql_only
def test_a_run_waits_for_the_run_already_going(tmp_path, ledger):
    """Webhook and audit events are taken without a row lock: two runs at once would both write
    them. Another session holds the runs' turn; this run waits for it (here, until the lock
    timeout) and takes nothing meanwhile."""
    with psycopg.connect(**{**connection.get_connection_params(), "autocommit": False}) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s, %s)", [locks.CLASS, locks.ARCHIVE_RUN])
        query("SET LOCAL lock_timeout = '200ms'")
        with pytest.raises(OperationalError, match="lock timeout"):
            run(tmp_path)
        query("RESET lock_timeout")
    assert not Archive.objects.exists() and not list(tmp_path.iterdir())
    assert run(tmp_path)[1]["ledger.action"] == 2  # its turn came


@postgresql_only
def test_audit_events_the_default_partition_took_leave_with_the_rest(settings, sequence, tmp_path, agent):
    """The sweeper was away: the default partition took ids past every range, and the ranges
    made after start above them (decision 52). Those events are below the partitions the run
    drops, and are deleted, not left behind in the database and in the file."""
    settings.PARTITION_EVENTS = 4
    earlier = AuditEvent.objects.count()
    settings.AUDIT_CHECKPOINT_EVERY = earlier + 11  # one checkpoint, on the last event below: the rest goes
    start = top()
    sequence(start)
    AUDIT.extend(4)  # [start, start + 4) and [start + 4, start + 8)
    noted(agent, 4)
    sequence(start + 8)  # past every range
    strays = noted(agent, 2)
    assert {partition_of(event) for event in strays} == {AUDIT.default}
    AUDIT.extend(4)  # [start + 10, start + 14) and [start + 14, start + 18)
    noted(agent, 5)
    AuditEvent.objects.seal()

    archive, counts = run(tmp_path)

    assert archive.checkpoint.seq == earlier + 11
    assert not AuditEvent.objects.filter(pk__in=[event.pk for event in strays]).exists()
    assert not AuditEvent.objects.filter(seq__lt=archive.checkpoint.seq).exists()
    assert archived_models(archive, tmp_path).count("ledger.auditevent") == counts["ledger.auditevent"] == earlier + 10
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None


@postgresql_only
def test_webhook_events_the_default_partition_took_leave_with_their_claims(settings, sequence, tmp_path):
    """Left behind, such an event would have lost its claim (a redelivery stored again) and be
    taken again by the next run."""
    settings.PARTITION_EVENTS = 4
    start = top(WEBHOOKS)
    sequence(start, WEBHOOKS.table)
    WEBHOOKS.extend(4)
    now = timezone.now()
    for i in range(4):
        webhook_event(f"evt_ranged_{i}", now)
    sequence(start + 8, WEBHOOKS.table)  # past every range
    strays = [webhook_event(f"evt_stray_{i}", now) for i in range(2)]
    assert {partition_of(event) for event in strays} == {WEBHOOKS.default}
    WEBHOOKS.extend(4)
    for i in range(4):
        webhook_event(f"evt_later_{i}", now)
    recent = webhook_event("evt_recent", now + LATER)

    _, counts = run(tmp_path)

    assert counts["ledger.webhookevent"] == 10
    assert list(WebhookEvent.objects.all()) == [recent]
    assert list(WebhookClaim.objects.values_list("event_id", flat=True)) == ["evt_recent"]
    assert "ledger.webhookevent" not in archive_expired(tmp_path, now=timezone.now() + LATER + timedelta(days=1))[1]


@postgresql_only
def test_a_partition_larger_than_partition_events_goes_a_checkpoints_stretch_a_run(settings, sequence, tmp_path):
    """After the upgrade the first partition holds the trail's whole history (migration 0032).
    Taken whole, it would be one transaction and one file, and deleted row by row if the drop
    missed its lock. A run takes at most PARTITION_EVENTS events (and a checkpoint's stretch),
    so it goes a stretch a run until what is left of it fits, then is dropped."""
    settings.AUDIT_CHECKPOINT_EVERY = 3
    assert not AuditEvent.objects.exists()
    start = top()
    sequence(start)
    AUDIT.extend(16)  # [start, start + 16) and [start + 16, start + 32)
    settings.PARTITION_EVENTS = 4
    agent, _ = make_agent("billing")
    noted(agent, 20)
    AuditEvent.objects.seal()
    partition = f"{AUDIT.table}_{start}"
    assert query(f"SELECT count(*) FROM {partition}") == [(16,)]

    taken_by_each_run = []
    while partition in {p.name for p in AUDIT.ranges()} and len(taken_by_each_run) < 10:
        taken_by_each_run.append(run(tmp_path)[1]["ledger.auditevent"])

    assert partition not in {p.name for p in AUDIT.ranges()}
    assert max(taken_by_each_run) <= settings.PARTITION_EVENTS, taken_by_each_run
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None
