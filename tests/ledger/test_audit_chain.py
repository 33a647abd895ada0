"""The audit trail on PostgreSQL: append-only from the moment it is written, sealed into one
chain by the sealer, tamper-evident.

These tests commit for real (transaction=True): the sealer chains committed events only.
"""

import threading

import pytest
from django.db import DatabaseError, connection, transaction

from ledger.audit import chain_hash, content_hash
from ledger.models import ActionStatus, AuditEvent
from tests.factories import make_action, make_agent

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the seal and the refusal are PostgreSQL triggers"),
]
S = ActionStatus


def held_action(agent, key):
    """A row that can be rejected: a transition that rings no worker."""
    return make_action(agent, S.HELD, key=key, target=key)


def sealed():
    AuditEvent.objects.seal()
    return list(AuditEvent.objects.order_by("seq"))


def test_the_sealer_chains_committed_events_with_consecutive_seq_and_a_valid_chain():
    agent, _ = make_agent("billing")
    with transaction.atomic():
        action = held_action(agent, "refund:ORD-A1:full:dec-1")
        event = AuditEvent.objects.record(actor="user:ops", verb="noted", obj=action, reason="inside")
    action.reject(actor="user:ops", reason="not needed")
    assert AuditEvent.objects.values_list("seq", "hash").get(pk=event.pk) == (None, "")
    unsealed = AuditEvent.objects.filter(seq__isnull=True).count()

    assert AuditEvent.objects.seal() == unsealed
    assert AuditEvent.objects.seal() == 0
    events = sealed()
    assert len(events) == unsealed
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert all(e.hash for e in events)
    previous = ""
    for e in events:
        assert e.prev_hash == previous
        assert e.content_hash == content_hash(e.content_fields())
        assert e.hash == chain_hash(previous, e.content_hash, e.seq)
        previous = e.hash
    assert AuditEvent.objects.verify_chain() is None


# What a provider may answer (a step's result reaches `after`), as PostgreSQL's jsonb gives it back:
# its numeric keeps the digits, not the text, so -0.0 comes back 0.0 and 1e+16 as 10000000000000000.
FLOATS = [-0.0, 1e16, 1e23, 1.5e300, -1e-7, 0.1]


@pytest.mark.parametrize("value", FLOATS)
def test_an_untouched_event_with_a_float_verifies(value):
    agent, _ = make_agent("billing")
    with transaction.atomic():
        AuditEvent.objects.record(actor="system:runner", verb="step_done", obj=agent,
                                  after={"step": "lookup_order", "result": {"amount": value}})
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None


def test_a_rolled_back_transaction_leaves_no_event_and_no_gap():
    agent, _ = make_agent("billing")
    action = held_action(agent, "refund:ORD-A2:full:dec-1")
    with pytest.raises(RuntimeError), transaction.atomic():
        action.reject(actor="user:ops", reason="rolled back")
        raise RuntimeError("abort")
    held_action(agent, "refund:ORD-A3:full:dec-1").reject(actor="user:ops", reason="kept")

    assert not AuditEvent.objects.filter(reason="rolled back").exists()
    assert [e.seq for e in sealed()] == list(range(1, AuditEvent.objects.count() + 1))
    assert AuditEvent.objects.verify_chain() is None


def test_events_committed_by_concurrent_transactions_and_sealed_by_concurrent_sealers_form_one_chain():
    agent, _ = make_agent("billing")
    actions = [held_action(agent, f"refund:ORD-C{i}:full:dec-1") for i in range(12)]
    sealers = 4
    barrier = threading.Barrier(len(actions) + sealers)
    errors = []

    def decide(action):
        try:
            barrier.wait()
            action.reject(actor="user:ops", reason=f"concurrent {action.pk}")
        except Exception as exc:  # reported below; a thread must not swallow it
            errors.append(exc)
        finally:
            connection.close()

    def seal():
        try:
            barrier.wait()
            for _ in range(5):
                AuditEvent.objects.seal(batch=3)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(a,)) for a in actions]
    threads += [threading.Thread(target=seal) for _ in range(sealers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert errors == []
    events = sealed()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert AuditEvent.objects.filter(verb="rejected").count() == len(actions)
    assert AuditEvent.objects.verify_chain() is None


def test_the_database_refuses_to_update_an_event():
    make_agent("billing")
    AuditEvent.objects.seal()
    event = AuditEvent.objects.order_by("seq").first()
    with pytest.raises(DatabaseError, match="append-only"), connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_auditevent SET reason = 'rewritten' WHERE id = %s", [event.pk])
    assert AuditEvent.objects.get(pk=event.pk).reason == event.reason


def test_the_database_refuses_to_update_only_the_seal_of_an_event():
    make_agent("billing")
    AuditEvent.objects.seal()
    event = AuditEvent.objects.order_by("seq").first()
    with pytest.raises(DatabaseError, match="append-only"), connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_auditevent SET seq = seq + 1000, hash = 'x' WHERE id = %s", [event.pk])
    assert AuditEvent.objects.verify_chain() is None


def test_only_the_next_link_of_the_chain_may_be_sealed():
    agent, _ = make_agent("billing")
    AuditEvent.objects.seal()
    last = AuditEvent.objects.order_by("-seq").first()
    with transaction.atomic():
        event = AuditEvent.objects.record(actor="user:ops", verb="noted", obj=agent, reason="to seal")
    right_hash = chain_hash(last.hash, event.content_hash, last.seq + 1)
    forgeries = [
        (last.seq + 1, last.hash, "0" * 64),                                      # a made-up hash
        (last.seq + 5, last.hash, chain_hash(last.hash, event.content_hash, last.seq + 5)),  # a gap
        (last.seq + 1, "f" * 64, chain_hash("f" * 64, event.content_hash, last.seq + 1)),    # another chain
    ]
    for seq, prev_hash, hash_ in forgeries:
        with pytest.raises(DatabaseError, match="next link"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("UPDATE ledger_auditevent SET seq = %s, prev_hash = %s, hash = %s WHERE id = %s",
                           [seq, prev_hash, hash_, event.pk])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_auditevent SET seq = %s, prev_hash = %s, hash = %s WHERE id = %s",
                       [last.seq + 1, last.hash, right_hash, event.pk])
    assert AuditEvent.objects.verify_chain() is None


def test_sealing_an_event_may_not_change_anything_else_nor_unseal_it():
    make_agent("billing")
    event = AuditEvent.objects.order_by("id").first()
    assert event.seq is None
    for sql in ("UPDATE ledger_auditevent SET seq = 1, reason = 'rewritten' WHERE id = %s",
                "UPDATE ledger_auditevent SET reason = 'rewritten' WHERE id = %s"):
        with pytest.raises(DatabaseError, match="append-only"), connection.cursor() as cursor:
            cursor.execute(sql, [event.pk])
    assert AuditEvent.objects.seal() == AuditEvent.objects.count()
    with pytest.raises(DatabaseError, match="append-only"), connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_auditevent SET seq = NULL, prev_hash = '', hash = '' WHERE id = %s", [event.pk])
    assert AuditEvent.objects.get(pk=event.pk).reason == event.reason
    assert AuditEvent.objects.verify_chain() is None


def test_the_database_refuses_to_delete_an_event():
    make_agent("billing")
    count = AuditEvent.objects.count()
    with pytest.raises(DatabaseError, match="append-only"), connection.cursor() as cursor:
        cursor.execute("DELETE FROM ledger_auditevent")
    assert AuditEvent.objects.count() == count


def test_the_orm_cannot_update_or_delete_events_either():
    make_agent("billing")
    AuditEvent.objects.seal()
    with pytest.raises(DatabaseError, match="append-only"):
        AuditEvent.objects.update(reason="rewritten")
    with pytest.raises(DatabaseError, match="append-only"):
        AuditEvent.objects.all().delete()
    assert AuditEvent.objects.verify_chain() is None


def tamper(sql, params, table="ledger_auditevent", trigger="ledger_audit_append_only"):
    """Write past the append-only trigger, as someone with the table owner's rights could."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}")
        cursor.execute(sql, params)
        cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER {trigger}")


def the_middle_of_three_sealed_events():
    agent, _ = make_agent("billing")
    for i in range(3):
        held_action(agent, f"refund:ORD-T{i}:full:dec-1").reject(actor="user:ops", reason=f"reason {i}")
    AuditEvent.objects.seal()
    return AuditEvent.objects.get(reason="reason 1")


def test_verify_chain_names_the_event_whose_reason_was_changed():
    target = the_middle_of_three_sealed_events()

    tamper("UPDATE ledger_auditevent SET reason = 'a better story' WHERE id = %s", [target.pk])

    assert AuditEvent.objects.verify_chain() == target.seq
    with pytest.raises(DatabaseError, match="append-only"), connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_auditevent SET reason = 'again' WHERE id = %s", [target.pk])


def test_verify_chain_names_the_event_after_a_deleted_one():
    victim = the_middle_of_three_sealed_events()

    tamper("DELETE FROM ledger_auditevent WHERE id = %s", [victim.pk])

    assert AuditEvent.objects.verify_chain() == victim.seq + 1


def test_verify_chain_names_the_event_whose_stored_link_was_changed():
    """Its content and its hash are untouched, but the link it shows names another event: whoever
    checks the event on its own recomputes its hash from that link, and the chain must not vouch
    for it."""
    target = the_middle_of_three_sealed_events()

    tamper("UPDATE ledger_auditevent SET prev_hash = %s WHERE id = %s", ["0" * 64, target.pk])

    report = AuditEvent.objects.chain_report()
    assert (report.broken_at, report.why) == (target.seq, "it does not follow the event before it")
    assert AuditEvent.objects.verify_chain() == target.seq


def test_verify_chain_notices_a_recomputed_content_hash():
    agent, _ = make_agent("billing")
    held_action(agent, "refund:ORD-R1:full:dec-1").reject(actor="user:ops", reason="original")
    AuditEvent.objects.seal()
    target = AuditEvent.objects.get(reason="original")
    target.reason = "forged"
    forged_hash = content_hash(target.content_fields())

    tamper("UPDATE ledger_auditevent SET reason = 'forged', content_hash = %s WHERE id = %s", [forged_hash, target.pk])

    assert AuditEvent.objects.verify_chain() == target.seq
