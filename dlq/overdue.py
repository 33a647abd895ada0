"""Review items past their deadline: each raises one alert, through the dead-letter machinery."""

from django.db import transaction
from django.utils import timezone

from approvals.models import ReviewItem, ReviewStatus

from .models import Alert


def review_alert_overdue(now=None):
    """The sweeper's pass: each overdue item raises one alert (the dead-letter machinery)."""
    now = now or timezone.now()
    raised = 0
    for item in ReviewItem.objects.filter(status=ReviewStatus.OPEN, deadline__lt=now, overdue_alerted_at__isnull=True):
        with transaction.atomic():
            claimed = ReviewItem.objects.filter(pk=item.pk, overdue_alerted_at__isnull=True).update(overdue_alerted_at=now)
            if claimed:
                Alert.objects.raise_for(
                    kind=Alert.Kind.OVERDUE_REVIEW, review_item=item, link=item.get_absolute_url(),
                    subject=f"Overdue: {item}", body=f"Waiting since {item.created_at:%Y-%m-%d %H:%M} UTC; {item.why}",
                )
                raised += 1
    return raised
