"""The dead-letter queue's section of an action's evidence record (ledger.evidence): the
dead-letter entries of the action (or of its task) with the snapshot each was opened with and
who settled it, every alert raised for them or for the action's overdue review items with each
delivery attempt, and the reconciliation incidents about its operation key.

What the record shows of each row is named once, in the serializers' field lists. Of an alert, never
to whom it went: the record is the agent's to read (and whoever holds its token), and an alert's
addresses are staff's (its tier, ALERT_EMAILS, the agent's owner), as are those a delivery reached
and its transport's answer, which names them ("mailed to ...", a refused recipient) or the alert
webhook's URL. The record says that each alert was raised, when, and whether each delivery went
through; whom it reached is on the dead-letter entry's or the incident's page.
"""

from django.db.models import Prefetch, Q
from rest_framework import serializers

from approvals.models import ReviewItem
from ledger.evidence import EvidencePart

from .incidents import Incident
from .models import Alert, AlertDelivery, DeadLetter


# Kinds and statuses are text, not enums: the document's enum components are named by field,
# and `status` is the action's.
class DeadLetterEvidenceSerializer(serializers.ModelSerializer):
    status = serializers.CharField()

    class Meta:
        model = DeadLetter
        fields = ("id", "status", "task", "action", "attempts", "last_error", "snapshot", "created_at",
                  "decided_by", "decided_at", "note")


class AlertDeliveryEvidenceSerializer(serializers.ModelSerializer):
    class Meta:
        model = AlertDelivery
        fields = ("channel", "attempt", "ok", "at")


class AlertEvidenceSerializer(serializers.ModelSerializer):
    kind = serializers.CharField()
    deliveries = AlertDeliveryEvidenceSerializer(many=True, read_only=True)

    class Meta:
        model = Alert
        fields = ("id", "kind", "dead_letter", "review_item", "incident", "subject", "created_at", "delivered_at",
                  "deliveries")


class IncidentEvidenceSerializer(serializers.ModelSerializer):
    kind = serializers.CharField()
    status = serializers.CharField()

    class Meta:
        model = Incident
        fields = ("id", "kind", "connector", "status", "external_refs", "evidence", "created_at", "resolved_by",
                  "resolved_at", "resolution")


class DeadLettersEvidenceSerializer(serializers.Serializer):
    dead_letters = DeadLetterEvidenceSerializer(many=True)
    alerts = AlertEvidenceSerializer(many=True)
    incidents = IncidentEvidenceSerializer(many=True)


def deadletters_evidence(action):
    """Five queries, whatever the number of rows. The alerts are looked up by the ids of their
    entries, review items and incidents, each an index lookup: an OR across a join to the review
    items read every alert (decision 38)."""
    about = Q(action=action) | (Q(task_id=action.task_id) if action.task_id else Q(pk__in=[]))
    entries = list(DeadLetter.objects.filter(about).order_by("id"))
    items = list(ReviewItem.objects.filter(action=action).values_list("pk", flat=True))
    incidents = list(Incident.objects.filter(operation_key=action.operation_key).order_by("id"))
    alerts = Alert.objects.filter(Q(dead_letter__in=[e.pk for e in entries]) | Q(review_item__in=items)
                                  | Q(incident__in=[i.pk for i in incidents])).order_by(
        "id").prefetch_related(Prefetch("deliveries", AlertDelivery.objects.order_by("at", "id")))
    audit = (Q(object_type=DeadLetter._meta.label_lower, object_id__in=[str(e.pk) for e in entries])
             | Q(object_type=Incident._meta.label_lower, object_id__in=[str(i.pk) for i in incidents]))
    data = {
        "dead_letters": DeadLetterEvidenceSerializer(entries, many=True).data,
        "alerts": AlertEvidenceSerializer(alerts, many=True).data,
        "incidents": IncidentEvidenceSerializer(incidents, many=True).data,
    }
    return EvidencePart(data=data, audit=audit)
