"""A check of the chain that an archive run overtakes while it reads: the run commits between the
check's read of the chain's start (`chain_start`) and its reads of the events, and takes the
(whole) events from the old start up to its own checkpoint. The check goes on from the new start,
as one begun after the run would, instead of finding them missing or changed. The whole-chain walk,
`verify_chain` and `evidence_verify --chain` (PostgreSQL: the run commits from a connection of its
own, as a second process's would)."""

import json
import threading
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from dlq.archive import archive_expired
from ledger import audit
from ledger.audit import audit_walk
from ledger.evidence import evidence_actions, evidence_record
from ledger.models import AuditEvent, ChainCheck, ChainWalk
from tests.dlq.test_archive_expired import LATER, agent, billing, checkpoints_every_five, ledger, run  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="a run committed from another connection")]


def archived_elsewhere(directory):
    """An archive run, committed by another connection; the run's `Archive`."""
    done = []

    def archive():
        try:
            done.append(archive_expired(directory, now=timezone.now() + LATER)[0])
        finally:
            connection.close()  # the thread's own connection

    thread = threading.Thread(target=archive)
    thread.start()
    thread.join(30)
    assert done and done[0] is not None, "the other connection archived nothing"
    return done[0]


@pytest.fixture
def meanwhile(monkeypatch, tmp_path):
    """`chain_start` as it is, observed: once armed (`arm()`), the next time a check asks it, an
    archive run commits right after it answers (`runs`)."""
    chain_start, armed, runs = audit.chain_start, [], []

    def start_then_a_run():
        origin = chain_start()
        if armed:
            armed.clear()
            runs.append(archived_elsewhere(tmp_path))
            assert runs[-1].checkpoint.seq > origin.seq
        return origin

    monkeypatch.setattr(audit, "chain_start", start_then_a_run)
    return SimpleNamespace(arm=lambda: armed.append(True), runs=runs)


@pytest.fixture
def archived_once(ledger, tmp_path):
    """The ledger after a first archive run: the chain starts at its checkpoint (seq 5), and the
    next run takes it on to the next one (seq 10)."""
    first, _ = run(tmp_path)
    AuditEvent.objects.seal()  # the run's own event
    assert audit.chain_start() == first.checkpoint
    return first


def walked_to_the_end():
    for _ in range(50):
        if not ChainWalk.objects.filter(finished_at__isnull=True).exists():
            break
        audit_walk(batch=2)
    return ChainWalk.objects.get()


def test_a_walk_a_run_overtakes_mid_stretch_goes_on_from_its_checkpoint(archived_once, meanwhile):
    audit_walk(start=True, batch=2)
    assert ChainWalk.objects.get().seq_reached == archived_once.checkpoint.seq + 2
    meanwhile.arm()  # the run takes the seq the walk reached ("its hash changed after the walk passed it")

    walk = walked_to_the_end()

    second, = meanwhile.runs
    assert (walk.outcome, walk.why) == ("intact", "")
    check = ChainCheck.objects.filter(scope=ChainCheck.Scope.WHOLE).latest("id")
    assert (check.broken_at, check.from_seq) == (None, second.checkpoint.seq + 1)


def test_a_walk_a_run_overtakes_at_the_chains_start_goes_on_from_its_checkpoint(archived_once, meanwhile):
    meanwhile.arm()  # the run takes the start's own event ("event #5, which the checkpoint vouches for, is missing")
    audit_walk(start=True, batch=2)

    walk = walked_to_the_end()

    assert meanwhile.runs
    assert (walk.outcome, walk.why) == ("intact", "")


def test_verify_chain_overtaken_by_a_run_holds(archived_once, meanwhile):
    meanwhile.arm()
    assert AuditEvent.objects.verify_chain() is None
    assert meanwhile.runs


def test_evidence_verify_chain_overtaken_by_a_run_holds(ledger, meanwhile, tmp_path):
    saved = tmp_path / "evidence.json"
    saved.write_text(json.dumps(evidence_record(evidence_actions().get(pk=ledger["open"].pk), [])))
    run(tmp_path)
    AuditEvent.objects.seal()
    meanwhile.arm()

    call_command("evidence_verify", str(saved), "--archives", str(tmp_path), "--chain")

    assert meanwhile.runs
