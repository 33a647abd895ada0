"""Delegation: a person away names a delegate for a period, and the review items waiting for
them are offered to the delegate.

While a delegation runs, the delegate
- is mailed each alert that goes to the person (dlq.alerts), with a decision link of their own;
- may decide what the person may decide (approvals, held groups, unknown outcomes: the
  person's permission on the action type), on the person's behalf: the decision's audit event
  and the item record whose authority it was (`on_behalf_of`, `ReviewItem.decided_for`).

Four eyes hold for both people: a delegate never decides for someone a request of an agent
that person owns, and two approvals of one item never come from one person and their delegate
acting for them (approvals.dbrules holds both in the database as well). A delegate who may
decide an item on their own decides it as themselves. Naming a delegate hands over authority
over money, so it is a step-up decision of its own, audited, as is ending one early.
"""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ledger.roles import deciding
from ledger.models import AuditEvent

from .models import DELEGATION_MAX_DAYS, Delegation


class DelegationRefused(Exception):
    pass


def standing_in(addresses):
    """The running delegations of the people with these addresses whose delegates have one and
    decide (access.acting_for gives no other any authority): an alert to someone away reaches
    who stands in for them."""
    return list(Delegation.objects.running().filter(deciding("delegate__"), person__email__in=[a for a in addresses if a])
                .exclude(delegate__email="").select_related("person", "delegate").distinct())


def offered(delegation, item):
    """Audit that `item`'s alert reached `delegation`'s delegate (once it was mailed)."""
    AuditEvent.objects.record(actor="system:alerts", verb="offered_to_delegate", obj=item,
                              reason=f"{delegation.person.get_username()} is away until "
                                     f"{delegation.ends_at:%Y-%m-%d %H:%M} UTC",
                              after={"person": delegation.person.get_username(),
                                     "delegate": delegation.delegate.get_username(), "delegation": delegation.pk})


def delegation_name(*, person, delegate, starts_at, ends_at, reason):
    """`person` names `delegate` from `starts_at` to `ends_at`; audited as the person's."""
    reason = reason.strip()
    if not reason:
        raise DelegationRefused("a reason is required")
    if delegate.pk == person.pk:
        raise DelegationRefused("a delegate is someone else")
    if not delegate_choices(person).filter(pk=delegate.pk).exists():
        raise DelegationRefused(f"{delegate.get_username()} is not an active person of a role that decides")
    if ends_at <= starts_at:
        raise DelegationRefused("the delegation must end after it starts")
    if ends_at <= timezone.now():
        raise DelegationRefused("the delegation would be over already")
    if ends_at - starts_at > timedelta(days=DELEGATION_MAX_DAYS):  # the friendly answer; the database holds it
        raise DelegationRefused(f"a delegation lasts {DELEGATION_MAX_DAYS} days at the most")
    with transaction.atomic():
        delegation = Delegation.objects.create(person=person, delegate=delegate, starts_at=starts_at,
                                               ends_at=ends_at, reason=reason)
        AuditEvent.objects.record(actor=person, verb="delegation_named", obj=delegation, reason=reason,
                                  after=_snapshot(delegation))
    return delegation


def delegation_revoke(delegation, *, user, reason="ended early"):
    """End a delegation now: by its person, or by its delegate handing it back."""
    if user.pk not in (delegation.person_id, delegation.delegate_id):
        raise DelegationRefused("only its person or its delegate can end a delegation")
    with transaction.atomic():
        ended = Delegation.objects.filter(pk=delegation.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now())
        if not ended:
            raise DelegationRefused("this delegation has already ended")
        delegation.refresh_from_db()
        AuditEvent.objects.record(actor=user, verb="delegation_revoked", obj=delegation, reason=reason,
                                  after=_snapshot(delegation))
    return delegation


def _snapshot(delegation):
    return {"person": delegation.person.get_username(), "delegate": delegation.delegate.get_username(),
            "starts_at": delegation.starts_at.isoformat(), "ends_at": delegation.ends_at.isoformat(),
            "revoked_at": delegation.revoked_at.isoformat() if delegation.revoked_at else None}


def delegations_of(user):
    """The delegations `user` gave or took that have not ended, newest first."""
    return (Delegation.objects.filter(Q(person=user) | Q(delegate=user), ends_at__gt=timezone.now(),
                                      revoked_at__isnull=True).select_related("person", "delegate"))


def delegate_choices(user):
    """Who `user` may name: the other active people of the roles that decide (an auditor only
    reads, and holds no factor for deciding: named, they approved money for the person)."""
    return (get_user_model().objects.filter(deciding(), is_active=True).exclude(pk=user.pk)
            .distinct().order_by("username"))
