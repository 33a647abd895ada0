"""Who may see and work a dead-letter entry (the permissions themselves: ledger.access)."""

from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404

from ledger.access import WORK_DLQ, user_may

from .models import DeadLetter


def get_deadletter_for_user(user, pk, *, to_work=False):
    """A task's entry is worked with the permission on its workflow; an action's, on its type."""
    entry = get_object_or_404(DeadLetter.objects.select_related("task", "task__agent", "action", "action__agent"), pk=pk)
    if to_work and not user_may(user, WORK_DLQ, *entry.capability):
        raise PermissionDenied(f"you may not work {entry.capability[1]} dead letters")
    return entry
