"""The overview's cards: one per queue a person works, in the order the page shows them
(QUEUES): the review queues' three, then the dead-letter queue's and the incidents'."""

from django.db.models import Count, Min, Q
from django.urls import reverse

from approvals.decisions import waiting_for
from approvals.models import ReviewItem, ReviewKind, ReviewStatus

from .dlq_views import deadletter_card
from .incident_views import incident_card

# Each card opens its queue filtered to its own kind.
CARDS = ((ReviewKind.APPROVAL, "approvals"), (ReviewKind.HELD, "approvals"), (ReviewKind.UNKNOWN_OUTCOME, "unknown-outcomes"))


def review_cards(user, now):
    """The three queue cards in one query over the open items (it was four queries per card):
    per kind, how many, how many are overdue, how many escalated to the next tier, the oldest,
    the next deadline, and how many wait for this user: those whose page offers them a decision
    (approvals.decisions.waiting_for, the next item's list too)."""
    mine = Count("id", filter=waiting_for(user))
    stats = {row["kind"]: row for row in ReviewItem.objects.filter(status=ReviewStatus.OPEN).order_by().values("kind")
             .annotate(count=Count("id"), mine=mine, overdue=Count("id", filter=Q(deadline__lt=now)),
                       escalated=Count("id", filter=Q(escalated_at__isnull=False)),
                       oldest=Min("created_at"), deadline=Min("deadline"))}
    cards = []
    for kind, page in CARDS:
        row = stats.get(kind, {})
        label = ReviewKind(kind).label
        cards.append({"kind": kind, "label": f"{label[:1].upper()}{label[1:]}s",
                      "href": f"{reverse(page)}?kind={kind}",
                      "count": row.get("count", 0), "mine": row.get("mine", 0), "oldest": row.get("oldest"),
                      "deadline": row.get("deadline"), "overdue": row.get("overdue", 0),
                      "escalated": row.get("escalated", 0)})
    return cards


# Each returns its cards, each a dict: `kind`, `label`, `count`, `href`, `mine` (how many this
# user may decide, or None), `overdue`, `oldest`, `deadline`, `count_id` and `hint` (said when
# nothing is oldest).
QUEUES = (review_cards, deadletter_card, incident_card)


def overview_cards(user, now):
    return [card for cards in QUEUES for card in cards(user, now)]
