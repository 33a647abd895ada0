"""Which agent may request which action type or start which workflow (django-guardian).

Checked here and nowhere else; every grant and revoke is audited.
"""

from django.db import transaction
from django.db.models import CharField, F
from django.db.models.functions import Cast
from guardian.models import UserObjectPermission
from guardian.shortcuts import assign_perm, remove_perm

from .compiled import register_cache
from .models import Agent, AuditEvent, Capability

USE = "ledger.use_capability"


def capability(kind, name):
    return Capability.objects.get_or_create(kind=kind, name=name)[0]


_checked = {}
_CHECKED_MAX = 10_000
register_cache("ledger.grants._checked", holds="whether an agent holds a grant, by its grants_version",
               stale_when="a grant or revoke bumps the agent's grants_version (read with every request)",
               clear=_checked.clear)


def agent_may(agent, kind, name):
    """Cached per process under the agent's `grants_version`, which every grant and revoke
    bumps: the agent row read for this very request says whether the cache is current."""
    key = (agent.pk, agent.grants_version, kind, name)
    if key not in _checked:
        if len(_checked) >= _CHECKED_MAX:
            _checked.clear()
        _checked[key] = _agent_holds(agent, kind, name)
    return _checked[key]


def _agent_holds(agent, kind, name):
    """Joined by natural keys rather than through the process's content-type cache;
    agents hold no group grants."""
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
        Agent.objects.filter(pk=agent.pk).update(grants_version=F("grants_version") + 1)
        AuditEvent.objects.record(actor=actor, verb="granted", obj=agent, after={"capability": str(cap)}, reason=reason)


def agent_revoke(agent, cap, *, actor, reason=""):
    with transaction.atomic():
        remove_perm(USE, agent.user, cap)
        Agent.objects.filter(pk=agent.pk).update(grants_version=F("grants_version") + 1)
        AuditEvent.objects.record(actor=actor, verb="revoked", obj=agent, before={"capability": str(cap)}, reason=reason)
