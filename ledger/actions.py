"""Recording intent: the ledger row for an operation key, written before anything is called.

`action_request` is the intake of the agents' API and of workflow steps alike.
"""

import hashlib
import json
import zlib
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from .compiled import Compiled, insert
from .models import IN_FLIGHT_STATUSES, Action, ActionStatus, ActionType, AuditEvent, Booking

S = ActionStatus


class KeyReused(Exception):
    """The key (an action's operation key, a task's id) already names a different request."""

    def __init__(self, existing):
        super().__init__(str(existing))
        self.existing = existing


class SlotTaken(Exception):
    """A booking overlaps a pending or confirmed booking of the same resource."""


def fingerprint(kind, target, params):
    canonical = json.dumps([kind, target, params], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _replay(action, print_, customer):
    # The customer is outside the fingerprint (only a booking's is part of what is asked), but
    # it decides what is in flight and the customer's daily total: another one is another request.
    if action.fingerprint != print_ or action.customer != customer:
        raise KeyReused(action)
    return action, False


def _lock_subjects(*subjects):
    """Serialise requests about the same order, recipient or customer (PostgreSQL).

    Without it two requests for one order, arriving together, would each see the other
    not yet in flight and both run. Locks are taken in a fixed order (PostgreSQL evaluates
    a select list left to right) so two requests never wait on each other's second lock.
    SQLite's IMMEDIATE transactions already serialise.
    """
    if connection.vendor != "postgresql":
        return
    keys = sorted({zlib.crc32(s.encode()) - 2**31 for s in subjects if s})
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(["pg_advisory_xact_lock(1, %s)"] * len(keys)), keys)


def _same_subject(target, customer):
    return Q(target=target) | (Q(customer=customer) if customer else Q(pk__in=[]))


def _in_flight_locked(target, customer):
    """Take the target's and customer's locks; return the actions in flight on either."""
    _lock_subjects(f"target:{target}", customer and f"customer:{customer}")
    return Action.objects.filter(_same_subject(target, customer), status__in=IN_FLIGHT_STATUSES)


def _key_or_in_flight_query(key, target, customer=None):
    # One index lookup per branch, whatever the statistics say: as a single OR, a plan made
    # while the table was small (a seq scan) stayed prepared while the table grew.
    # (Each branch unordered: SQLite refuses an ORDER BY inside a compound statement.)
    branches = [Action.objects.filter(target=target, status__in=IN_FLIGHT_STATUSES).order_by()]
    if customer is not None:
        branches.append(Action.objects.filter(customer=customer, status__in=IN_FLIGHT_STATUSES).order_by())
    return Action.objects.filter(operation_key=key).order_by().union(*branches, all=True).order_by("id")


# The intake's one read under its locks: the key's own row, if a twin committed it, and
# what is in flight on the same target or customer (compiled once: see compiled.py). It
# locks no row: a replay must not hold the row a worker is about to claim (claims skip
# locked rows); siblings, when there are any, are locked next.
_key_or_in_flight = Compiled(_key_or_in_flight_query)
_by_key = Compiled(lambda key: Action.objects.filter(operation_key=key).order_by())


def action_by_key(operation_key):
    return _by_key.first(operation_key)


_by_pk = Compiled(lambda pk: Action.objects.filter(pk=pk), int)


def action_by_pk(pk):
    return _by_pk.first(pk)


def action_request(*, agent, operation_key, action_type, target, params, customer="", decision_id="", task=None):
    """Return `(action, created)`: the row for this key, created now or as it stands.

    1. Under the subjects' locks, read the key's row and what is in flight on the same
       target or customer. A key that exists answers at once: same fingerprint -> the
       stored action; another -> KeyReused. Nothing is executed again either way.
    2. Otherwise ask the limits; insert `queued`, `awaiting_approval` or `held`; hold the
       not-yet-started siblings; audit; ring the executor after commit. The unique key is
       the final arbiter. (The API answers most replays before this, see api/views.py.)
    """
    from approvals.intake import verdict_for_request
    from approvals.reviews import review_follow_action

    from .jobs import ring_after_commit

    # A booking's customer is part of what is asked (the provider books for them).
    print_ = fingerprint(action_type, target, {**params, "customer": customer} if action_type == "create_booking" else params)
    # Columns of their own for the limits and the queues, always read from the params.
    amount = None if params.get("amount") in (None, "") else Decimal(str(params["amount"]))
    currency = params.get("currency", "")
    try:
        with transaction.atomic():
            _lock_subjects(f"target:{target}", customer and f"customer:{customer}")
            found = {a.pk: a for a in (_key_or_in_flight.all(operation_key, target, customer) if customer
                                        else _key_or_in_flight.all(operation_key, target))}
            existing = next((a for a in found.values() if a.operation_key == operation_key), None)
            if existing:
                return _replay(existing, print_, customer)
            # Locked, so that no worker claims one between this look and holding it.
            siblings = list(Action.objects.select_for_update().filter(
                pk__in=list(found), status__in=IN_FLIGHT_STATUSES).order_by("id")) if found else []
            verdict = verdict_for_request(action_type=action_type, amount=amount, currency=currency, customer=customer)
            if siblings:
                status = S.HELD
                reason = "another action is in flight for the same target or customer: " + ", ".join(
                    s.operation_key for s in siblings[:5]
                )
            elif verdict.approvals_needed:
                status, reason = S.AWAITING_APPROVAL, verdict.reason
            else:
                status, reason = S.QUEUED, ""
            action = insert(Action(
                operation_key=operation_key, fingerprint=print_, action_type=action_type, target=target,
                customer=customer, params=params, amount=amount, currency=currency, decision_id=decision_id,
                task=task, agent=agent, status=status,
                next_attempt_at=timezone.now() if status == S.QUEUED else None,
            ))
            if action_type == ActionType.CREATE_BOOKING:
                _book(action)
            AuditEvent.objects.record(actor=agent, verb="requested", obj=action, after={"status": status}, reason=reason)
            if status != S.QUEUED:
                review_follow_action(action, why=reason)
            for sibling in siblings:
                if sibling.status in (S.QUEUED, S.AWAITING_APPROVAL):  # not started: held with it
                    sibling.hold(actor="system:intake", reason=f"{operation_key} arrived for the same target or customer")
            if status == S.QUEUED and task is None:  # a task's runner executes its own actions
                ring_after_commit("actions")
    except IntegrityError:
        # The same key, inserted meanwhile by a request about another subject.
        existing = action_by_key(operation_key)
        if existing is None:
            raise
        return _replay(existing, print_, customer)
    return action, True


def action_retry(action, *, actor, reason):
    """A new attempt of a failed (retryable) action, under the same rule as a new request:
    while another action on its target or customer is in flight, it is held for a person."""
    with transaction.atomic():
        busy = _in_flight_locked(action.target, action.customer).exclude(pk=action.pk).first()
        if busy is not None:
            return action.hold(actor=actor, reason=f"{busy.operation_key} is in flight for the same target or customer")
        return action.requeue(actor=actor, reason=reason)


def _book(action):
    """Reserve the slot with the action. The check gives the friendly answer; the exclusion
    constraint (PostgreSQL) is what holds when two requests race past it."""
    start, end = (datetime.fromisoformat(action.params[k]) for k in ("start", "end"))
    live = [Booking.Status.PENDING, Booking.Status.CONFIRMED]
    clash = Booking.objects.filter(resource=action.target, status__in=live, start__lt=end, end__gt=start).first()
    if clash is not None:
        raise SlotTaken(f"{action.target} is booked from {clash.start:%Y-%m-%d %H:%M} to {clash.end:%H:%M} UTC")
    try:
        with transaction.atomic():
            Booking.objects.create(action=action, resource=action.target, customer=action.customer, start=start, end=end)
    except IntegrityError:
        raise SlotTaken(f"{action.target} was booked for that time meanwhile") from None
