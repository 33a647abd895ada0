"""Review items follow their action: opened when it needs a person, closed when it no longer does."""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from ledger import clock
from ledger.models import PERSON_STATUSES, Action, ActionStatus, AuditEvent

from .intake import limit_for, verdict_for_action
from .models import ReviewItem, ReviewKind, ReviewStatus

KIND_FOR_STATUS = {
    ActionStatus.AWAITING_APPROVAL: ReviewKind.APPROVAL,
    ActionStatus.HELD: ReviewKind.HELD,
    ActionStatus.NEEDS_REVIEW: ReviewKind.UNKNOWN_OUTCOME,
}
DEFAULT_DEADLINE_HOURS = 4


def review_follow_move(action, previous, actor, reason):
    """After every move of an action, its recording among them (`previous` None): an item
    opens when it comes to need a person, and closes when it no longer does. Its why is the
    reason the action was recorded waiting, kept held, sent back for approval or left
    unproven; a hold, and a release out of one, say why the action moved (another was in
    flight, a person let it go), not why it waits: their item says its kind's own why."""
    if action.status in PERSON_STATUSES or previous in PERSON_STATUSES:
        moved_by_hold = previous not in (None, action.status) and ActionStatus.HELD in (previous, action.status)
        if previous is None and action.supersedes_id:
            # A version is made waiting for its editor's approval (ledger.versions): its approval
            # item opens first, whatever the database made of it. Held as it was made, the hold
            # closes that item as it closes any (below), and the editor's first of two approvals,
            # recorded on it, stands when a release sends the version back to wait (decision 23).
            _review_follow_action(action, reason, kind=ReviewKind.APPROVAL)
        _review_follow_action(action, "" if moved_by_hold else reason)


def _review_follow_action(action, why, kind=None):
    """In the action's transaction: nothing waits for a person without an item and a deadline
    (of `kind`: that of the action's status unless given).

    The open item is read without a lock of its own: whatever moves an item holds its
    action's lock first (this runs under it), and the item's own move locks it."""
    item = ReviewItem.objects.filter(action=action, status=ReviewStatus.OPEN).first()
    kind = kind or KIND_FOR_STATUS.get(action.status)
    if item is not None and item.kind != kind:
        item.close(reason=f"the action is now {action.status}")
        item = None
    if item is not None and why and item.why != why:  # still waiting, for another reason now
        item.why = why
        item.save(update_fields=["why"])
    if kind is None or item is not None:
        return item
    limit = limit_for(action.action_type, action.currency)
    hours = limit.review_deadline_hours if limit else DEFAULT_DEADLINE_HOURS
    verified = _sent_back_to_verify(action) if kind == ReviewKind.UNKNOWN_OUTCOME else None
    if verified is not None:
        return verified.reopen(reason=why or _why(action), deadline=timezone.now() + timedelta(hours=hours))
    expires = limit.approval_expires_after_hours if limit and kind == ReviewKind.APPROVAL else None
    # The window is closed on the database's clock (decisions, the sweeper): opened on it too.
    expires_at = clock.now() + timedelta(hours=expires) if expires else None
    approved = _approved_before_a_hold(action) if kind == ReviewKind.APPROVAL else None
    if approved is not None:
        return approved.reopen(reason="released after a hold: the approval given before it stands",
                               deadline=timezone.now() + timedelta(hours=hours), expires_at=expires_at)
    verdict = verdict_for_action(action) if kind == ReviewKind.APPROVAL else None
    now = timezone.now()
    with transaction.atomic():
        item = ReviewItem.objects.create(
            kind=kind, action=action, created_at=now, deadline=now + timedelta(hours=hours), expires_at=expires_at,
            approvals_needed=max(verdict.approvals_needed, 1) if verdict else 1,
            why=why or (verdict.reason if verdict else "") or _why(action),
            limit_snapshot=limit.snapshot() if limit else None,
        )
        AuditEvent.objects.record(actor="system:reviews", verb="review_opened", obj=item, reason=item.why,
                                  after={"kind": kind, "deadline": item.deadline.isoformat(),
                                         "expires_at": item.expires_at and item.expires_at.isoformat()})
    return item


def _sent_back_to_verify(action):
    """The action's last item, if a person sent it back to verify (it waits again, the same item)."""
    last = ReviewItem.objects.select_for_update().filter(action=action).order_by("-id").first()
    return last if last is not None and last.sent_back_to_verify else None


def _approved_before_a_hold(action):
    """The action's last approval item, if a hold closed it after a first of two approvals, all given
    on the params it waits with again (decision 23): it waits on that item again, and the approval
    stands (a second approval from the same person stays refused). Approvals of other params are
    none of these: a new item asks for all of them. Nor is an item closed with all the approvals it
    asked (a version's editor's, held as it was made: approvals.decisions.review_edit): they let the
    action go, and what waits for approval again now (a failure for good retried) asks anew."""
    last = ReviewItem.objects.select_for_update().filter(action=action, kind=ReviewKind.APPROVAL).order_by("-id").first()
    if last is None or last.status != ReviewStatus.CLOSED:
        return None
    prints = [approval.fingerprint for approval in last.approvals.all()]
    return last if set(prints) == {action.params_fingerprint()} and len(prints) < last.approvals_needed else None


def approval_expire_due(now=None):
    """A sweeper step: approvals nobody decided before they expired end `expired`, item and
    action, as the system's doing (never a person's rejection); the action's error says
    `approval_expired`. Locks the action first, then the item, as a person's decision does,
    and looks again under them: a decision that won meanwhile stands. Due on the database's clock,
    as a decision is refused by it (approvals.decisions)."""
    now = now or clock.now()
    expired = 0
    # Only items whose action still waits: a hundred that would be skipped (decided meanwhile,
    # or left open by a bug) must not stand in front of every pass and keep the rest waiting.
    due = ReviewItem.objects.filter(kind=ReviewKind.APPROVAL, status=ReviewStatus.OPEN, expires_at__lte=now,
                                    action__status=ActionStatus.AWAITING_APPROVAL)
    for item_id, action_id in due.order_by("expires_at").values_list("pk", "action_id")[:100]:
        with transaction.atomic():
            action = Action.objects.select_for_update(skip_locked=True).filter(
                pk=action_id, status=ActionStatus.AWAITING_APPROVAL).first()
            if action is None:
                continue  # decided, or being decided, meanwhile
            item = ReviewItem.objects.select_for_update().filter(pk=item_id, status=ReviewStatus.OPEN).first()
            if item is None:
                continue
            hours = round((item.expires_at - item.created_at).total_seconds() / 3600)
            reason = f"nobody approved or rejected it within {hours} h (the limit's approval window)"
            item.expire(reason=reason, locked=True)
            action.expire(reason=reason, locked=True)
            expired += 1
    return expired


def _why(action):
    if action.status == ActionStatus.HELD:
        return "another action is in flight for the same target or customer"
    if action.evidence:
        return f"outcome unproven after {action.attempts} attempt(s)"
    return ""
