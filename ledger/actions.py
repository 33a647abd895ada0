"""Recording intent: the ledger row for an operation key, written before anything is called.

`action_request` is the intake of the agents' API and of workflow steps alike.
"""

import logging
from datetime import datetime

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from . import clock, hooks
from .compiled import Compiled, insert, update
from .jobs import ring_after_commit
from .locks import NO_CUSTOMER_TOTAL, take_turns
from .models import (BOOKING_HELD, IN_FLIGHT_STATUSES, SETTLED, Action, ActionStatus, ActionType, AuditEvent,  # noqa: F401
                     Booking, InvalidTransition, fingerprint, money_in_params, request_fingerprint)  # (fingerprint: re-exported)
from .recipients import customer_spelled_before, customer_spelling, email_recipient
from .versions import edited_from
from .retention import archived_key_expired, key_archived, refused_as_archived

S = ActionStatus
logger = logging.getLogger("surety.actions")


class KeyReused(Exception):
    """The key (an action's operation key, a task's id) already names a different request."""

    def __init__(self, existing):
        super().__init__(str(existing))
        self.existing = existing


class DecisionTaken(Exception):
    """Another agent's action is recorded for the same decision's effect (its refund of the
    order, its message to the recipient): nothing is recorded, nothing of it is shown."""

    def __init__(self, existing):
        super().__init__(str(existing))
        self.existing = existing


class SlotTaken(Exception):
    """A booking overlaps a pending or confirmed booking of the same resource (`holder`: that
    booking's action id, where the intake's look found it)."""

    def __init__(self, message, holder=None):
        super().__init__(message)
        self.holder = holder


class Refused(Exception):
    """The limits refuse the request at intake (their verdict's `refused` code; the message
    says why): nothing is recorded."""

    def __init__(self, verdict):
        super().__init__(verdict.reason)
        self.code = verdict.refused


def _replay(action, print_, customer, decision_id):
    # The customer is outside the fingerprint (only a booking's is part of what is asked), but
    # it decides what is in flight and the customer's daily total: another one is another request
    # (one recorded before customers were kept in one spelling is compared in that spelling).
    # The decision is outside it too, but a key names its decision's effect (docs/contract.md):
    # under another decision, it is another request, whose effect the first one's is not.
    if (action.fingerprint != print_ or customer_spelling(action.customer) != customer
            or action.decision_id != decision_id):
        raise KeyReused(action)
    return action, False


def _as_recorded(existing, print_, action_type, target, params, customer):
    """The print `existing` is compared with: that of the request, or for one recorded before its
    subjects were stored in one spelling (an e-mail recipient: recipients.email_recipient;
    a customer: recipients.customer_spelling), of the request in the spelling recorded then
    (docs/contract.md: still a replay)."""
    if (action_type == ActionType.SEND_MESSAGE and params.get("channel") == "email"
            and existing.target != target and email_recipient(existing.target) == target):
        return request_fingerprint(action_type, existing.target, params, customer)
    if customer_spelled_before(existing.customer, customer):
        return request_fingerprint(action_type, target, params, existing.customer)
    return print_


def _lock_subjects(target, customer):
    """Serialise work on the same order, recipient or customer (PostgreSQL), with the locks
    an insert into the ledger takes (migration 0014: same keys, same order). SQLite's
    IMMEDIATE transactions already serialise."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT ledger_lock_subjects(%s, %s)", [target, customer])


def action_lock_subjects(action):
    """Its target's and customer's locks, as the intake takes them: for a transaction that takes
    the rows after (a person's release, approvals.decisions), in the intake's order."""
    _lock_subjects(action.target, action.customer)


def _try_lock_subjects(target, customer):
    """The same locks, only if they are free now (ledger.dbrules.TRY_LOCK_SUBJECTS): for a
    transaction that holds rows an intake may be waiting for. SQLite serialises writers."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT ledger_try_lock_subjects(%s, %s)", [target, customer])
        return cursor.fetchone()[0]


def _subjects(action):
    return [Q(target=action.target)] + ([Q(customer=action.customer)] if action.customer else [])


def in_flight_near(action, *, locked=False):
    """The other actions in flight (held ones too) on its target or customer, oldest first;
    `locked`: read FOR UPDATE. One index lookup per subject: an OR, planned once while the
    table was small, could stay a sequential scan."""
    found = {}
    for subject in _subjects(action):
        in_flight = Action.objects.filter(subject, status__in=IN_FLIGHT_STATUSES).exclude(pk=action.pk)
        found.update((a.pk, a) for a in (in_flight.select_for_update() if locked else in_flight))
    return sorted(found.values(), key=lambda a: a.pk)


# A replay's read (compiled once, see compiled.py): SELECT ... FROM ledger_action WHERE operation_key = %s
_by_key = Compiled(lambda key: Action.objects.filter(operation_key=key).order_by(), name="ledger.actions: action by key")


def action_by_key(operation_key):
    return _by_key.first(operation_key)


# ... WHERE id = %s: a replay whose id the authenticating statement found
_by_pk = Compiled(lambda pk: Action.objects.filter(pk=pk), int, name="ledger.actions: action by id")


def action_by_pk(pk):
    return _by_pk.first(pk)


def action_request(*, agent, operation_key, action_type, target, params, customer="", decision_id="", task=None,
                   limits_version=None, shadow=False):
    """Return `(action, created)`: the row for this key, created now or as it stands.

    Under a shadow grant (`shadow`, see ledger.grants) the action is recorded `shadow` and
    nothing else happens: no limits, no hold, no slot, no executor.

    1. Ask the limits (`limits_version`: as the request read it, see approvals/intake.py):
       `queued`, or `awaiting_approval` above them; a verdict that refuses raises Refused
       before anything is written.
    2. Insert. The database takes the target's and customer's locks and stores the row
       `held` if another action is in flight on either (migration 0014); the unique key
       turns a key that exists into an IntegrityError: same fingerprint -> the stored
       action; another -> KeyReused. Nothing is executed again either way. A message
       already recorded for the same recipient, type and decision under another key is
       answered with that first message's row (its own operation key tells them apart).
    3. Hold the not-yet-started siblings of a held action; audit; ring the executor after
       commit. (The API answers most replays before this, see api/views.py.)

    A customer's daily total is summed under the target's and customer's locks (taken
    early, only for a limit that has one), so that an action it misses cannot have been
    recorded and settled before this insert looks for actions in flight.
    """
    print_ = request_fingerprint(action_type, target, params, customer)
    # Columns of their own for the limits and the queues, always read from the params.
    amount, currency = money_in_params(params)
    for last in (False, True):
        try:
            with transaction.atomic():
                verdict = None if shadow else hooks.policy().verdict_for_request(
                    action_type=action_type, amount=amount, currency=currency, customer=customer,
                    limits_version=limits_version, lock_subjects=lambda: _lock_subjects(target, customer))
                if verdict is not None and verdict.refused:
                    raise Refused(verdict)
                status = S.SHADOW if shadow else S.AWAITING_APPROVAL if verdict.approvals_needed else S.QUEUED
                action = insert(Action(
                    operation_key=operation_key, fingerprint=print_, action_type=action_type, target=target,
                    customer=customer, params=params, amount=amount, currency=currency, decision_id=decision_id,
                    task=task, agent=agent, status=status,
                    next_attempt_at=clock.now() if status == S.QUEUED else None,
                ), stored=("status", "next_attempt_at"))
                siblings = in_flight_near(action, locked=True) if action.status == S.HELD else []
                if siblings:
                    reason = "another action is in flight for the same target or customer: " + ", ".join(
                        _named(s, action) for s in siblings[:5]
                    )
                elif action.status == S.HELD:  # a worker settled the one the insert saw, meanwhile
                    reason = "another action was in flight for the same target or customer when it was recorded"
                elif shadow:
                    reason = "requested under a shadow grant: recorded, never executed"
                else:
                    reason = verdict.reason if action.status == S.AWAITING_APPROVAL else ""
                if action_type == ActionType.CREATE_BOOKING and not shadow:
                    _book(action)
                AuditEvent.objects.record(actor=agent, verb="requested", obj=action, after={"status": action.status},
                                          reason=reason)
                # A new action that waits for a person is a move from no status; a queued one's
                # only follower is the executor, rung below (a task's is run by its own runner).
                if action.status not in (S.QUEUED, S.SHADOW):
                    hooks.moved(action, None, agent, reason)
                for sibling in siblings:
                    if sibling.status in (S.QUEUED, S.AWAITING_APPROVAL):  # not started: held with it
                        sibling.hold(actor="system:intake",
                                     reason=f"{_named(action, sibling)} arrived for the same target or customer")
                if action.status == S.HELD and not siblings:
                    # What held it at the insert settled before the look: its settle, which could not
                    # see this row yet, released nothing, and nothing holds it now.
                    action.release(actor="system:intake", reason="what held it as it was recorded has settled",
                                   needs_approval=bool(verdict and verdict.approvals_needed), locked=True)
                if action.status == S.QUEUED and task is None:  # a task's runner executes its own actions
                    ring_after_commit("actions")
        except Refused:
            # The limits are asked before the insert finds the key taken: they refuse only what is
            # not recorded yet. One recorded before they changed, retried, is answered as recorded.
            if key_archived(operation_key):
                raise archived_key_expired(operation_key) from None
            recorded = _recorded(agent, operation_key, print_, action_type, target, params, customer, decision_id)
            if recorded is None:
                raise
            return recorded
        except IntegrityError as exc:
            if refused_as_archived(exc):  # its action was archived past the key's lifetime
                raise archived_key_expired(operation_key) from None
            # The same key, inserted meanwhile (or before: the API's lookup missed it).
            recorded = _recorded(agent, operation_key, print_, action_type, target, params, customer, decision_id)
            if recorded is not None:
                return recorded
            if last:
                raise
            # What refused the insert was gone when _recorded looked: a booking of the decision that
            # let go of its slot meanwhile (a person rejected or cancelled it, it failed for good), so
            # that the once-per-decision rule no longer holds it. Nothing holds the decision now: the
            # request is recorded as new, once more only (what refuses it for good refuses it again).
            continue
        except SlotTaken as taken:
            # The booking holding the slot is this agent's, for the same customer and decision,
            # recorded under another key (a client's older key form named the times): the same booking.
            # Its customer is compared in the ledger's spelling (one recorded before may hold another).
            existing = Action.objects.filter(pk=taken.holder, agent=agent, decision_id=decision_id,
                                             ).first() if taken.holder and decision_id else None
            if existing is None or customer_spelling(existing.customer) != customer:
                raise
            return _replay(existing, _as_recorded(existing, print_, action_type, target, params, customer), customer,
                           decision_id)
        return action, True


def _recorded(agent, operation_key, print_, action_type, target, params, customer, decision_id):
    """`(action, False)` for a request the ledger holds already, under its key or, for the same
    decision's effect, another key of this agent's; KeyReused or DecisionTaken when what it holds
    is another request or another agent's; None when it holds nothing of it."""
    existing = action_by_key(operation_key)
    if existing is None:
        # The same effect for the same decision, under another key: the first one stands.
        existing = same_decision(action_type, target, decision_id, params, customer)
        if existing is None:
            return None
        if existing.agent_id != agent.pk:
            raise DecisionTaken(existing)
        existing = _as_asked(existing, print_, action_type, target, params, customer)
    return _replay(existing, _as_recorded(existing, print_, action_type, target, params, customer), customer,
                   decision_id)


def _as_asked(existing, print_, action_type, target, params, customer):
    """The decision's action that this request asked for: `existing`, or, when a person edited
    that down since, the original it was edited from (the agent's request, superseded), so that a
    retry under another key is answered as one under the original's (`existing` when neither)."""
    older = [version.pk for version in edited_from(existing)[1:]]
    for version in Action.objects.filter(pk__in=older).order_by("-pk") if older else ():
        if customer_spelling(version.customer) == customer and version.fingerprint == _as_recorded(
                version, print_, action_type, target, params, customer):
            return version
    return existing


def same_decision(action_type, target, decision_id, params, customer):
    """The action already recorded for this decision's effect, whatever its key: a refund of
    the order, a message of this type to the recipient, a booking of the resource for the
    customer (the ledger's unique rules on them). Neither a superseded row (its version stands
    for it) nor a shadow one (recorded, never executed: it holds no effect) is that action."""
    if not decision_id or action_type not in SAME_DECISION:
        return None
    return Action.objects.filter(SAME_DECISION[action_type](params, customer), action_type=action_type, target=target,
                                 decision_id=decision_id).exclude(status__in=[S.SUPERSEDED, S.SHADOW]).first()


# What besides the target and decision makes an effect the same one, per action type that has
# the rule (models.Action's constraints action_refund_once_per_decision,
# action_message_once_per_decision and action_booking_once_per_decision).
SAME_DECISION = {
    ActionType.REFUND: lambda params, customer: Q(),
    ActionType.SEND_MESSAGE: lambda params, customer: Q(params__message_type=params.get("message_type")),
    ActionType.CREATE_BOOKING: lambda params, customer: Q(customer=customer) & BOOKING_HELD,
}


def action_retry(action, *, actor, reason, ask_limits=False):
    """A new attempt of a failed (retryable) action, under the same rule as a new request:
    while another action on its target or customer is in flight, it is held for a person. Held
    ones newer than it apart: its failure kept what it held, and it goes on before them, as its
    first attempt did; one held before it was requested keeps its turn
    (ledger.dbrules.REQUEUE_SAME_SUBJECT). `ask_limits`: the limits are asked again, as of a new
    request, and a person approves it first if they ask for one."""
    with transaction.atomic():
        _lock_subjects(action.target, action.customer)
        if ask_limits and not action.customer:
            # No customer's lock among its subjects: the requests naming none sum their total in
            # turn (approvals.intake), and this one, in no total while it failed for good, too.
            # (A held or queued action's release needs no turn: it is in every total already.)
            take_turns(NO_CUSTOMER_TOTAL)
        busy = [other for other in in_flight_near(action, locked=True)
                if other.status != S.HELD or other.pk < action.pk]
        if busy:  # asked of the limits again, it is released as a new request is: without its old approval
            return action.hold(actor=actor, approval_stands=not ask_limits,
                               reason=f"{_named(busy[0], action)} is in flight for the same target or customer")
        if ask_limits:
            verdict = hooks.policy().verdict_for_action(action)
            if verdict.approvals_needed:
                return action.ask_approval(actor=actor, reason=f"retried: {verdict.reason}")
        return action.requeue(actor=actor, reason=reason)


def action_retry_by_person(action, *, actor, reason):
    """A person retries an action whose failure was marked permanent (a provider's refusal),
    having fixed its cause: the error is marked retryable on their word — audited as
    `retry_allowed`, with the error as it was, who and why — then `action_retry` decides as
    for any retry, the limits asked again: failed for good, it left the customer's daily total
    (approvals.intake.IN_DAILY_TOTAL), and refunds asked meanwhile passed the total without it.
    The status table stays as it is: only the permanence is lifted. One done by hand
    (`action_done_by_hand`) is refused: it failed for good because a person did it; so is one
    given up (`action_give_up`): a person decided nobody retries it, and its agent read so."""
    if isinstance(actor, str):
        raise ValueError("only a person may retry a failure marked permanent")
    if not reason.strip():
        raise ValueError("a reason is required to retry a failure marked permanent")
    with transaction.atomic():
        row = Action.objects.select_for_update().get(pk=action.pk)
        if row.status != S.FAILED:
            raise InvalidTransition(f"{row}: it is {row.status}, not failed")
        if row.is_done_by_hand:  # its permanence is a person's own work, which a retry would do again
            raise InvalidTransition(f"{row}: a person did it by hand (its dead letter was resolved): a retry "
                                    "would do it again; if it must be done once more, ask for it under a new decision")
        if given_up(row):  # its permanence is a person's decision, which its agent was told of
            raise InvalidTransition(f"{row}: a person gave it up (its dead letter was discarded): nobody retries it; "
                                    "if it is still wanted, ask for it under a new decision")
        if row.action_type == ActionType.CREATE_BOOKING and not row.is_retryable_failure:
            raise InvalidTransition(f"{row}: its slot was given up when it failed; request a new booking")
        permanent = not row.is_retryable_failure
        if permanent:
            _error_retryable(row, True, actor=actor, verb="retry_allowed", reason=reason)
        return action_retry(row, actor=actor, reason=reason, ask_limits=permanent)


def _error_retryable(row, retryable, *, actor, verb, reason, **marks):
    """A person's word on whether the locked, failed `row` may be tried again, written on its error
    (with `marks`, what else it says) and audited as `verb`."""
    before = {"status": row.status, "error": row.error}
    row.error = {**row.error, "retryable": retryable, **marks}
    row.updated_at = timezone.now()
    update(row, ["error", "updated_at"])
    AuditEvent.objects.record(actor=actor, verb=verb, obj=row, before=before,
                              after={"status": row.status, "error": row.error}, reason=reason)


def given_up(action):
    """Whether a person gave the failed action up (`action_give_up`): its error says so."""
    return action.status == S.FAILED and bool((action.error or {}).get("given_up"))


def action_give_up(action, *, actor, reason):
    """A failed action a person gave up on (its dead letter discarded, or its task's:
    ledger.tasks.task_actions_let_go) is failed for good and says so: its error says no retry will
    come and that a person gave it up (`given_up`, audited with their reason), whatever it said
    before. A failure already for good (a declined refund) read the same before and after: its
    agent could not tell whether a person might still retry it, so it is marked too. One that
    could have been retried kept what it held for its retry: a booking lets go of its slot, so
    that its decision may be asked again, as after any failure for good (BOOKING_HELD), and what it
    held is looked at again. One done by hand is a person's own work, not given up: left as it is."""
    with transaction.atomic():
        row = Action.objects.select_for_update().get(pk=action.pk)
        if row.status != S.FAILED or row.is_done_by_hand or given_up(row):
            return row
        kept_for_its_retry = row.is_retryable_failure
        _error_retryable(row, False, actor=actor, verb="given_up", reason=reason, given_up=True)
        if kept_for_its_retry:
            booking_follow_action(row, S.FAILED, actor, reason)
            _release_what_it_held(row)
        return row


def action_done_by_hand(action, *, actor, reason):
    """A failed action a person did by hand (its dead letter resolved, or its task's:
    ledger.tasks.task_actions_let_go) is failed for good of its own kind: its error says no retry
    will come and that it was done by hand (`done_by_hand`, audited with the person's note), so a
    retry, which would do it again, is refused (Action._refuse, `action_retry_by_person`). Unlike
    one given up, what it did stands: a booking keeps its slot, confirmed (booking_follow_action),
    and its decision (BOOKING_HELD), and a refund stays in its customer's daily total
    (approvals.intake.IN_DAILY_TOTAL). What it held is looked at again, as after any failure for
    good: kept held for its retry, each would wait for a person for good.

    A failure already for good is done by hand too (a declined refund the person paid by bank
    transfer, a declined booking they made by phone). A booking's let its slot and its decision go
    when it failed: done by hand, it takes both again (`_book_again`), or another booking of that
    time, or of the decision under another key, would be accepted beside the one the person made.
    If another booking took either since, the database refuses, and so is this (InvalidTransition,
    saying what holds it): nothing is written, and the person may give it up instead."""
    with transaction.atomic():
        row = Action.objects.select_for_update().get(pk=action.pk)
        if row.status != S.FAILED or row.is_done_by_hand or given_up(row):  # final either way (ledger.dbrules)
            return row
        let_go = row.action_type == ActionType.CREATE_BOOKING and not row.is_retryable_failure
        try:
            with transaction.atomic():
                # Marked, it holds its decision again (the once-per-decision constraint's BOOKING_HELD).
                _error_retryable(row, False, actor=actor, verb="done_by_hand", reason=reason, done_by_hand=True)
                if let_go:
                    _book_again(row)
        except (IntegrityError, SlotTaken) as taken:
            held = _held_since(row, taken)
            if held is None:  # no booking holds its decision: not that refusal
                raise
            raise InvalidTransition(
                f"{row} let its slot and its decision go when it failed, and another booking holds {held}: recorded "
                "as booked by hand, it would be booked twice. Discard the entry instead, saying what was done"
            ) from None
        booking_follow_action(row, S.FAILED, actor, reason)
        _release_what_it_held(row)
        return row


def _held_since(row, taken):
    """What holds the slot or the decision a booking failed for good let go, taken since (`taken`:
    the intake's SlotTaken, or the database's refusal of its decision), in words; None when no
    booking holds its decision (an IntegrityError of another kind)."""
    if isinstance(taken, SlotTaken):
        holder = Action.objects.filter(pk=taken.holder).first() if taken.holder else None
        return f"its slot ({taken}{f': {holder.operation_key}, {holder.status}' if holder else ''})"
    holder = same_decision(row.action_type, row.target, row.decision_id, row.params, row.customer)
    return holder and f"its decision {row.decision_id} ({holder.operation_key}, {holder.status})"


def _book_again(row):
    """The locked booking `row`, failed for good and now done by hand, takes its slot again as the
    intake takes one (`_book`: SlotTaken if another booking holds it now): the slot's row it let go
    is confirmed again (Booking.TRANSITIONS allows it once its action is done by hand), the same
    row, its history kept."""
    _take_slot(row, lambda start, end: Booking.objects.get(action=row).confirm())


def _book(action):
    """Reserve the slot with the action: its booking's row, pending until the action settles."""
    _take_slot(action, lambda start, end: Booking.objects.create(
        action=action, resource=action.target, customer=action.customer, start=start, end=end))


def _take_slot(action, take):
    """`take(start, end)` the slot the booking `action` asks for, once nothing live holds it. The
    check gives the friendly answer; the exclusion constraint (PostgreSQL) is what holds when two
    requests race past it."""
    start, end = (datetime.fromisoformat(action.params[k]) for k in ("start", "end"))
    live = [Booking.Status.PENDING, Booking.Status.CONFIRMED]
    clash = Booking.objects.filter(resource=action.target, status__in=live, start__lt=end, end__gt=start).first()
    if clash is not None:
        raise SlotTaken(f"{action.target} is booked from {clash.start:%Y-%m-%d %H:%M} to {clash.end:%H:%M} UTC",
                        holder=clash.action_id)
    try:
        with transaction.atomic():
            take(start, end)
    except IntegrityError:
        raise SlotTaken(f"{action.target} was booked for that time meanwhile") from None


def action_ring_when_due(action, previous, actor, reason):
    """After every move of an action: work that became runnable gets a drain after commit."""
    if action.status in (S.QUEUED, S.UNKNOWN) and action.next_attempt_at:
        ring_after_commit("actions", at=action.next_attempt_at)


def booking_follow_action(action, previous, actor, reason):
    """A booking's slot follows its action: kept while the booking may still happen (a
    retryable failure may be tried again), confirmed when it did (it succeeded, or a person
    booked it by hand), freed when it won't."""
    if action.action_type != ActionType.CREATE_BOOKING:
        return
    if action.status == S.SUCCEEDED:
        Booking.objects.get(action=action).confirm()
    elif action.is_done_by_hand:
        # Confirmed, not left pending: no retry or settle will ever move it, and the slot is taken
        # for good, as the person's booking takes it (one that had failed for good takes it again
        # first: action_done_by_hand).
        for booking in Booking.objects.filter(action=action, status=Booking.Status.PENDING):
            booking.confirm()
    elif action.status in (S.REJECTED, S.CANCELLED, S.EXPIRED) or (
            action.status == S.FAILED and not action.is_retryable_failure):
        Booking.objects.get(action=action).release()


# A settle whose own statement saw an action held on its subjects (decision 54) asks this, in one
# statement for both subjects: half the CPU of one per subject (decision 38; compiled once, see
# compiled.py).
# SELECT id FROM ledger_action WHERE (target = %s OR (customer = %s AND NOT customer = ''))
#   AND status = 'held' ORDER BY id
_held_on_subjects = Compiled(
    lambda target, customer: Action.objects.filter(Q(target=target) | Q(customer=customer) & ~Q(customer=""),
                                                   status=S.HELD).only("id").order_by("pk"),
    name="ledger.actions: held on a target or customer")


def held_release_when_settled(action, previous, actor, reason):
    """After every move of an action: once it settles, the actions it held are looked at
    again in the same transaction, oldest first. One that nothing else holds (no action in
    flight on its target or customer that is not itself held) is released (`action_release`):
    queued on its approval, or as its limit says; the next one is then held by it, with that reason.

    What a person decides stays theirs: a held action they reject or cancel lets go of
    nothing, and when one they released out of a held group settles, the rest of the group
    waits for their decision too (approvals.decisions.held_group_decide) — two requests for
    one order close together must not both run because one of them was let through. A failure
    that may still be retried keeps what it held: it may run again; once a person gives it up
    (`action_give_up`) or does it by hand (`action_done_by_hand`), what it held is looked at then.

    Whether anything else holds it is asked under its subjects' locks, as the intake asks: two
    settles at once, each releasing an action held on one customer, would otherwise each see
    the other's still held and let both run. This runs holding the settled row's lock, while
    the intake takes the subjects' locks first and the rows after: waiting here for either
    could deadlock with it. So the held row is taken with NOWAIT and its subjects' locks only
    if free; one that is busy is looked at again once this transaction has committed, its locks
    then taken as the intake takes them (`_look_again`)."""
    if action.status not in SETTLED or action.is_retryable_failure or previous == S.HELD:
        return
    if not action.held_nearby:  # the settle's own statement saw none held on its subjects
        return
    _release_what_it_held(action)


def _release_what_it_held(action):
    """The actions held on the settled `action`'s subjects (its row locked), looked at again
    oldest first (held_release_when_settled)."""
    held_ones = [a for a in _held_on_subjects.all(action.target, action.customer) if a.pk != action.pk]
    for held in held_ones:
        try:
            with transaction.atomic():
                held = Action.objects.select_for_update(nowait=True).get(pk=held.pk, status=S.HELD)
        except Action.DoesNotExist:
            continue  # moved on meanwhile
        except DatabaseError:
            busy = True
        else:
            busy = not _try_lock_subjects(held.target, held.customer)
        if busy:
            # Another transaction works on it or its subjects now: a settle releasing another
            # action held on them, or an intake. Once both have committed, it is looked at again.
            logger.info("%s or its target or customer is busy: looked at again after this commit", held.operation_key)
            transaction.on_commit(lambda held_pk=held.pk, settled_pk=action.pk: _look_again(held_pk, settled_pk),
                                  robust=True)  # a failure is logged; the held one then waits for a person
            continue
        _release_if_nothing_holds(held, action)


def _named(other, seen_by):
    """How a reason about `seen_by` names `other`: by its key when one agent asked for both, else
    by its id. The reason is in `seen_by`'s evidence record, which its agent reads, and another
    agent's keys (its orders and decisions) are not for it to read."""
    return other.operation_key if other.agent_id == seen_by.agent_id else f"action #{other.pk} (another agent's)"


def _look_again(held_pk, settled_pk):
    """After the settle's commit, a held action that was busy then: its subjects' locks first,
    waiting as the intake waits (no row is held now), then its row, and the same look."""
    with transaction.atomic():
        held = Action.objects.filter(pk=held_pk, status=S.HELD).first()
        if held is None:
            return
        _lock_subjects(held.target, held.customer)
        held = Action.objects.select_for_update().filter(pk=held_pk, status=S.HELD).first()
        if held is not None:
            _release_if_nothing_holds(held, Action.objects.get(pk=settled_pk))


def _release_if_nothing_holds(held, action):
    """`held` (locked, under its subjects' locks) after `action` settled: released if nothing in
    flight holds it and no person's release let `action` out of a held group; else kept held,
    with the reason."""
    holders = [a for subject in _subjects(held)
               for a in Action.objects.filter(subject, status__in=IN_FLIGHT_STATUSES).exclude(pk=held.pk)
               if a.status != S.HELD]
    from_a_group = AuditEvent.objects.history(action).filter(verb="released").exclude(
        actor__startswith="system:").exists()
    if holders or from_a_group:
        reason = (f"{_named(holders[0], held)} is in flight for the same target or customer" if holders else
                  f"{_named(action, held)}, released from this held group by a person, is {action.status}: "
                  "the rest wait for a person's decision")
        AuditEvent.objects.record(actor="system:intake", verb="still_held", obj=held, reason=reason)
        hooks.moved(held, S.HELD, "system:intake", reason)  # kept held, for a new reason
        return
    action_release(held, actor="system:intake",
                   reason=f"{_named(action, held)} is {action.status}: nothing else holds it")


def action_release(held, *, actor, reason, fingerprint=""):
    """Let the locked, held action go (a person's release, `fingerprint` as for Action.release, or
    the system's): `queued` if a person let its params as they are go (`Action.has_approval`),
    the limits not asked again: a hold changes its turn, not what was approved (asked again, an
    approval given before the hold was lost, and the refund could expire undecided); else as the
    limits say of its params now."""
    needs_approval = not held.has_approval() and bool(hooks.policy().verdict_for_action(held).approvals_needed)
    return held.release(actor=actor, reason=reason, fingerprint=fingerprint, needs_approval=needs_approval,
                        locked=True)
