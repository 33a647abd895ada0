"""The audit chain's checks and walks are bounded: an archive run takes those nothing reads into its
file, the checks of the newest stretch (one a sweeper pass that sealed events) once a later
whole-chain walk passed them, the others once they are past AUDIT_RETENTION_DAYS. The newest check,
the newest daily or whole one, the intact one that reached furthest and the newest walk stay: the
checks, the audit page and evidence records read them."""

import pytest
from django.utils import timezone

from dlq.archive import archive_expired
from ledger.audit import audit_verify, audit_verify_due, audit_walk
from ledger.models import AuditEvent, ChainCheck, ChainWalk
from tests.dlq.test_archive_expired import agent, billing, checkpoints_every_five, ledger, lines, run  # noqa: F401

pytestmark = pytest.mark.django_db
NEWEST, CHECKPOINT, WHOLE = ChainCheck.Scope.NEWEST, ChainCheck.Scope.CHECKPOINT, ChainCheck.Scope.WHOLE


def newest_stretch_checked(action, note):
    """An event sealed, then the newest stretch checked, as a sweeper pass does."""
    AuditEvent.objects.record(actor="system:test", verb="noted", obj=action, reason=note)
    AuditEvent.objects.seal()
    return audit_verify()


def whole_walk():
    audit_walk(start=True)
    while audit_walk():
        pass


def checks():
    return list(ChainCheck.objects.order_by("id").values_list("scope", flat=True))


def test_checks_and_walks_nothing_reads_go_to_the_file(tmp_path, ledger):
    audit_verify(since_checkpoint=True)
    for note in ("a", "b"):
        newest_stretch_checked(ledger["done"], note)
    whole_walk()
    furthest = newest_stretch_checked(ledger["done"], "c")
    assert checks() == [CHECKPOINT, NEWEST, NEWEST, WHOLE, NEWEST]
    passed = list(ChainCheck.objects.filter(scope=NEWEST).order_by("id").values_list("pk", flat=True))[:2]

    # Today: only the newest stretch's checks the walk passed.
    archive, counts = archive_expired(tmp_path, now=timezone.now())
    assert counts == {"ledger.chaincheck": 2} == archive.removed
    assert checks() == [CHECKPOINT, WHOLE, NEWEST]
    assert [row["pk"] for row in lines(tmp_path / archive.file)[1:]] == passed
    # The checks read on: the next stretch starts where the furthest intact one ended, and the daily
    # one is not due again before a day.
    assert newest_stretch_checked(ledger["done"], "d").broken_at is None
    assert ChainCheck.objects.first().from_seq == furthest.through_seq + 1
    assert audit_verify_due() == 0 and checks() == [CHECKPOINT, WHOLE, NEWEST, NEWEST]

    whole_walk()  # a second walk: the first, and its check, are no longer the newest
    first_walk = ChainWalk.objects.order_by("id").first()
    _, counts = run(tmp_path)  # past the audit retention
    assert counts["ledger.chaincheck"] == 4 and counts["ledger.chainwalk"] == 1
    assert checks() == [WHOLE]  # the newest, the last daily one and the furthest intact
    assert list(ChainWalk.objects.exclude(pk=first_walk.pk)) == list(ChainWalk.objects.all())
    assert audit_verify().broken_at is None
