"""Incidents: what reconciliation found wrong between the ledger and a provider's records.

An incident is opened once per finding while it is open (the database refuses a second: re-running
reconciliation over the same window opens nothing new; one resolved answers for the effects it
named, not for one made since), raises the same alert as a dead-letter entry, and is worked on its
page: someone takes it, adds notes, and resolves it with a reason. Every change is audited in its
transaction.
"""

from django.apps import apps
from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.db.models import Q
from django.utils import timezone

from ledger.audit import actor_label
from ledger.models import Action, AuditEvent
from ledger.statemachine import InvalidTransition, StateMachine


class IncidentKind(models.TextChoices):
    ORPHAN_EFFECT = "orphan_effect", "effect without a ledger entry"
    DOUBLE_EFFECT = "double_effect", "more than one effect for an operation key"
    AMOUNT_MISMATCH = "amount_mismatch", "amount differs from the ledger"
    DENIED_EFFECT = "denied_effect", "effect for a ledger entry that says none was made"
    FAILED_EFFECT = "failed_effect", "effect the provider failed after the ledger recorded it made"


class IncidentStatus(models.TextChoices):
    OPEN = "open"
    RESOLVED = "resolved"


I = IncidentStatus
INCIDENT_TRANSITIONS = {I.OPEN: {I.RESOLVED}, I.RESOLVED: set()}


class IncidentManager(models.Manager):
    def open_for(self, finding, *, actor):
        """The incident for a finding and its alert; None if one about it is open already (opened by
        an earlier or a concurrent run, or a webhook), which then names the finding's effects too."""
        incident, opened, _ = self.naming(finding, finding.external_refs, actor=actor)
        return incident if opened else None

    def naming(self, finding, refs, *, actor):
        """The open incident about `finding` names its effects `refs`, in one transaction: it is
        opened, with its alert, if none is; else those of `refs` it does not name yet (a third refund
        of one order beside its double) are added to it, audited and alerted, as its reader resolves
        it from what it names. (incident, whether it was opened, how many effects were added).

        What a run read at its start may have changed since, so this looks again under the lock: an
        incident resolved meanwhile is no longer the open one (its resolution waits for the lock, or
        this waits for it), and one a concurrent run opened meanwhile is (its insert held the action's
        lock, or the unique key, until it committed). Either way the effects are named before this
        returns: the last run to read them may be the last that ever will."""
        with transaction.atomic():
            # The action its key names, locked: an archive run that chose it meanwhile waits, then
            # reads this incident and keeps it; one that locked it first took it before. Two runs
            # opening the same finding's incident wait for each other here too.
            list(Action.objects.select_for_update(no_key=True).filter(operation_key=finding.operation_key)
                 .values_list("pk", flat=True))
            incident = self._open_about(finding)
            if incident is None:
                try:
                    with transaction.atomic():
                        return self._opened(finding, actor), True, 0
                except IntegrityError:
                    # One committed after the look (an orphan's key locks no action): the insert
                    # waited for it, and now it is there to add to.
                    incident = self._open_about(finding)
                    if incident is None:
                        raise
            return incident, False, self._added(incident, finding, refs, actor)

    def _open_about(self, finding):
        return self.select_for_update().filter(connector=finding.connector, kind=finding.kind,
                                               subject=finding.subject, status=IncidentStatus.OPEN).first()

    def _opened(self, finding, actor):
        # By name: dlq.models imports this module to register the model.
        Alert = apps.get_model("dlq", "Alert")
        incident = self.create(kind=finding.kind, connector=finding.connector, action_type=finding.action_type,
                               operation_key=finding.operation_key, subject=finding.subject,
                               external_refs=finding.external_refs, evidence=finding.evidence)
        AuditEvent.objects.record(actor=actor, verb="incident_opened", obj=incident,
                                  after={"status": incident.status, "kind": incident.kind}, reason=finding.summary)
        Alert.objects.raise_for(incident=incident, kind=Alert.Kind.INCIDENT, link=incident.get_absolute_url(),
                                subject=f"Reconciliation: {finding.summary}",
                                body=f"{incident.get_kind_display()} at {incident.connector}.")
        return incident

    def _added(self, incident, finding, refs, actor):
        Alert = apps.get_model("dlq", "Alert")
        new = [effect for effect in finding.effects
               if effect["external_ref"] in refs and effect["external_ref"] not in incident.external_refs]
        if not new:
            return 0
        before = {"external_refs": incident.external_refs}
        incident.external_refs = [*incident.external_refs, *(effect["external_ref"] for effect in new)]
        incident.evidence = {**incident.evidence, "effects": [*incident.evidence.get("effects", []), *new]}
        incident.save(update_fields=["external_refs", "evidence"])
        AuditEvent.objects.record(actor=actor, verb="incident_effects_added", obj=incident, before=before,
                                  after={"external_refs": incident.external_refs}, reason=finding.summary)
        Alert.objects.raise_for(incident=incident, kind=Alert.Kind.INCIDENT, link=incident.get_absolute_url(),
                                subject=f"Reconciliation: {finding.summary} (more on incident #{incident.pk})",
                                body=f"{incident.get_kind_display()} at {incident.connector}: "
                                     f"{', '.join(effect['external_ref'] for effect in new)} made since it opened.")
        return len(new)


class Incident(StateMachine):
    TRANSITIONS = INCIDENT_TRANSITIONS
    AUDITED = ()

    kind = models.CharField(max_length=30, choices=IncidentKind.choices)
    connector = models.CharField(max_length=50)
    action_type = models.CharField(max_length=40, blank=True, default="")
    operation_key = models.CharField(max_length=255, blank=True, default="")
    # What the finding is about: its operation key, or, for an effect that carries none, the
    # provider's reference of that effect. With connector and kind, one finding, one incident.
    subject = models.CharField(max_length=255)
    external_refs = models.JSONField(default=list)
    evidence = models.JSONField(default=dict)
    status = models.CharField(max_length=20, choices=IncidentStatus.choices, default=I.OPEN)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                              related_name="incidents")
    created_at = models.DateTimeField(default=timezone.now)
    resolved_by = models.CharField(max_length=150, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution = models.TextField(blank=True, default="")

    objects = IncidentManager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "-created_at", "-id"], name="incident_queue_idx"),
                   # A dead letter's redrive asks whether the provider holds its key's effect.
                   models.Index(fields=["operation_key"], condition=Q(kind="denied_effect"), name="incident_denied_key_idx")]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=IncidentStatus.values), name="incident_status_valid"),
            models.CheckConstraint(condition=Q(kind__in=IncidentKind.values), name="incident_kind_valid"),
            # One open at a time per finding; one resolved does not answer for an effect made since
            # (dlq.reconcile._open).
            models.UniqueConstraint(fields=["connector", "kind", "subject"], condition=Q(status=I.OPEN),
                                    name="incident_open_once_per_finding"),
            models.CheckConstraint(condition=Q(status=I.OPEN) | ~Q(resolution=""), name="incident_resolved_has_reason"),
        ]

    def __str__(self):
        return f"incident #{self.pk} ({self.kind} {self.subject})"

    def get_absolute_url(self):
        return f"/incidents/{self.pk}/"

    def resolve(self, *, actor, reason, locked=False):
        """Closed; the reason says what was found and done."""
        return self._move(I.RESOLVED, actor=actor, verb="incident_resolved", reason=reason, locked=locked,
                          resolved_by=actor_label(actor), resolved_at=timezone.now(), resolution=reason)


def _open_incident(incident):
    incident = Incident.objects.select_for_update().get(pk=incident.pk)
    if incident.status != IncidentStatus.OPEN:
        raise InvalidTransition(f"{incident} was already resolved by {incident.resolved_by}")
    return incident


def incident_resolve(incident, *, actor, reason):
    """Close the incident; the reason says what was found and done (a refund clawed back...)."""
    if not reason.strip():
        raise ValueError("a reason is required to resolve an incident")
    with transaction.atomic():
        return _open_incident(incident).resolve(actor=actor, reason=reason, locked=True)


def incident_take(incident, *, user):
    """`user` owns the incident from now on (whoever owned it before is in the audit event)."""
    with transaction.atomic():
        incident = _open_incident(incident)
        before = {"owner": incident.owner.get_username() if incident.owner else None}
        incident.owner, incident.updated_at = user, timezone.now()
        incident.save(update_fields=["owner", "updated_at"])
        AuditEvent.objects.record(actor=user, verb="incident_taken", obj=incident, before=before,
                                  after={"owner": user.get_username()})
    return incident


def incident_note(incident, *, actor, text):
    """A note on the incident: an audit event of its own, shown in the incident's history."""
    if not text.strip():
        raise ValueError("a note cannot be empty")
    with transaction.atomic():
        incident = Incident.objects.select_for_update().get(pk=incident.pk)
        AuditEvent.objects.record(actor=actor, verb="incident_noted", obj=incident, reason=text)
    return incident


class ReconciliationRun(models.Model):
    """One pass of reconciliation over a window: what it covered, checked and opened.

    The sweeper's schedule starts one per `until` (a unique slot, so two sweepers cannot
    both start it) and the next window starts where the last finished one ended, less an
    overlap; a run that never finished leaves its window, and its part of the earlier records
    read again for late failures, to the next one. A run by hand (`manage.py reconcile`) is
    not the schedule's: whatever window it reads, the schedule's windows go on from the
    schedule's own runs.
    """

    since = models.DateTimeField()
    until = models.DateTimeField()
    scheduled = models.BooleanField(default=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Every connector that can list its records was read to the end: the next window may start here.
    complete = models.BooleanField(default=False)
    # Per connector: records checked, incidents opened, or why it was skipped or failed.
    report = models.JSONField(default=dict)
    # The earlier records it read again for failures alone (dlq.reconcile.late_span): a scheduled run
    # reads the next part of the LATE_FAILURES where the last finished one stopped. None: its window
    # reaches back that far itself.
    late_since = models.DateTimeField(null=True, blank=True)
    late_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-until"]
        constraints = [
            models.CheckConstraint(condition=Q(until__gt=models.F("since")), name="reconciliationrun_window"),
            # The late part is a span of its own before the window, or none: the schedule's round
            # goes on from its end (dlq.reconcile.run_start), and a part past the window would skip it.
            models.CheckConstraint(condition=Q(late_since__isnull=True, late_until__isnull=True) | Q(
                late_since__isnull=False, late_until__isnull=False,  # a CHECK passes on NULL otherwise
                late_until__gt=models.F("late_since"), late_until__lte=models.F("since")),
                name="reconciliationrun_late_part"),
            models.UniqueConstraint(fields=["until"], condition=Q(scheduled=True), name="reconciliationrun_one_per_slot"),
        ]

    def __str__(self):
        return f"reconciliation {self.since:%Y-%m-%d %H:%M} – {self.until:%Y-%m-%d %H:%M}"
