"""The dashboard's groups and their permissions (`python manage.py setup_roles`)."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models import Q
from guardian.models import GroupObjectPermission
from guardian.shortcuts import assign_perm

from .access import APPROVE, RESOLVE, ROLES, WORK_DLQ
from .grants import capability
from .models import ActionType, AuditEvent, Capability
from .workflows import WORKFLOWS

SETUP_ACTOR = "system:setup_roles"


ROLE_APPS = ("ledger", "approvals", "dlq")
# Model permissions per group, on top of view_* on every model of ROLE_APPS for every role.
EXTRA_MODEL_PERMS = {"admins": ("ledger.change_agent", "approvals.change_limit")}
# django-guardian object permissions on each Capability, per kind and group. Auditors: none.
# Operators work the dead-letter queue: a task's entry by its workflow, a standalone action's
# by its action type.
OBJECT_PERMS = {
    Capability.Kind.ACTION_TYPE: {
        "approvers": (APPROVE, RESOLVE),
        "operators": (RESOLVE, WORK_DLQ),
        "admins": (APPROVE, RESOLVE, WORK_DLQ),
    },
    Capability.Kind.WORKFLOW: {
        "operators": (WORK_DLQ,),
        "admins": (WORK_DLQ,),
    },
}

# The roles that decide something: every group given a decision permission or a change
# permission. Auditors only read.
DECIDING_ROLES = sorted({role for per_kind in OBJECT_PERMS.values() for role in per_kind} | set(EXTRA_MODEL_PERMS))


def deciding(prefix=""):
    """Users (through `prefix`, "delegate__") who hold a role that decides: a superuser, or one in
    a deciding group (staff alone is no role: the admin's flag)."""
    return Q(**{f"{prefix}is_superuser": True}) | Q(**{f"{prefix}groups__name__in": DECIDING_ROLES})


def holds_deciding_role(user):
    return get_user_model().objects.filter(deciding(), pk=user.pk).exists()


def decides(user):
    """Whether `user` can decide money or authority on the dashboard (the admin's staff too)."""
    return user.is_staff or holds_deciding_role(user)


def roles_capabilities():
    """One Capability per action type and per workflow (created if missing)."""
    return [capability(Capability.Kind.ACTION_TYPE, name) for name in ActionType.values] + [
        capability(Capability.Kind.WORKFLOW, name) for name in WORKFLOWS
    ]


def _model_perms(role, view_perms):
    wanted = dict(view_perms)
    for label in EXTRA_MODEL_PERMS.get(role, ()):
        app_label, codename = label.split(".")
        wanted[(app_label, codename)] = Permission.objects.get(content_type__app_label=app_label, codename=codename)
    return wanted


def roles_setup(actor=SETUP_ACTOR):
    """Create the four groups and their grants; adds what is missing, never removes. Returns
    a list of what changed (empty on a second run). Each change is audited.

    What the groups hold is read in one query per kind of permission, and what is missing is
    assigned in bulk: a second run is a handful of statements, not one per group and capability."""
    changes = []
    with transaction.atomic():
        capabilities = roles_capabilities()
        view_perms = {(p.content_type.app_label, p.codename): p for p in Permission.objects.filter(
            content_type__app_label__in=ROLE_APPS, codename__startswith="view_").select_related("content_type")}
        held_objects = set(GroupObjectPermission.objects.filter(
            group__name__in=ROLES, content_type=ContentType.objects.get_for_model(Capability),
        ).values_list("group__name", "object_pk", "permission__codename"))
        for role in ROLES:
            group, created = Group.objects.get_or_create(name=role)
            if created:
                AuditEvent.objects.record(actor=actor, verb="group_created", obj=group, after={"name": role})
                changes.append(f"group {role} created")
            have = set(group.permissions.values_list("content_type__app_label", "codename"))
            wanted = _model_perms(role, view_perms)
            missing = sorted(key for key in wanted if key not in have)
            if missing:
                group.permissions.add(*(wanted[key] for key in missing))
                labels = [f"{app}.{codename}" for app, codename in missing]
                AuditEvent.objects.record(actor=actor, verb="role_granted", obj=group, after={"permissions": labels})
                changes.append(f"{role}: {len(labels)} model permissions")
            for codename in sorted({c for perms in OBJECT_PERMS.values() for c in perms.get(role, ())}):
                lacking = [cap for cap in capabilities if codename in OBJECT_PERMS.get(cap.kind, {}).get(role, ())
                           and (role, str(cap.pk), codename) not in held_objects]
                if not lacking:
                    continue
                assign_perm(f"ledger.{codename}", group, lacking)
                for cap in lacking:
                    AuditEvent.objects.record(actor=actor, verb="role_granted", obj=cap,
                                              after={"group": role, "permission": codename})
                    changes.append(f"{role}: {codename} on {cap}")
    return changes
