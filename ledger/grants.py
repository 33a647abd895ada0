"""Which agent may request which action type or start which workflow (django-guardian).

Checked here and nowhere else; every grant and revoke is audited.
"""

from django.db import transaction
from guardian.core import ObjectPermissionChecker
from guardian.shortcuts import assign_perm, remove_perm

from .models import AuditEvent, Capability

USE = "ledger.use_capability"


def capability(kind, name):
    return Capability.objects.get_or_create(kind=kind, name=name)[0]


def agent_may(agent, kind, name):
    found = Capability.objects.filter(kind=kind, name=name).first()
    return found is not None and ObjectPermissionChecker(agent.user).has_perm("use_capability", found)


def agent_grant(agent, cap, *, actor, reason=""):
    with transaction.atomic():
        assign_perm(USE, agent.user, cap)
        AuditEvent.objects.record(actor=actor, verb="granted", obj=agent, after={"capability": str(cap)}, reason=reason)


def agent_revoke(agent, cap, *, actor, reason=""):
    with transaction.atomic():
        remove_perm(USE, agent.user, cap)
        AuditEvent.objects.record(actor=actor, verb="revoked", obj=agent, before={"capability": str(cap)}, reason=reason)
