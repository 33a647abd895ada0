"""The review queues' figures for /metrics (see ledger.metrics), read at scrape time: the
backlog (ReviewCollector) and the decision analytics (DecisionCollector)."""

from django.db.models import Count, Q
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from .analytics import DAYS, decision_rates, decisions, overdue_rates, times_to_decision, window_start
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


class DecisionCollector:
    """The decision analytics per queue and per action type (approvals.analytics), over its
    last 30 days. Per approver and per agent only on the page: label values that grow with
    people and agents would make series without bound."""

    def collect(self):
        since = window_start()
        window = f"the last {DAYS} days (from midnight UTC)"
        per_queue = times_to_decision(decisions(since), "kind")
        seconds = GaugeMetricFamily("surety_review_decision_seconds",
                                    f"Time from a review item's opening to a person's decision, per kind: median (0.5) "
                                    f"and p90 (0.9) over {window}.", labels=["kind", "quantile"])
        decided = GaugeMetricFamily("surety_review_decisions_by_people",
                                    f"Review items decided by a person over {window}, per kind.", labels=["kind"])
        overdue = GaugeMetricFamily("surety_review_overdue_ratio",
                                    f"Of the review items due over {window}, the share no person decided by its "
                                    "deadline, per kind (items the system ended left out).", labels=["kind"])
        ended = GaugeMetricFamily("surety_review_ended_by_system",
                                  f"Review items the system ended (not a person's decision) over {window}, per kind.",
                                  labels=["kind"])
        rates = overdue_rates(since, timezone.now())
        for kind in ReviewKind.values:
            row = per_queue.get(kind)
            decided.add_metric([kind], row["n"] if row else 0)
            if row:
                seconds.add_metric([kind, "0.5"], row["median"].total_seconds())
                seconds.add_metric([kind, "0.9"], row["p90"].total_seconds())
            if rates[kind]["rate"] is not None:
                overdue.add_metric([kind], rates[kind]["rate"])
            ended.add_metric([kind], rates[kind]["ended_by_system"])
        yield from (seconds, decided, overdue, ended)
        outcome = GaugeMetricFamily("surety_review_approval_outcome_ratio",
                                    f"Of the approval queue's decisions by people over {window}, per action type, the "
                                    "share approved (or released) and rejected.", labels=["action_type", "outcome"])
        for action_type, row in decision_rates(since, "action__action_type").items():
            outcome.add_metric([action_type, "approved"], row["approval_rate"])
            outcome.add_metric([action_type, "rejected"], row["rejection_rate"])
        yield outcome
