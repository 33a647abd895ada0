"""The overview's cards: one per queue a person works, in the order the page shows them
(QUEUES): the review queues' three, then the dead-letter queue's and the incidents'."""

import functools
import operator

from django.db.models import Count, Exists, Min, OuterRef, Q, Value
from django.urls import reverse

from approvals.access import decidable_for, standing_in_for
from approvals.decisions import by_the_same_eyes
from approvals.models import Approval, ReviewItem, ReviewKind, ReviewStatus

from .dlq_views import deadletter_card
from .incident_views import incident_card
from ledger.access import APPROVE, RESOLVE, decidable_names
from ledger.models import ActionType, Agent

# Each card opens its queue filtered to its own kind.
CARDS = ((ReviewKind.APPROVAL, APPROVE, "approvals"), (ReviewKind.HELD, APPROVE, "approvals"),
         (ReviewKind.UNKNOWN_OUTCOME, RESOLVE, "unknown-outcomes"))


def approved_by(user):
    """An item on which four eyes already take an approval (of two) for this user's own
    (approvals.decisions.given_by_the_same_eyes): given by them, or for them by their delegate;
    and, of the action types they may decide only for people they stand in for, given by or for
    each of those people (a person and their delegate give one approval between them). It waits
    for someone else."""
    own = decidable_names(user, APPROVE)
    theirs = [(person, names - own) for person, names in standing_in_for(user, APPROVE)]
    theirs = [(person, names) for person, names in theirs if names]
    if not theirs:
        return _given(user)
    # Any one of them whose eyes it still lacks is someone this user may approve it for.
    still_for = functools.reduce(operator.or_, (Q(action__action_type__in=names) & ~_given(person)
                                                for person, names in theirs))
    only_for_them = set().union(*(names for _, names in theirs))
    return _given(user) | (Q(action__action_type__in=only_for_them) & ~still_for)


def _given(person):
    return Exists(Approval.objects.filter(by_the_same_eyes(person), item=OuterRef("pk")))


def review_cards(user, now):
    """The three queue cards in one query over the open items (it was four queries per card):
    per kind, how many, how many are overdue, how many escalated to the next tier, the oldest,
    the next deadline, and how many wait for this user: an action type they may decide (or a
    person they stand in for may: approvals.delegation), not requested by an agent they own or
    were shown the token of (four eyes), not already approved by them. The first two of those
    conditions need every open item joined to its action (decision 38), so each is left out when
    it cannot exclude anything: the user may decide every action type, or answers for no agent."""
    names = {perm: decidable_for(user, perm) for perm in (APPROVE, RESOLVE)}
    decidable = [Q(kind=kind) if names[perm] >= set(ActionType.values)
                 else Q(kind=kind, action__action_type__in=names[perm]) for kind, perm, _ in CARDS if names[perm]]
    answered_for = list(Agent.objects.filter(Agent.answering_for(user)).values_list("pk", flat=True))
    if decidable:
        waiting_for_me = functools.reduce(operator.or_, decidable)
        if answered_for:
            waiting_for_me &= ~Q(action__agent__in=answered_for)
        waiting_for_me &= ~approved_by(user)
        mine = Count("id", filter=waiting_for_me)
    else:
        mine = Value(0)
    stats = {row["kind"]: row for row in ReviewItem.objects.filter(status=ReviewStatus.OPEN).order_by().values("kind")
             .annotate(count=Count("id"), mine=mine, overdue=Count("id", filter=Q(deadline__lt=now)),
                       escalated=Count("id", filter=Q(escalated_at__isnull=False)),
                       oldest=Min("created_at"), deadline=Min("deadline"))}
    cards = []
    for kind, _, page in CARDS:
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
