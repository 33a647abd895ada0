"""Every status field but the action's (test_action_status_machine.py) has one machine: a
named table, written out here rather than read from the product, and every pair of statuses
either moves (audited where the model audits its moves) or is refused and changes nothing.
There is one `_move`, and every call of it is a model's own named transition (`self._move`)."""

import ast
import itertools
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from approvals.models import REVIEW_TRANSITIONS, ReviewItem, ReviewStatus
from dlq.incidents import Incident
from dlq.models import ENTRY_TRANSITIONS, Alert, DeadLetter, EntryStatus
from ledger.models import (STEP_TRANSITIONS, TASK_TRANSITIONS, Action, AuditEvent, Booking, InvalidTransition,
                           StepStatus, Task, TaskState, TaskStep)
from tests.factories import make_agent

ROOT = Path(__file__).resolve().parents[2]

TASK = {
    "queued": {"running", "cancelled", "dead_lettered"},
    "running": {"queued", "waiting", "succeeded", "failed", "dead_lettered"},
    "waiting": {"queued", "failed", "cancelled"},
    "dead_lettered": {"queued", "cancelled"},
    "succeeded": set(), "failed": set(), "cancelled": set(),
}
STEP = {
    "pending": {"running", "done", "failed", "skipped"},
    "running": {"done", "failed"},
    "failed": {"running", "done", "failed"},
    "done": set(), "skipped": set(),
}
BOOKING = {"pending": {"confirmed", "released"}, "confirmed": set(),
           "released": {"confirmed"}}  # only a booking whose action a person then did by hand (Booking._refuse)
REVIEW = {"open": {"approved", "rejected", "resolved", "closed", "edited", "expired"},
          "approved": set(), "rejected": set(), "resolved": {"open"},
          "closed": {"open"},  # only an approval a hold closed, waiting again with its approvals (ReviewItem._refuse)
          "edited": set(), "expired": set()}
ENTRY = {"open": {"redriven", "resolved", "discarded"}, "redriven": set(), "resolved": set(), "discarded": set()}


def as_strings(table):
    return {str(a): {str(b) for b in to} for a, to in table.items()}


@pytest.mark.parametrize(("product", "expected", "statuses"), [
    (TASK_TRANSITIONS, TASK, TaskState.values),
    (STEP_TRANSITIONS, STEP, StepStatus.values),
    (Booking.TRANSITIONS, BOOKING, Booking.Status.values),
    (REVIEW_TRANSITIONS, REVIEW, ReviewStatus.values),
    (ENTRY_TRANSITIONS, ENTRY, EntryStatus.values),
], ids=["task", "step", "booking", "review item", "dead-letter entry"])
def test_each_machine_has_exactly_this_table_over_every_status(product, expected, statuses):
    assert as_strings(product) == expected
    assert set(expected) == set(statuses)


def pairs(table):
    return [pytest.param(a, b, b in table[a], id=f"{a}->{b}") for a, b in itertools.product(table, table)]


@pytest.fixture
def agent(db):
    return make_agent("billing", grants=())[0]


def task_in(agent, state):
    required = {"queued": {"next_attempt_at": timezone.now()},
                "running": {"lease_expires_at": timezone.now() + timedelta(seconds=30)}}.get(state, {})
    return Task.objects.create(task_id=f"t-{state}", fingerprint="f" * 64, workflow="refund", input={}, agent=agent,
                               state=state, max_attempts=3, **required)


def action_for(agent, key="refund:ORD-1", **fields):
    return Action.objects.create(**{"operation_key": key, "fingerprint": "f" * 64, "action_type": "refund",
                                    "target": "ORD-1", "params": {}, "agent": agent, "status": "held", **fields})


def failed_action_for(agent, **error):
    """A failed action whose error says `error` besides that it was declined."""
    return action_for(agent, status="failed", error={"code": "declined", "message": "no", "retryable": False, **error})


def audited(obj):
    return AuditEvent.objects.filter(object_type=obj._meta.label_lower, object_id=str(obj.pk)).count()


def moves_or_refuses(row, move, target, allowed, *, audits):
    before, events = type(row).objects.values().get(pk=row.pk), audited(row)
    if allowed:
        move()
        assert getattr(type(row).objects.get(pk=row.pk), getattr(row, "STATUS_FIELD", "status")) == target
        assert audited(row) == events + (1 if audits else 0)
    else:
        with pytest.raises(InvalidTransition):
            move()
        assert type(row).objects.values().get(pk=row.pk) == before
        assert audited(row) == events


@pytest.mark.parametrize(("source", "target", "allowed"), pairs(TASK))
def test_task_moves(agent, source, target, allowed):
    task = task_in(agent, source)
    required = {"queued": {"next_attempt_at": timezone.now()},
                "running": {"lease_expires_at": timezone.now() + timedelta(seconds=30)}}.get(target, {})
    moves_or_refuses(task, lambda: task._move(target, actor="system:tests", verb="test", **required),
                     target, allowed, audits=True)


@pytest.mark.parametrize(("source", "target", "allowed"), pairs(STEP))
def test_step_moves(agent, source, target, allowed):
    step = TaskStep.objects.create(task=task_in(agent, "running"), position=0, name="call_refund_api", status=source)
    moves_or_refuses(step, lambda: step._move(target), target, allowed, audits=False)


@pytest.mark.parametrize(("source", "target", "allowed"), pairs(BOOKING))
def test_booking_moves(agent, source, target, allowed):
    # The one way back from released (Booking._refuse): its action done by hand.
    back = (source, target) == ("released", "confirmed")
    action = failed_action_for(agent, done_by_hand=True) if back else action_for(agent)
    start = timezone.now() + timedelta(days=1)
    booking = Booking.objects.create(action=action, resource="room-1", customer="c", start=start,
                                     end=start + timedelta(hours=1), status=source)
    moves_or_refuses(booking, lambda: booking._move(target), target, allowed, audits=False)


@pytest.mark.parametrize("error", [{}, {"given_up": True}, {"done_by_hand": False}],
                         ids=["failed_for_good", "given_up", "not_marked_true"])
def test_only_a_booking_done_by_hand_is_confirmed_once_released(agent, error):
    """Released, its slot may be another's now: a booking that failed for good, or was given up, does
    not take it again; one a person then booked by hand does (ledger.actions._book_again)."""
    start = timezone.now() + timedelta(days=1)
    booking = Booking.objects.create(action=failed_action_for(agent, **error), resource="room-1", customer="c",
                                     start=start, end=start + timedelta(hours=1), status="released")
    moves_or_refuses(booking, booking.confirm, "confirmed", False, audits=False)


@pytest.mark.parametrize(("source", "target", "allowed"), pairs(REVIEW))
def test_review_item_moves(agent, source, target, allowed):
    # The two ways back to open (ReviewItem._refuse): an unknown outcome a person sent back to verify,
    # and an approval a hold closed.
    back = (source, target) == ("resolved", "open")
    kind = "unknown_outcome" if back else "approval" if (source, target) == ("closed", "open") else "held"
    item = ReviewItem.objects.create(kind=kind, action=action_for(agent), status=source,
                                     deadline=timezone.now() + timedelta(hours=4))
    if back:
        AuditEvent.objects.record(actor="user:tests", verb="verify", obj=item)
    moves_or_refuses(item, lambda: item._move(target, actor="system:tests", verb="test"), target, allowed, audits=True)


@pytest.mark.parametrize("kind", ["held", "unknown_outcome"])
def test_only_an_approval_item_opens_again_once_closed(agent, kind):
    item = ReviewItem.objects.create(kind=kind, action=action_for(agent), status="closed",
                                     deadline=timezone.now() + timedelta(hours=4))
    moves_or_refuses(item, lambda: item._move("open", actor="system:tests", verb="test"), "open", False, audits=True)


@pytest.mark.parametrize(("source", "target", "allowed"), pairs(ENTRY))
def test_dead_letter_entry_moves(agent, source, target, allowed):
    entry = DeadLetter.objects.create(task=task_in(agent, "dead_lettered"), status=source, snapshot={}, attempts=3)
    Alert.objects.raise_for(entry)  # the database refuses to commit an entry without one
    moves_or_refuses(entry, lambda: entry._move(target, actor="system:tests", verb="test"), target, allowed,
                     audits=True)


def test_the_database_refuses_a_booking_confirmed_again_where_another_holds_its_slot(agent):
    """The exclusion constraint (PostgreSQL) leaves released rows out: one confirmed again is checked
    as a new one is, so a move that raced past the look for a live booking there is refused."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no exclusion constraint: the look before the move holds (its one writer)")
    start = timezone.now() + timedelta(days=1)
    slot = {"resource": "room-1", "customer": "c", "start": start, "end": start + timedelta(hours=1)}
    released = Booking.objects.create(action=failed_action_for(agent, done_by_hand=True), status="released", **slot)
    Booking.objects.create(action=action_for(agent, "refund:ORD-2"), **{**slot, "start": start + timedelta(minutes=30)})

    with pytest.raises(IntegrityError, match="booking_no_overlap"), transaction.atomic():
        released.confirm()

    assert Booking.objects.get(pk=released.pk).status == "released"


def test_the_named_step_and_booking_moves_follow_their_tables(agent):
    step = TaskStep.objects.create(task=task_in(agent, "running"), position=0, name="call_refund_api")
    step.mark_failed({"code": "x"})
    step.mark_done({"ok": True})
    assert TaskStep.objects.values_list("status", "result", "error").get() == ("done", {"ok": True}, None)
    with pytest.raises(InvalidTransition):
        step.mark_failed({"code": "late"})
    start = timezone.now() + timedelta(days=1)
    booking = Booking.objects.create(action=action_for(agent), resource="room-1", customer="c", start=start,
                                     end=start + timedelta(hours=1))
    booking.confirm()
    with pytest.raises(InvalidTransition):
        booking.release()
    assert Booking.objects.get().status == "confirmed"


def product_modules():
    for package in ("ledger", "approvals", "dlq", "console", "sandbox", "demo"):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def test_there_is_one_move_and_only_a_row_moves_itself():
    """`_move` is the machine's own: others call its named transitions, never another row's `_move`."""
    definitions, others, own = [], [], set()
    for module, tree in product_modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "_move":
                definitions.append(module)
            elif isinstance(node, ast.Attribute) and node.attr == "_move":
                is_self = isinstance(node.value, ast.Name) and node.value.id == "self"
                (own.add(module) if is_self else others.append(f"{module}:{node.lineno}"))
    assert definitions == ["ledger/statemachine.py"]
    assert others == []
    assert {"ledger/models.py", "approvals/models.py", "dlq/models.py", "dlq/incidents.py"} <= own  # the scan sees them


def test_a_named_move_refuses_a_transition_its_table_does_not_have(agent):
    """Decided once, an entry, an incident or a review item refuses a second decision, and stays as it was."""
    entry = DeadLetter.objects.create(task=task_in(agent, "dead_lettered"), snapshot={}, attempts=3)
    Alert.objects.raise_for(entry)
    entry.resolve(actor="user:olga", note="refunded by hand")
    moves_or_refuses(entry, lambda: entry.discard(actor="user:alice", reason="late"), "discarded", False, audits=True)
    incident = Incident.objects.create(kind="orphan_effect", connector="stripe", subject="re_1")
    Alert.objects.raise_for(incident=incident, kind="incident", link=incident.get_absolute_url(), subject="found")
    incident.resolve(actor="user:olga", reason="clawed back")
    moves_or_refuses(incident, lambda: incident.resolve(actor="user:alice", reason="again"), "resolved", False,
                     audits=True)
    item = ReviewItem.objects.create(kind="approval", action=action_for(agent), deadline=timezone.now())
    item.close(reason="the action moved on")
    alice = get_user_model().objects.create_user("alice")
    moves_or_refuses(item, lambda: item.approve(user=alice, reason="late"), "approved", False, audits=True)


def test_only_an_item_sent_back_to_verify_opens_again(agent):
    for kind in ("held", "unknown_outcome"):  # resolved otherwise (marked, released): it stays resolved
        item = ReviewItem.objects.create(kind=kind, action=action_for(agent, f"refund:{kind}"), status="resolved",
                                         deadline=timezone.now() + timedelta(hours=4))
        AuditEvent.objects.record(actor="user:tests", verb="mark_failed", obj=item)
        with pytest.raises(InvalidTransition, match="only an unknown outcome sent back to verify"):
            item.reopen(reason="again", deadline=timezone.now())
