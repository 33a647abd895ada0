"""`manage.py audit_verify` and the sweeper verify the audit chain and record what they found;
the audit page shows the last result: intact through a seq, or the first broken link."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db.models import Max

from ledger.audit import actor_label, audit_verify, audit_verify_due
from ledger.models import AuditEvent, ChainCheck, ChainCheckpoint
from tests.factories import make_agent
from tests.ledger.test_audit_chain import held_action, tamper

pytestmark = pytest.mark.django_db


@pytest.fixture
def chain():
    """Nine sealed events: three actions created, held and rejected."""
    agent, _ = make_agent("billing")
    for i in range(3):
        held_action(agent, f"refund:ORD-V{i}:full:dec-1").reject(actor="user:ops", reason=f"reason {i}")
    AuditEvent.objects.seal()
    return list(AuditEvent.objects.order_by("seq"))


def verify(*args):
    """The command's output, or the error it exits non-zero with."""
    try:
        call_command("audit_verify", *args, stdout=(out := io.StringIO()))
    except CommandError as exc:
        return f"ERROR {exc}"
    return out.getvalue().strip()


def test_an_intact_chain_is_reported_through_its_last_seq_and_recorded(chain):
    assert verify() == f"chain intact through seq {chain[-1].seq} ({len(chain)} events checked)"
    check = ChainCheck.objects.get()
    assert (check.scope, check.from_seq, check.through_seq, check.broken_at) == ("whole", 1, chain[-1].seq, None)


def test_an_altered_event_is_the_first_broken_link_and_the_command_fails(chain):
    target = next(e for e in chain if e.reason == "reason 1")
    tamper("UPDATE ledger_auditevent SET reason = 'a better story' WHERE id = %s", [target.pk])

    assert verify() == (f"ERROR chain broken at seq {target.seq}: its content was altered after it was written "
                        f"(intact through seq {target.seq - 1})")
    assert ChainCheck.objects.get().broken_at == target.seq


def test_a_removed_event_is_named(chain):
    victim = chain[4]
    tamper("DELETE FROM ledger_auditevent WHERE id = %s", [victim.pk])
    assert verify().startswith(f"ERROR chain broken at seq {victim.seq + 1}: events #{victim.seq} to #{victim.seq} "
                               "are missing")


def test_events_removed_from_the_end_after_a_check_are_noticed(chain):
    assert verify().startswith("chain intact")
    tamper("DELETE FROM ledger_auditevent WHERE seq > %s", [chain[-3].seq])
    assert verify("--newest").startswith(f"ERROR chain broken at seq {chain[-3].seq + 1}: events "
                                         f"#{chain[-3].seq + 1} to #{chain[-1].seq} were removed")


def test_events_removed_from_the_end_after_a_check_are_noticed_once_the_sealer_refilled_their_seqs(chain):
    """The sealer chains the next events onto what is left, so the chain is as long as before and
    links from seq 1: only the hash the check found at its end tells the events there apart."""
    assert audit_verify().broken_at is None
    tamper("DELETE FROM ledger_auditevent WHERE seq > %s", [chain[-3].seq])
    agent, _ = make_agent("support")
    for i in range(3):
        held_action(agent, f"refund:ORD-U{i}:full:dec-1").reject(actor="user:ops", reason="later")
    AuditEvent.objects.seal()
    assert AuditEvent.objects.aggregate(top=Max("seq"))["top"] > chain[-1].seq

    for since_checkpoint in (False, True):
        report = audit_verify(since_checkpoint=since_checkpoint)
        assert (report.broken_at, report.why) == (chain[-1].seq, "its hash changed after a check passed it")
    assert list(ChainCheck.objects.order_by("id").values_list("scope", "broken_at")) == [
        ("whole", None), ("newest", chain[-1].seq), ("whole", chain[-1].seq)]


def test_the_event_a_check_ended_at_removed_is_noticed_though_a_checkpoint_came_after_it(chain, settings):
    """The daily check walks from the last checkpoint, past the seq the newest check ended at."""
    assert audit_verify().broken_at is None
    settings.AUDIT_CHECKPOINT_EVERY = 5
    agent, _ = make_agent("support")
    held_action(agent, "refund:ORD-U9:full:dec-1").reject(actor="user:ops", reason="later")
    AuditEvent.objects.seal()
    assert ChainCheckpoint.objects.first().seq > chain[-1].seq
    tamper("DELETE FROM ledger_auditevent WHERE seq = %s", [chain[-1].seq])

    report = audit_verify(since_checkpoint=True)
    assert (report.broken_at, report.why) == (chain[-1].seq, f"event #{chain[-1].seq}, where a check ended, is missing")


def test_a_check_recorded_before_checks_kept_their_hash_vouches_for_the_chains_length_alone(chain):
    assert audit_verify().broken_at is None
    ChainCheck.objects.update(through_hash=None)  # as migration 0043 left the checks before it
    agent, _ = make_agent("support")
    held_action(agent, "refund:ORD-U9:full:dec-1")
    AuditEvent.objects.seal()
    assert audit_verify().broken_at is None
    ChainCheck.objects.update(through_hash=None)
    tamper("DELETE FROM ledger_auditevent WHERE seq > %s", [chain[-3].seq])
    assert audit_verify(since_checkpoint=True).broken_at == chain[-3].seq + 1


def test_the_sweeper_checks_the_whole_chain_first_then_only_what_is_new(chain):
    assert audit_verify_due() == len(chain)
    assert audit_verify_due() == 0  # nothing new: no row either
    agent, _ = make_agent("support")
    held_action(agent, "refund:ORD-V9:full:dec-1")
    AuditEvent.objects.seal()
    assert audit_verify_due() == AuditEvent.objects.count() - len(chain)
    assert list(ChainCheck.objects.order_by("id").values_list("scope", "from_seq")) == [
        ("whole", 1), ("newest", chain[-1].seq + 1)]


def test_the_audit_page_shows_the_last_result(client, chain):
    admin = get_user_model().objects.create_superuser("root", password=None)
    client.force_login(admin)
    assert 'data-chain="unchecked"' in client.get("/audit/").content.decode()
    audit_verify()
    assert f"intact through event #{chain[-1].seq}" in client.get("/audit/").content.decode()
    tamper("UPDATE ledger_auditevent SET reason = 'forged' WHERE id = %s", [chain[2].pk])
    assert verify("--whole").startswith("ERROR")
    page = client.get("/audit/").content.decode()
    assert f"broken at event #{chain[2].seq}:" in page and "its content was altered" in page


def test_every_actor_label_fits_its_columns_and_two_long_names_never_share_one():
    """Django allows 150-character usernames; `user:` and such a name do not fit the 150 of
    AuditEvent.actor (nor of a review item's or dead letter's `decided_by`)."""
    users = get_user_model().objects
    fits = users.create_user("f" * 145)  # user: + 145 = 150, the longest that fits as it is
    assert actor_label(fits) == "user:" + "f" * 145
    assert actor_label(users.create_user("ops")) == "user:ops"
    assert actor_label("system:archive") == "system:archive"

    same_start = [users.create_user("a" * 140 + tail) for tail in ("b" * 10, "c" * 10, "b" * 9 + "c")]
    labels = [actor_label(user) for user in same_start]
    assert all(len(label) == 150 and label.startswith("user:" + "a" * 128 + "~") for label in labels)
    assert len(set(labels)) == 3
    assert labels[0] == actor_label(users.get(pk=same_start[0].pk)) == actor_label("user:" + "a" * 140 + "b" * 10)
    assert actor_label(labels[0]) == labels[0]  # a label already fitted stays as it is
    assert len(actor_label(users.create_user("d" * 146))) == 150


def test_an_audited_move_of_a_person_with_a_150_character_name_is_recorded():
    person = get_user_model().objects.create_user("p" * 150)
    agent, _ = make_agent("billing")
    held_action(agent, "refund:ORD-L1:full:dec-1").reject(actor=person, reason="too long a name is no reason")
    event = AuditEvent.objects.get(verb="rejected")
    assert event.actor == actor_label(person) and len(event.actor) == 150
    AuditEvent.objects.seal()
    assert audit_verify(since_checkpoint=True).broken_at is None
