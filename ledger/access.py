"""Who may do what on an action type or workflow: one place for the check.

Groups give the pages (operators, approvers, auditors read-only, admins); django-guardian
object permissions on an action type or workflow (`Capability`) give the decisions.
"""

from guardian.core import ObjectPermissionChecker

from .models import Capability

ROLES = ("operators", "approvers", "auditors", "admins")
APPROVE = "approve_capability"
RESOLVE = "resolve_capability"
WORK_DLQ = "work_deadletters_capability"


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
