"""Who may see and decide what: checked here, in one helper per kind of object.

Groups give the pages (operators, approvers, auditors read-only, admins); django-guardian
object permissions on an action type or workflow (`ledger.Capability`) give the decisions.
"""

from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404
from guardian.core import ObjectPermissionChecker

from ledger.models import Capability

from .models import ReviewItem, ReviewKind

ROLES = ("operators", "approvers", "auditors", "admins")
APPROVE = "approve_capability"
RESOLVE = "resolve_capability"
WORK_DLQ = "work_deadletters_capability"
PERM_FOR_KIND = {ReviewKind.APPROVAL: APPROVE, ReviewKind.HELD: APPROVE, ReviewKind.UNKNOWN_OUTCOME: RESOLVE}


def user_may(user, perm, kind, name):
    """`perm` (a Capability permission codename) on the action type or workflow `name`."""
    if not user.is_active:
        return False
    if user.is_superuser:
        return True
    capability = Capability.objects.filter(kind=kind, name=name).first()
    return capability is not None and ObjectPermissionChecker(user).has_perm(perm, capability)


def decidable_names(user, perm, kind=Capability.Kind.ACTION_TYPE):
    """The names this user may take `perm` decisions on (for "waiting for me" and hiding controls)."""
    checker = ObjectPermissionChecker(user)
    return {c.name for c in Capability.objects.filter(kind=kind) if user.is_superuser or checker.has_perm(perm, c)}


def get_review_item_for_user(user, pk, *, to_decide=False):
    item = get_object_or_404(ReviewItem.objects.select_related("action", "action__agent", "action__task"), pk=pk)
    if to_decide and not user_may(user, PERM_FOR_KIND[item.kind], Capability.Kind.ACTION_TYPE, item.action.action_type):
        raise PermissionDenied(f"you may not decide {item.action.action_type} items")
    return item


def get_deadletter_for_user(user, pk, *, to_work=False):
    from dlq.models import DeadLetter

    entry = get_object_or_404(DeadLetter.objects.select_related("task", "task__agent"), pk=pk)
    if to_work and not user_may(user, WORK_DLQ, Capability.Kind.WORKFLOW, entry.task.workflow):
        raise PermissionDenied(f"you may not work {entry.task.workflow} dead letters")
    return entry
