"""Checkpoints of the audit chain: the seal signs the chain's hash every AUDIT_CHECKPOINT_EVERY
events, the daily check starts from the last one, the whole chain is walked a stretch at a time
from stored progress, and the evidence record names the checkpoint that covers its events."""

import json
import os
import signal
import subprocess

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import DatabaseError, IntegrityError, transaction

from console.evidence import evidence_export
from ledger.audit import audit_walk, checkpoint_signature
from ledger.evidence import evidence_actions, record_problems
from ledger.models import AuditEvent, ChainCheck, ChainCheckpoint, ChainWalk
from tests.conftest import PYTHON, REDIS_URL, ROOT, _database_url
from tests.factories import make_agent
from tests.ledger.test_audit_chain import held_action, tamper
from tests.ledger.test_audit_verify import chain, verify  # noqa: F401 (chain: the nine sealed events' fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def every_four(settings):
    """Checkpoints at seq 3 and 6 of the eight events of `chain`."""
    settings.AUDIT_CHECKPOINT_EVERY = 3


def alter(event):
    tamper("UPDATE ledger_auditevent SET reason = 'a better story' WHERE id = %s", [event.pk])


def test_it_writes_a_signed_checkpoint_of_the_chains_hash_at_each_boundary_the_seal_passes():
    agent, _ = make_agent("billing")
    for i in range(2):
        held_action(agent, f"refund:ORD-K{i}:full:dec-1").reject(actor="user:ops", reason=f"reason {i}")

    assert AuditEvent.objects.seal(batch=4) == 7  # seq 3 in the first batch, 6 in the second

    hashes = dict(AuditEvent.objects.values_list("seq", "hash"))
    assert [(c.seq, c.hash) for c in ChainCheckpoint.objects.all()] == [(6, hashes[6]), (3, hashes[3])]
    assert all(c.signature == checkpoint_signature(c.seq, c.hash) and c.problem() == ""
               for c in ChainCheckpoint.objects.all())


def test_the_database_refuses_to_change_or_remove_a_checkpoint(chain):
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        ChainCheckpoint.objects.filter(seq=6).update(signature="forged")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        ChainCheckpoint.objects.filter(seq=6).delete()
    assert list(ChainCheckpoint.objects.values_list("seq", flat=True)) == [6, 3]


def test_the_daily_check_starts_after_the_last_checkpoint_and_passes_over_a_change_before_it(chain):
    assert list(ChainCheckpoint.objects.values_list("seq", flat=True)) == [6, 3]
    alter(chain[1])

    assert verify() == "chain intact through seq 8 (2 events checked)"
    check = ChainCheck.objects.get()
    assert (check.scope, check.from_seq, check.through_seq) == ("checkpoint", 7, 8)
    assert verify("--whole") == ("ERROR whole-chain check broken: through seq 1 of 8: broken at seq 2: its content "
                                 "was altered after it was written")
    assert ChainCheck.objects.first().broken_at == 2


def test_the_daily_check_finds_a_change_after_the_last_checkpoint(chain):
    alter(chain[7])
    assert verify() == ("ERROR chain broken at seq 8: its content was altered after it was written "
                        "(intact through seq 7)")


def test_a_checkpoint_not_signed_by_this_ledger_is_refused(chain):
    top = chain[-1]
    ChainCheckpoint.objects.create(seq=top.seq, hash=top.hash, signature="forged")
    assert verify() == "ERROR chain broken at seq 8: the checkpoint at seq 8 is not signed by this ledger " \
                       "(intact through seq 0)"


def test_a_checkpoint_whose_seq_no_longer_carries_its_hash_is_refused(chain):
    tamper("UPDATE ledger_auditevent SET hash = %s WHERE seq = 6", ["0" * 64])
    assert verify().startswith("ERROR chain broken at seq 6: the chain's hash at seq 6 is not the checkpoint's")


def test_the_whole_chain_walk_resumes_from_the_seq_it_reached_and_shows_its_progress(client, chain):
    assert audit_walk(batch=3) == 3
    walk = ChainWalk.objects.get()
    assert (walk.outcome, walk.seq_reached, walk.target_seq, walk.hash_reached) == ("running", 3, 8, chain[2].hash)
    admin = get_user_model().objects.create_superuser("root", password=None)
    client.force_login(admin)
    assert "through event #3 of #8 (37 %)" in client.get("/audit/").content.decode()

    # The walk stops here (a sweeper killed, a step's lease lost). A change to what it already
    # passed shows that the next run resumes from seq 4 rather than starting over.
    alter(chain[1])
    assert audit_walk(batch=3) == 3
    assert audit_walk(batch=3) == 2
    walk.refresh_from_db()
    assert (walk.outcome, walk.seq_reached, walk.events) == ("intact", 8, 8)
    check = ChainCheck.objects.get()
    assert (check.scope, check.from_seq, check.through_seq, check.broken_at) == ("whole", 1, 8, None)
    assert audit_walk(batch=3) == 0  # the next walk is due in a day
    assert 'data-walk="intact"' in client.get("/audit/").content.decode()


def test_the_walk_notices_that_the_link_it_stopped_at_changed(chain):
    audit_walk(batch=3)
    tamper("UPDATE ledger_auditevent SET hash = %s WHERE seq = 3", ["0" * 64])
    audit_walk(batch=3)
    assert (ChainWalk.objects.get().outcome, ChainCheck.objects.get().why) == (
        "broken", "its hash changed after the walk passed it")


def test_the_evidence_record_names_the_first_checkpoint_after_its_events_or_none_yet(chain):
    first, last = (evidence_actions().get(operation_key=f"refund:ORD-V{i}:full:dec-1") for i in (0, 2))

    record = evidence_export(first)
    assert max(e["seq"] for e in record["audit"]["events"]) == 6
    assert record["audit"]["checkpoint"]["seq"] == 6 and record_problems(record) == []
    assert evidence_export(last)["audit"]["checkpoint"] is None  # seq 8: not yet checkpointed

    tamper("UPDATE ledger_chaincheckpoint SET signature = 'forged' WHERE seq = 6", [],
           table="ledger_chaincheckpoint", trigger="ledger_checkpoint_append_only")
    record = evidence_export(first)
    assert record_problems(record) == ["the checkpoint at seq 6 is not signed by this ledger"]


def test_the_command_walks_the_whole_chain_printing_its_progress_and_resumes_a_walk_in_progress(settings, chain):
    settings.AUDIT_WALK_BATCH = 3
    audit_walk()  # a walk a sweeper started, then stopped at seq 3
    assert verify("--whole").splitlines() == ["whole-chain check running: through seq 3 of 8",
                                              "whole-chain check running: through seq 6 of 8",
                                              "whole-chain check intact: through seq 8 of 8 (8 events checked)"]
    assert ChainWalk.objects.count() == 1


def test_a_walk_that_ends_after_a_newer_check_does_not_hide_events_removed_from_the_end(chain):
    audit_walk(batch=3)  # its target: seq 8, the chain's end now
    agent, _ = make_agent("support")
    held_action(agent, "refund:ORD-V9:full:dec-1").reject(actor="user:ops", reason="later")
    AuditEvent.objects.seal()
    top = AuditEvent.objects.order_by("-seq").first().seq
    assert verify("--newest").startswith(f"chain intact through seq {top}")
    audit_walk(batch=10)  # done through seq 8, after the check through the top
    tamper("DELETE FROM ledger_auditevent WHERE seq = %s", [top])
    assert verify("--newest").startswith(f"ERROR chain broken at seq {top}: events #{top} to #{top} were removed")


@pytest.mark.django_db(transaction=True)
def test_a_walk_whose_process_is_killed_resumes_from_the_seq_it_reached():
    """A real SIGKILL of `audit_verify --whole` mid-walk (one event a stretch): the next run
    goes on from the stored progress, so every event is counted once."""
    agent, _ = make_agent("billing")
    with transaction.atomic():
        for i in range(300):
            AuditEvent.objects.record(actor="user:ops", verb="noted", obj=agent, reason=f"note {i}")
    target = AuditEvent.objects.seal()
    walker = subprocess.Popen(
        [PYTHON, "manage.py", "audit_verify", "--whole"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "DATABASE_URL": _database_url(), "REDIS_URL": REDIS_URL, "AUDIT_WALK_BATCH": "1",
             "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    try:
        assert walker.stdout.readline().startswith("whole-chain check running: through seq ")
    finally:
        os.killpg(walker.pid, signal.SIGKILL)
        walker.wait()
    stopped = ChainWalk.objects.get()
    assert stopped.outcome == "running" and 0 < stopped.seq_reached < target

    assert audit_walk(batch=target) == target - stopped.seq_reached
    walk = ChainWalk.objects.get()
    assert (walk.outcome, walk.seq_reached, walk.events) == ("intact", target, target)


def test_the_database_holds_one_walk_in_progress_at_a_time(chain):
    audit_walk(batch=3)  # a walk in progress
    with pytest.raises(IntegrityError), transaction.atomic():
        ChainWalk.objects.create(target_seq=8)  # a second sweeper's, started meanwhile
    audit_walk(batch=3)
    assert ChainWalk.objects.count() == 1 and ChainWalk.objects.get().seq_reached == 6


ROTATED = "rotated-secret-key-" + "x" * 40


def test_a_rotated_secret_key_still_vouches_for_the_checkpoints_it_signed_as_a_fallback(settings, chain):
    """Checkpoints are append-only: after a rotation the old key must go on vouching for what it
    signed (SECRET_KEY_FALLBACKS, as Django's signing does), or the chain is broken for good."""
    old = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = ROTATED, [old]
    assert verify() == "chain intact through seq 8 (2 events checked)"
    assert all(c.problem() == "" for c in ChainCheckpoint.objects.all())

    # New checkpoints are signed with the new key alone.
    agent, _ = make_agent("support")
    held_action(agent, "refund:ORD-R1:full:dec-1").reject(actor="user:ops", reason="after the rotation")
    AuditEvent.objects.seal()
    new = ChainCheckpoint.objects.first()
    assert new.seq > 8 and new.signature == checkpoint_signature(new.seq, new.hash)
    assert verify("--newest").startswith("chain intact")
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = old, []
    assert new.problem() == f"the checkpoint at seq {new.seq} is not signed by this ledger"


def test_a_key_dropped_from_the_fallbacks_no_longer_vouches(settings, chain):
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = ROTATED, ["some other retired key"]
    assert verify() == "ERROR chain broken at seq 6: the checkpoint at seq 6 is not signed by this ledger " \
                       "(intact through seq 0)"


def test_an_evidence_record_signed_before_a_rotation_still_verifies_against_the_database(settings, chain, tmp_path):
    first = evidence_actions().get(operation_key="refund:ORD-V0:full:dec-1")
    saved = tmp_path / "evidence.json"
    saved.write_text(json.dumps(evidence_export(first)))
    old = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = ROTATED, [old]

    record = json.loads(saved.read_text())
    assert record_problems(record) == []
    call_command("evidence_verify", str(saved))
    # A record made now is signed with the new key, which the old one alone does not accept.
    fresh = evidence_export(first)
    assert fresh["integrity"]["signature"] != record["integrity"]["signature"]
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = old, []
    assert record_problems(fresh) == ["the signature is not this ledger's for this digest"]
