"""The approvals' section of an action's evidence record (ledger.evidence): the limit in force
when the action was requested, and every review item with who decided, when and why.

What the record shows of a review item or an approval is named once, in ITEM_FIELDS and
APPROVAL_FIELDS: a field added there is exported, printed (the page shows every field the
section holds) and described in the API's document, from the model's own field.

A limit's alert tiers name staff by e-mail address: the agent's record withholds them
(STAFF_ADDRESSES, ledger.evidence.withheld), in the limit in force, in each item's snapshot of
its limit and in the audit events that hold them (a limit's change, an item's escalation).
"""

from django.db.models import CharField, Prefetch, Q, Subquery
from django.db.models.functions import Cast
from rest_framework import serializers

from ledger.evidence import EvidencePart
from ledger.models import AuditEvent

from .models import Approval, Limit, ReviewItem

# The keys under which a limit (Limit.snapshot) and an item's escalation (dlq.overdue) name staff's
# addresses: in the agent's record each is {"withheld": how many}.
STAFF_ADDRESSES = ("first_tier", "next_tier")
# `fingerprint` / `decided_fingerprint`: of the params the approver or decider saw on the page.
# `on_behalf_of` / `decided_for`: the person a delegate decided for (approvals.delegation).
APPROVAL_FIELDS = ("user", "on_behalf_of", "reason", "at", "fingerprint")
ITEM_FIELDS = (
    "id", "kind", "status", "why", "approvals_needed", "limit_snapshot", "created_at", "deadline", "expires_at",
    "decided_by", "decided_for", "decided_by_label", "decided_at", "decided_fingerprint", "note", "overdue_alerted_at",
    "escalated_at", "approvals",
)


class ApprovalEvidenceSerializer(serializers.ModelSerializer):
    """One approver's yes on an item that needs two."""

    user = serializers.SlugRelatedField(slug_field="username", read_only=True, help_text="Who approved.")
    on_behalf_of = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True,
                                                help_text="The person a delegate approved for; null for their own.")

    class Meta:
        model = Approval
        fields = APPROVAL_FIELDS


class ReviewItemEvidenceSerializer(serializers.ModelSerializer):
    """A review item as the person deciding it met it, and their decision."""

    # Text, not enums: the document's enum components are named by field, and `status` is the action's.
    kind = serializers.CharField()
    status = serializers.CharField()
    decided_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True,
                                              help_text="The person who decided; null while open or closed by the system.")
    decided_for = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True,
                                               help_text="The person a delegate decided for; null for their own.")
    approvals = ApprovalEvidenceSerializer(many=True, read_only=True)
    limit_snapshot = serializers.JSONField(allow_null=True, help_text=(
        "The limit as it was when the item opened. In the agent's record its tiers (first_tier, next_tier) are "
        "{\"withheld\": n}: how many staff addresses each names, never which."))

    class Meta:
        model = ReviewItem
        fields = ITEM_FIELDS


class LimitInForceSerializer(serializers.Serializer):
    """The last change to the limit of the action's type and currency before it was requested:
    the policy it was judged by, from the audit event that recorded the change."""

    seq = serializers.IntegerField(allow_null=True, help_text="The event's place in the audit chain.")
    set_at = serializers.CharField()
    set_by = serializers.CharField()
    reason = serializers.CharField(allow_blank=True)
    limit = serializers.JSONField(help_text=(
        "The limit as it was set (max_amount, dual_approval_above, ...). In the agent's record its tiers "
        "(first_tier, next_tier) are {\"withheld\": n}: how many staff addresses each names, never which."))


class ApprovalsEvidenceSerializer(serializers.Serializer):
    limit_in_force = LimitInForceSerializer(
        allow_null=True, help_text="Null: no limit then, or its last change is among the archived events (audit.archived).")
    review_items = ReviewItemEvidenceSerializer(many=True)


def _limit_change_in_force(action):
    """The audit event of the last change to the action's limit before its request (None
    without a limit then, or with its change among the archived events: the record's
    `audit.archived` names where those went): one query."""
    if not action.currency:
        return None
    limit_id = Limit.objects.filter(action_type=action.action_type, currency=action.currency).values(
        pk_text=Cast("pk", CharField()))[:1]
    return AuditEvent.objects.filter(object_type=Limit._meta.label_lower, object_id=Subquery(limit_id),
                                     verb="limit_set", occurred_at__lte=action.created_at).order_by("-id").first()


def approvals_evidence(action):
    items = list(ReviewItem.objects.filter(action=action).select_related("decided_by", "decided_for").prefetch_related(
        Prefetch("approvals", Approval.objects.select_related("user", "on_behalf_of").order_by("at", "id")))
                 .order_by("id"))
    change = _limit_change_in_force(action)
    audit = Q(object_type=ReviewItem._meta.label_lower, object_id__in=[str(item.pk) for item in items])
    if change is not None:
        audit |= Q(pk=change.pk)
    data = {
        "limit_in_force": None if change is None else {
            "seq": change.seq, "set_at": change.occurred_at.isoformat(), "set_by": change.actor,
            "reason": change.reason, "limit": change.after,
        },
        "review_items": ReviewItemEvidenceSerializer(items, many=True).data,
    }
    return EvidencePart(data=data, audit=audit)
