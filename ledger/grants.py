"""Which agent may request which action type or start which workflow (django-guardian).

Checked here and nowhere else; every grant and revoke is audited.
"""

from django.db import transaction
from django.db.models import CharField
from django.db.models.functions import Cast
from guardian.models import UserObjectPermission
from guardian.shortcuts import assign_perm, remove_perm

from .models import AuditEvent, Capability

USE = "ledger.use_capability"


def capability(kind, name):
    return Capability.objects.get_or_create(kind=kind, name=name)[0]


def agent_may(agent, kind, name):
    """One query on the hot path of every request. Joined by natural keys rather than
    through the process's content-type cache, and agents hold no group grants."""
    return UserObjectPermission.objects.filter(
        user_id=agent.user_id,
        permission__codename="use_capability",
        permission__content_type__app_label="ledger",
        permission__content_type__model="capability",
        object_pk__in=Capability.objects.filter(kind=kind, name=name).values(pk_text=Cast("pk", CharField())),
    ).exists()


def agent_grant(agent, cap, *, actor, reason=""):
    with transaction.atomic():
        assign_perm(USE, agent.user, cap)
        AuditEvent.objects.record(actor=actor, verb="granted", obj=agent, after={"capability": str(cap)}, reason=reason)


def agent_revoke(agent, cap, *, actor, reason=""):
    with transaction.atomic():
        remove_perm(USE, agent.user, cap)
        AuditEvent.objects.record(actor=actor, verb="revoked", obj=agent, before={"capability": str(cap)}, reason=reason)
