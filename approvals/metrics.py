"""The review queues' figures for /metrics (see ledger.metrics), read at scrape time."""

from django.db.models import Count, Q
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from .models import ReviewItem, ReviewKind, ReviewStatus


class ReviewCollector:
    def collect(self):
        # Open items are the backlog people work through, not history: review_overdue_idx
        # (status, deadline) finds them, and one grouped query counts both figures.
        rows = (ReviewItem.objects.filter(status=ReviewStatus.OPEN).order_by().values("kind")
                .annotate(open=Count("id"), overdue=Count("id", filter=Q(deadline__lt=timezone.now()))))
        by_kind = {row["kind"]: row for row in rows}
        open_items = GaugeMetricFamily("surety_review_items_open", "Open review items per kind.", labels=["kind"])
        overdue = GaugeMetricFamily("surety_review_items_overdue", "Open review items past their deadline, per kind.",
                                    labels=["kind"])
        for kind in ReviewKind.values:
            row = by_kind.get(kind, {})
            open_items.add_metric([kind], row.get("open", 0))
            overdue.add_metric([kind], row.get("overdue", 0))
        yield open_items
        yield overdue
