"""Every check knows where the chain's checkpoints must be: a chain that reaches past the seq by which
the next one is due is broken (checkpoints were removed), each checkpoint a walk passes is checked
(its signature, its hash, its link to the one before it), and the interval each was written under is
signed with it, so that a changed AUDIT_CHECKPOINT_EVERY is not read as checkpoints missing.

The attacker is the one of tests/ledger/test_archive_trusted.py: someone who writes to the database
behind the ledger's back (its triggers off) but does not hold its key."""

import pytest
from django.db import connection, transaction

from ledger import audit
from ledger.audit import audit_verify, chain_hash, content_hash
from ledger.models import AuditEvent, ChainCheck, ChainCheckpoint, ChainWalk
from tests.factories import make_agent
from tests.ledger.test_archive_trusted import whole_walk

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql",
                                     reason="switching triggers off is PostgreSQL's (session_replication_role)")


@pytest.fixture(autouse=True)
def every_five(settings):
    settings.AUDIT_CHECKPOINT_EVERY = 5


@pytest.fixture
def agent():
    return make_agent("billing")[0]


def noted(agent, n, start=0):
    """`n` more events, sealed; the chain's last seq."""
    with transaction.atomic():
        for i in range(start, start + n):
            AuditEvent.objects.record(actor="system:test", verb="noted", obj=agent, reason=f"note {i}")
    AuditEvent.objects.seal()
    return AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first()


def sealed_to(agent, seq):
    """Events recorded and sealed until the chain's last seq is `seq`."""
    return noted(agent, seq - AuditEvent.objects.count(), start=1000 + seq)


def behind_the_ledgers_back(*statements):
    """Statements with the ledger's triggers off, as only a database owner could."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        for sql, params in statements:
            cursor.execute(sql, params)


def rewrite_from(seq, reason="forged: refund approved by ops"):
    """The chain rewritten from `seq` to its end, so that it links: the event at `seq` says another
    thing, and every hash after it is recomputed."""
    statements = []
    prev = AuditEvent.objects.get(seq=seq - 1).hash
    for event in AuditEvent.objects.filter(seq__gte=seq).order_by("seq"):
        if event.seq == seq:
            event.reason = reason
            event.content_hash = content_hash(event.content_fields())
        event.prev_hash, event.hash = prev, chain_hash(prev, event.content_hash, event.seq)
        statements.append(("UPDATE ledger_auditevent SET reason = %s, content_hash = %s, prev_hash = %s, hash = %s "
                           "WHERE id = %s", [event.reason, event.content_hash, event.prev_hash, event.hash, event.pk]))
        prev = event.hash
    return statements


def every_check():
    return {"verify_chain": AuditEvent.objects.verify_chain(),
            "daily": audit_verify(since_checkpoint=True).broken_at,
            "newest stretch": audit_verify().broken_at,
            "whole walk": whole_walk().broken_at}


@postgresql_only
def test_a_rewritten_chain_whose_newer_checkpoints_were_deleted_fails_every_check(agent):
    top = noted(agent, 12)
    target = top - top % 5 - 2  # before the newest checkpoint
    behind_the_ledgers_back(*rewrite_from(target),
                            ("DELETE FROM ledger_chaincheckpoint WHERE seq >= %s", [target]),
                            ("DELETE FROM ledger_chaincheck", []), ("DELETE FROM ledger_chainwalk", []))
    kept = ChainCheckpoint.objects.first().seq
    assert kept < target

    results = every_check()

    due = kept + 5
    assert results == {"verify_chain": due, "daily": due, "newest stretch": due, "whole walk": due}, results
    assert ChainCheck.objects.filter(scope=ChainCheck.Scope.WHOLE).latest("id").why == (
        f"checkpoints are missing: the chain reaches seq {top}, and none is signed after seq {kept}, though one is "
        f"due by seq {due}")


@postgresql_only
def test_the_newest_stretchs_check_finds_the_newest_checkpoint_gone(agent):
    top = noted(agent, 12)
    assert audit_verify().broken_at is None  # a check that passed, as the sweeper's are
    newest = ChainCheckpoint.objects.first().seq
    behind_the_ledgers_back(("DELETE FROM ledger_chaincheckpoint WHERE seq = %s", [newest]))

    report = audit_verify()

    assert (report.broken_at, report.why) == (newest, f"checkpoints are missing: the chain reaches seq {top}, and "
                                                      f"none is signed after seq {newest - 5}, though one is due by "
                                                      f"seq {newest}")


@postgresql_only
def test_a_chain_rewritten_and_then_sealed_past_the_next_checkpoint_is_still_found(agent):
    """The sealer goes on: its next checkpoint signs the rewritten chain, but it follows the one
    before the hole, and the interval both signed says where one must have been."""
    top = noted(agent, 12)
    target = top - top % 5 - 2
    behind_the_ledgers_back(*rewrite_from(target),
                            ("DELETE FROM ledger_chaincheckpoint WHERE seq >= %s", [target]),
                            ("DELETE FROM ledger_chaincheck", []), ("DELETE FROM ledger_chainwalk", []))
    kept = ChainCheckpoint.objects.first().seq
    sealed_to(agent, kept + 10)  # to the next boundary: the seal writes a checkpoint there
    newest = ChainCheckpoint.objects.first()
    assert newest.seq > target and newest.prev_seq == kept and newest.problem() != ""

    why = f"no checkpoint at seq {kept + 5}, where one must be between those at seq {kept} and {newest.seq}: " \
          "checkpoints were removed"
    assert audit_verify(since_checkpoint=True).why == why  # the newest checkpoint follows the one before the hole
    assert AuditEvent.objects.verify_chain() == kept + 5
    walked = whole_walk()
    assert (walked.broken_at, walked.why) == (kept + 5, why)


@postgresql_only
def test_a_checkpoint_removed_between_two_is_found_by_the_one_after_it(agent):
    noted(agent, 17)
    seqs = list(ChainCheckpoint.objects.order_by("seq").values_list("seq", flat=True))
    assert len(seqs) >= 3
    middle = seqs[-2]
    assert audit_verify(since_checkpoint=True).broken_at is None
    behind_the_ledgers_back(("DELETE FROM ledger_chaincheckpoint WHERE seq = %s", [middle]))

    why = f"the checkpoint at seq {middle}, which the one at seq {seqs[-1]} follows, is missing"
    assert ChainCheckpoint.objects.get(seq=seqs[-1]).problem() == why
    assert audit_verify(since_checkpoint=True).why == why
    assert AuditEvent.objects.verify_chain() == middle
    assert (whole_walk().broken_at, ChainWalk.objects.first().why) == (middle, why)


@postgresql_only
def test_a_checkpoint_the_walk_passes_is_checked_not_only_the_events(agent):
    top = noted(agent, 12)
    assert whole_walk().broken_at is None
    # Not signed by the ledger: inserted behind its back, or its own row changed.
    assert top > 10
    event = AuditEvent.objects.get(seq=7)
    behind_the_ledgers_back(("INSERT INTO ledger_chaincheckpoint (seq, hash, signature, written_at) "
                             "VALUES (%s, %s, 'forged', now())", [event.seq, event.hash]))

    walked = whole_walk()
    assert (walked.broken_at, walked.why) == (7, "the checkpoint at seq 7 is not signed by this ledger")
    assert AuditEvent.objects.verify_chain() == 7


@postgresql_only
def test_a_checkpoints_link_changed_behind_the_ledgers_back_no_longer_holds(agent):
    noted(agent, 12)
    newest = ChainCheckpoint.objects.first()
    assert newest.interval() == 5
    behind_the_ledgers_back(("UPDATE ledger_chaincheckpoint SET every = 100 WHERE seq = %s", [newest.seq]))
    changed = ChainCheckpoint.objects.first()
    assert changed.interval() is None  # so the checks fall back on the interval in force
    assert changed.problem() == f"the checkpoint at seq {newest.seq} is not linked by this ledger to the one before it"


def test_each_checkpoint_is_linked_to_the_one_before_it_under_the_interval_it_was_written_under(agent):
    noted(agent, 12)
    checkpoints = list(ChainCheckpoint.objects.order_by("seq"))
    assert [(c.seq, c.every, c.prev_seq) for c in checkpoints] == [
        (5, 5, 0), (10, 5, 5)] + [(c.seq, 5, c.seq - 5) for c in checkpoints[2:]]
    assert [c.prev_hash for c in checkpoints[:2]] == ["", checkpoints[0].hash]
    assert all(c.problem() == "" and c.interval() == 5 for c in checkpoints)


def test_a_lowered_interval_is_not_read_as_checkpoints_missing(settings, agent):
    """A checkpoint at 10 under 10, seqs to 19 sealed under 10 with none due; lowered to 3, the
    seal writes the next at 21: the interval in force alone would want one by 15."""
    settings.AUDIT_CHECKPOINT_EVERY = 10
    top = sealed_to(agent, 19)
    newest = ChainCheckpoint.objects.get()
    assert (newest.seq, newest.every) == (10, 10)
    settings.AUDIT_CHECKPOINT_EVERY = 3
    assert audit.checkpoint_due(newest, 3) == 21 > top
    assert every_check() == dict.fromkeys(["verify_chain", "daily", "newest stretch", "whole walk"])
    noted(agent, 30)  # under 3 from here
    assert [(c.seq, c.every, c.prev_seq) for c in ChainCheckpoint.objects.order_by("seq")][:3] == [
        (10, 10, 0), (21, 3, 10), (24, 3, 21)]
    assert every_check() == dict.fromkeys(["verify_chain", "daily", "newest stretch", "whole walk"])


def test_a_raised_interval_is_not_read_as_checkpoints_missing(agent, settings):
    noted(agent, 12)
    settings.AUDIT_CHECKPOINT_EVERY = 7
    noted(agent, 30, start=12)
    assert {c.every for c in ChainCheckpoint.objects.all()} == {5, 7}
    assert every_check() == dict.fromkeys(["verify_chain", "daily", "newest stretch", "whole walk"])


def test_a_chain_that_reached_the_first_boundary_without_its_checkpoint_is_broken(agent, settings):
    settings.AUDIT_CHECKPOINT_EVERY = 1000
    top = noted(agent, 12)
    assert not ChainCheckpoint.objects.exists()
    assert audit_verify(since_checkpoint=True).broken_at is None
    settings.AUDIT_CHECKPOINT_EVERY = 5  # as if the seal had written its checkpoints, and they were removed
    report = audit_verify(since_checkpoint=True)
    assert (report.broken_at, report.why) == (5, f"checkpoints are missing: the chain reaches seq {top}, and none "
                                                 "is signed at all, though one is due by seq 5")


@postgresql_only
def test_checkpoints_written_before_they_were_linked_verify_as_before_and_the_next_follows_them(agent):
    noted(agent, 12)
    # As migration 0046 left the checkpoints written before it (and as the code before writes one
    # during the upgrade): no link, no interval.
    behind_the_ledgers_back(("UPDATE ledger_chaincheckpoint SET every = NULL, prev_seq = NULL, prev_hash = NULL, "
                             "link_signature = NULL", []))
    assert all(c.problem() == "" and c.interval() is None for c in ChainCheckpoint.objects.all())
    assert AuditEvent.objects.verify_chain() is None
    old = ChainCheckpoint.objects.first()
    sealed_to(agent, old.seq + 5)
    new = ChainCheckpoint.objects.first()
    assert (new.prev_seq, new.prev_hash, new.problem()) == (old.seq, old.hash, "")
    assert every_check() == dict.fromkeys(["verify_chain", "daily", "newest stretch", "whole walk"])
