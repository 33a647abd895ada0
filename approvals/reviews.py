"""Review items follow their action: opened when it needs a person, closed when it no longer does."""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from ledger.models import PERSON_STATUSES, ActionStatus, AuditEvent

from .intake import limit_for, verdict_for_action
from .models import ReviewItem, ReviewKind, ReviewStatus

KIND_FOR_STATUS = {
    ActionStatus.AWAITING_APPROVAL: ReviewKind.APPROVAL,
    ActionStatus.HELD: ReviewKind.HELD,
    ActionStatus.NEEDS_REVIEW: ReviewKind.UNKNOWN_OUTCOME,
}
DEFAULT_DEADLINE_HOURS = 4


def review_follow_move(action, previous, actor):
    """After every move of an action: an item opens when it comes to need a person, and
    closes when it no longer does."""
    if action.status in PERSON_STATUSES or previous in PERSON_STATUSES:
        review_follow_action(action)


def review_follow_action(action, why=""):
    """In the action's transaction: nothing waits for a person without an item and a deadline."""
    item = ReviewItem.objects.select_for_update().filter(action=action, status=ReviewStatus.OPEN).first()
    kind = KIND_FOR_STATUS.get(action.status)
    if item is not None and item.kind != kind:
        item.close(reason=f"the action is now {action.status}")
        item = None
    if item is not None and why and item.why != why:  # still waiting, for another reason now
        item.why = why
        item.save(update_fields=["why"])
    if kind is None or item is not None:
        return item
    limit = limit_for(action.action_type, action.currency)
    verdict = verdict_for_action(action) if kind == ReviewKind.APPROVAL else None
    hours = limit.review_deadline_hours if limit else DEFAULT_DEADLINE_HOURS
    with transaction.atomic():
        item = ReviewItem.objects.create(
            kind=kind, action=action, deadline=timezone.now() + timedelta(hours=hours),
            approvals_needed=max(verdict.approvals_needed, 1) if verdict else 1,
            why=why or (verdict.reason if verdict else "") or _why(action),
            limit_snapshot=limit.snapshot() if limit else None,
        )
        AuditEvent.objects.record(actor="system:reviews", verb="review_opened", obj=item,
                                  after={"kind": kind, "deadline": item.deadline.isoformat()}, reason=item.why)
    return item


def _why(action):
    if action.status == ActionStatus.HELD:
        return "another action is in flight for the same target or customer"
    if action.evidence:
        return f"outcome unproven after {action.attempts} attempt(s)"
    return ""
