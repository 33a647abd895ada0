"""Who may see and decide a review item (the permissions themselves: ledger.access)."""

from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404

from ledger.access import APPROVE, RESOLVE, user_may
from ledger.models import Capability

from .models import ReviewItem, ReviewKind

PERM_FOR_KIND = {ReviewKind.APPROVAL: APPROVE, ReviewKind.HELD: APPROVE, ReviewKind.UNKNOWN_OUTCOME: RESOLVE}


def get_review_item_for_user(user, pk, *, to_decide=False):
    item = get_object_or_404(ReviewItem.objects.select_related("action", "action__agent", "action__task"), pk=pk)
    if to_decide and not user_may(user, PERM_FOR_KIND[item.kind], Capability.Kind.ACTION_TYPE, item.action.action_type):
        raise PermissionDenied(f"you may not decide {item.action.action_type} items")
    return item


def may_decide(user, item):
    """`user` may decide `item`: the kind's permission for its action type, and not the owner
    of the agent that asked for it (four eyes)."""
    return (user_may(user, PERM_FOR_KIND[item.kind], Capability.Kind.ACTION_TYPE, item.action.action_type)
            and item.action.agent.owner_id != user.pk)
