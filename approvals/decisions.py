"""What a person decides on a review item. One decision wins; the loser is told who won.

Locks are taken action first, then item — the same order as an action's own moves (which
close items), so a decision racing a webhook never deadlocks.
"""

from django.db import IntegrityError, transaction
from django.db.models import Q

from ledger.audit import actor_label
from ledger.models import Action, AuditEvent
from ledger.statemachine import InvalidTransition

from .intake import verdict_for_action
from .models import Approval, ReviewItem, ReviewKind, ReviewStatus


class DecisionRefused(Exception):
    """The decision cannot be taken (already decided, four eyes, a missing reason)."""


class AlreadyDecided(DecisionRefused):
    pass


DECISIONS = {
    ReviewKind.APPROVAL: {"approve", "reject"},
    ReviewKind.HELD: {"release", "reject"},
    ReviewKind.UNKNOWN_OUTCOME: {"mark_succeeded", "mark_failed", "verify"},
}

REASON_REQUIRED = {"approve", "reject", "release", "mark_failed"}


def review_decide(item, *, user, decision, reason="", external_ref=""):
    """Take `decision` on `item` as `user`; returns the item as it stands afterwards."""
    reason = reason.strip()
    if decision not in DECISIONS[item.kind]:
        raise DecisionRefused(f"{decision} is not a decision for a {item.get_kind_display()}")
    # Every decision that changes what happens to money gives its reason; verifying again changes
    # nothing, and marking succeeded is backed by the provider's reference.
    if decision in REASON_REQUIRED and not reason:
        raise DecisionRefused(f"a reason is required to {decision.replace('_', ' ')}")
    if decision == "mark_succeeded" and not external_ref.strip():
        raise DecisionRefused("the provider's reference is required to mark it succeeded")
    with transaction.atomic():
        action = Action.objects.select_for_update().select_related("agent").get(pk=item.action_id)
        item = ReviewItem.objects.select_for_update().get(pk=item.pk)
        if item.status != ReviewStatus.OPEN:
            raise AlreadyDecided(f"already {item.status} by {item.decided_by_label or 'the system'}")
        if action.agent.owner_id == user.pk:
            raise DecisionRefused("four eyes: you are responsible for the agent that requested this")
        # Read under the lock: a verification that lands meanwhile must still refuse this.
        if decision == "mark_failed" and any(e.get("found") is True for e in action.evidence or []):
            raise DecisionRefused("the provider reported the effect; mark it succeeded with its reference instead")
        if decision == "approve" and item.approvals_needed > 1 and not _second_approval(item, user, reason):
            return item
        _decide(item, action, user, decision, reason, external_ref.strip())
    return item


def _second_approval(item, user, reason):
    """Record this approval; True if it is the second, by someone else."""
    earlier = list(item.approvals.all())
    if any(a.user_id == user.pk for a in earlier):
        raise DecisionRefused("four eyes: the second approval must come from someone else")
    try:
        with transaction.atomic():
            Approval.objects.create(item=item, user=user, reason=reason)
    except IntegrityError:
        raise DecisionRefused("you have already approved this") from None
    AuditEvent.objects.record(actor=user, verb="approval_recorded", obj=item,
                              after={"approvals": len(earlier) + 1, "needed": item.approvals_needed}, reason=reason)
    return len(earlier) + 1 >= item.approvals_needed


def _decide(item, action, user, decision, reason, external_ref):
    outcome = {"approve": ReviewStatus.APPROVED, "reject": ReviewStatus.REJECTED}.get(decision, ReviewStatus.RESOLVED)
    item.decide(outcome, user=user, verb=decision, reason=reason, decided_by_label=actor_label(user))
    try:
        if decision == "approve":
            action.approve(actor=user, reason=reason)
        elif decision == "reject":
            action.reject(actor=user, reason=reason)
        elif decision == "release":
            verdict = verdict_for_action(action)
            action.release(actor=user, reason=reason,
                           needs_approval=bool(verdict.approvals_needed))
        elif decision == "mark_succeeded":
            action.mark_succeeded(actor=user, external_ref=external_ref, reason=reason or "confirmed by a person")
        elif decision == "mark_failed":
            action.mark_failed(actor=user, code="confirmed_absent", message=reason, retryable=True, reason=reason)
        else:
            action.verify_again(actor=user, reason=reason or "verify again")
    except InvalidTransition as exc:
        raise DecisionRefused(str(exc)) from exc


def held_group(item):
    """The open held items waiting with this one: held actions on its action's target or
    customer, oldest first (this one among them)."""
    action = item.action
    subjects = Q(action__target=action.target) | (Q(action__customer=action.customer) if action.customer else Q())
    return list(ReviewItem.objects.filter(subjects, kind=ReviewKind.HELD, status=ReviewStatus.OPEN)
                .select_related("action").order_by("action_id"))


def held_group_decide(item, *, user, release, reason):
    """One decision for a held group: release the action `release` (a pk in the group) and
    reject the rest, or reject them all (`release` None), with one reason for all. The one
    released goes first, so that no rejection lets the system release another meanwhile."""
    reason = reason.strip()
    if not reason:
        raise DecisionRefused("a reason is required")
    with transaction.atomic():
        group = held_group(item)
        if release is not None and release not in {member.action_id for member in group}:
            raise DecisionRefused("the action to release is not held in this group any more")
        for member in sorted(group, key=lambda member: member.action_id != release):
            review_decide(member, user=user, decision="release" if member.action_id == release else "reject",
                          reason=reason)
    return group
