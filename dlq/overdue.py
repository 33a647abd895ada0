"""Review items past their deadlines, in two tiers, through the dead-letter machinery's alerts.

1. Past its review deadline, an item alerts its limit's first tier (the operations group when
   the limit names none), once; the second deadline is set then, if the limit has a next tier.
2. Still open at that second deadline, it alerts the next tier, once, and is marked escalated
   (the queue shows it, the overview counts it).

The tiers come from the limit as it was when the item opened (`ReviewItem.limit_snapshot`):
like every policy change, a new tier applies to new actions.
"""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from approvals.models import ReviewItem, ReviewStatus, item_tiers
from ledger.models import AuditEvent

from .models import Alert


def review_alert_overdue(now=None):
    """The sweeper's pass: first-tier alerts for newly overdue items, then escalations."""
    now = now or timezone.now()
    return _alert_first_tier(now) + _escalate(now)


def _alert_first_tier(now):
    raised = 0
    overdue = ReviewItem.objects.filter(status=ReviewStatus.OPEN, deadline__lt=now, overdue_alerted_at__isnull=True)
    for item in overdue.select_related("action"):
        policy = item.limit_snapshot or {}
        first_tier, _ = item_tiers(item)
        hours = policy.get("escalate_after_hours")
        escalate_at = item.deadline + timedelta(hours=hours) if hours and policy.get("next_tier") else None
        with transaction.atomic():
            # Two sweepers at once, or a decision or a new deadline in between (reopened): only
            # the pass that changes the still-open, still-overdue row raises the alert.
            claimed = ReviewItem.objects.filter(
                pk=item.pk, status=ReviewStatus.OPEN, deadline__lt=now, overdue_alerted_at__isnull=True
            ).update(overdue_alerted_at=now, escalate_at=escalate_at)
            if claimed:
                Alert.objects.raise_for(
                    kind=Alert.Kind.OVERDUE_REVIEW, review_item=item, link=item.get_absolute_url(),
                    subject=f"Overdue: {item}", body=f"Waiting since {item.created_at:%Y-%m-%d %H:%M} UTC; {item.why}",
                    recipients=first_tier,
                )
                raised += 1
    return raised


def _escalate(now):
    raised = 0
    due = ReviewItem.objects.filter(status=ReviewStatus.OPEN, escalated_at__isnull=True, escalate_at__lt=now)
    for item in due.select_related("action"):
        _, next_tier = item_tiers(item)
        with transaction.atomic():
            claimed = ReviewItem.objects.filter(
                pk=item.pk, status=ReviewStatus.OPEN, escalated_at__isnull=True, escalate_at__lt=now
            ).update(escalated_at=now)
            if claimed:
                Alert.objects.raise_for(
                    kind=Alert.Kind.OVERDUE_REVIEW, review_item=item, link=item.get_absolute_url(),
                    subject=f"Escalated: {item}",
                    body=f"Still open {item.limit_snapshot['escalate_after_hours']} h after its deadline "
                         f"({item.deadline:%Y-%m-%d %H:%M} UTC); the first tier was alerted "
                         f"{item.overdue_alerted_at:%Y-%m-%d %H:%M} UTC; {item.why}",
                    recipients=next_tier,
                )
                AuditEvent.objects.record(actor="system:overdue", verb="review_escalated", obj=item,
                                          after={"escalated_at": now.isoformat(), "next_tier": next_tier},
                                          reason="still open at the second deadline")
                raised += 1
    return raised
