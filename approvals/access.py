"""Who may see and decide a review item (the permissions themselves: ledger.access)."""

from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404

from ledger.access import APPROVE, RESOLVE, decidable_names, user_may
from ledger.models import Capability
from ledger.roles import holds_deciding_role

from .models import Delegation, ReviewItem, ReviewKind

PERM_FOR_KIND = {ReviewKind.APPROVAL: APPROVE, ReviewKind.HELD: APPROVE, ReviewKind.UNKNOWN_OUTCOME: RESOLVE}


def get_review_item_for_user(user, pk, *, to_decide=False):
    item = get_object_or_404(ReviewItem.objects.select_related("action", "action__agent", "action__task"), pk=pk)
    if to_decide:
        acting_for(user, item)
    return item


def acting_for(user, item):
    """Whose authority `user` decides `item` with: None for their own (the kind's permission
    on its action type), else the person whose running delegation (approvals.delegation) gives
    it to them. PermissionDenied when neither does."""
    if _may_itself(user, item):
        return None
    able = [person for person in _standing_in_for(user) if _may_itself(person, item)]
    if not able:
        raise PermissionDenied(f"you may not decide {item.action.action_type} items")
    # With two delegations to one person, one whose four eyes allow this decision (a delegator
    # who owns the agent that asked gives no authority over its requests, nor one whose approval,
    # theirs or their delegate's, the item already counts), then the oldest: never the order a
    # query happened to return them in.
    given = {pk for approval in item.approvals.all() for pk in (approval.user_id, approval.on_behalf_of_id)}
    return next((person for person in able if person.pk not in given and not item.action.agent.answers_for(person)),
                able[0])


def _may_itself(user, item):
    return user_may(user, PERM_FOR_KIND[item.kind], Capability.Kind.ACTION_TYPE, item.action.action_type)


def may_decide(user, item):
    """`user` may decide `item`, as themselves or for a person who delegated to them, and
    neither of them owns the agent that asked for it or was shown its token (four eyes): the
    item's page offers its decisions on this, unless its window has closed or four eyes take an
    approval given already for theirs (approvals.decisions.waiting_for, what a queue counts and
    its rows offer, says the same of items in a query)."""
    try:
        behalf = acting_for(user, item)
    except PermissionDenied:
        return False
    return not item.action.agent.answers_for(user, behalf)


def standing_in_for(user, perm):
    """(person, the action types they may take `perm` decisions on) for each person whose running
    delegation names `user`: the types `user` decides for them where they may not decide them
    themselves (`acting_for`)."""
    return [(person, decidable_names(person, perm)) for person in _standing_in_for(user)]


def _standing_in_for(user):
    """The people whose running delegation names `user`; none while `user` holds no role that
    decides (an auditor named before, or through the admin, decides nothing for anyone)."""
    if not holds_deciding_role(user):
        return []
    return [delegation.person for delegation in Delegation.objects.running().filter(delegate=user)
            .select_related("person").order_by("pk")]
