"""Dead-letter entries, and the alerts that make sure a person hears of each one."""

from django.db import models, transaction
from django.db.models import F, Q
from django.db.models.fields.json import KeyTransform
from django.utils import timezone
from django.utils.functional import cached_property

from ledger.audit import actor_label
from ledger.jobs import enqueue
from ledger.models import Action, ActionStatus, ActionType, AuditEvent, Capability, Task, TaskState
from ledger.resources import action_resource, checkpoint
from ledger.statemachine import StateMachine
from ledger.versions import edited_from

from .alert_text import entry_body, entry_subject
from .incidents import Incident, IncidentKind  # the model lives there; this module registers it
from .redrive_runs import BulkRedrive, BulkRedriveItem  # noqa: F401 (the same)


class EntryStatus(models.TextChoices):
    OPEN = "open"
    REDRIVEN = "redriven"
    RESOLVED = "resolved"
    DISCARDED = "discarded"


E = EntryStatus
ENTRY_TRANSITIONS = {E.OPEN: {E.REDRIVEN, E.RESOLVED, E.DISCARDED}, E.REDRIVEN: set(), E.RESOLVED: set(),
                     E.DISCARDED: set()}


# The task states no run leaves on its own: out of attempts (a redrive may resume it), or
# failed with an error no retry will change (final: `failed` has no way out).
TASK_STATES_WITH_ENTRY = (TaskState.DEAD_LETTERED, TaskState.FAILED)


def task_redrivable(task_id):
    """Whether a stopped task may still be redriven by a person: dead-lettered, its entry open
    (one resolved by hand stays dead-lettered, and nothing runs it again)."""
    return DeadLetter.objects.filter(task_id=task_id, task__state=TaskState.DEAD_LETTERED, status=E.OPEN).exists()


def deadletter_open_when_task_gives_up(task, previous, actor, reason):
    """After every move of a task: out of attempts, or failed for good, it gets its entry and
    alert at once."""
    if task.state in TASK_STATES_WITH_ENTRY:
        DeadLetter.objects.open_for(task, actor=actor)


def deadletter_open_when_failed_for_good(action, previous, actor, reason):
    """After every move of an action: a standalone action that failed gets its entry and alert
    at once. Nothing runs a failed action again by itself (the executor requeues a failure it
    may retry instead of failing it), so its entry is the way to retry it, whether the executor
    gave up (not retryable, or out of attempts) or a person marked it failed (confirmed absent
    at the provider, with attempts left). A task's own actions are covered by the task's entry."""
    if action.status == ActionStatus.FAILED and action.task_id is None:
        DeadLetter.objects.open_for_action(action, actor=actor)


def action_row(action):
    """An action entry's snapshot: the ledger row as the API shows it, with its agent and evidence."""
    return {**action_resource(action), "agent": action.agent.name, "evidence": action.evidence}


class DeadLetterManager(models.Manager):
    def matching(self, params):
        """The queue's filters (`status`, default open; `workflow`; `code`, exact), with what
        every list shows of each entry."""
        entries = self.select_related("task", "task__agent", "action", "action__agent")
        status = params.get("status", EntryStatus.OPEN)
        if status in EntryStatus.values:
            entries = entries.filter(status=status)
        if params.get("workflow"):
            entries = entries.filter(task__workflow=params["workflow"])
        if params.get("code"):
            entries = entries.filter(last_error__code=params["code"])
        return entries

    def open_for(self, task, *, actor):
        """The entry, with the checkpoint as it stands, and its alert: one transaction.

        (The database also refuses to commit an entry without an alert: migration 0002.)
        """
        return self._open(actor, task=task, snapshot=checkpoint(task), last_error=task.last_error or {},
                          attempts=task.attempts)

    def open_for_action(self, action, *, actor):
        """The same for a standalone action, with its ledger row and evidence as the snapshot."""
        return self._open(actor, action=action, snapshot=action_row(action), last_error=action.error or {},
                          attempts=action.attempts)

    def _open(self, actor, **fields):
        with transaction.atomic():
            entry = self.create(**fields)
            AuditEvent.objects.record(actor=actor, verb="dead_letter_opened", obj=entry,
                                      after={"status": entry.status}, reason=entry.last_error.get("message", ""))
            Alert.objects.raise_for(entry)
        return entry


# The incidents that say the provider holds an effect under an action's key.
EFFECT_FOUND = (IncidentKind.DENIED_EFFECT, IncidentKind.DOUBLE_EFFECT, IncidentKind.AMOUNT_MISMATCH)


class DeadLetter(StateMachine):
    TRANSITIONS = ENTRY_TRANSITIONS
    AUDITED = ()

    # What failed: a task (snapshot: its checkpoint) or a standalone action (snapshot: its
    # ledger row and evidence); exactly one of the two.
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.PROTECT, related_name="dead_letters")
    action = models.ForeignKey(Action, null=True, blank=True, on_delete=models.PROTECT, related_name="dead_letters")
    status = models.CharField(max_length=20, choices=EntryStatus.choices, default=E.OPEN)
    snapshot = models.JSONField()
    last_error = models.JSONField(default=dict)
    attempts = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    decided_by = models.CharField(max_length=150, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True, default="")

    objects = DeadLetterManager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "-created_at", "-id"], name="deadletter_queue_idx"),
            # The queue filtered by error code (`?code=`, matched exactly), newest first, without
            # reading the whole open queue (decision 38).
            models.Index("status", KeyTransform("code", "last_error"), F("created_at").desc(), F("id").desc(),
                         name="deadletter_code_idx"),
            # An entry's page offers the reasons its reader gave for their latest redrives
            # (console.dlq_views.deadletter_detail), without reading and sorting every redriven entry.
            models.Index(F("decided_by"), F("decided_at").desc(), condition=Q(status=E.REDRIVEN),
                         name="deadletter_redriven_by_idx"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=EntryStatus.values), name="deadletter_status_valid"),
            # At most one open entry per task or action: each is in the queue once.
            models.UniqueConstraint(fields=["task"], condition=Q(status="open"), name="deadletter_one_open_per_task"),
            models.UniqueConstraint(fields=["action"], condition=Q(status="open"),
                                    name="deadletter_one_open_per_action"),
            models.CheckConstraint(
                condition=Q(task__isnull=False, action__isnull=True) | Q(task__isnull=True, action__isnull=False),
                name="deadletter_task_or_action",
            ),
        ]

    def __str__(self):
        return f"dead letter #{self.pk} ({self.subject_label})"

    @property
    def subject_label(self):
        """The task id or the operation key: what the entry is about, as people know it."""
        return self.action.operation_key if self.action_id else self.task.task_id

    @property
    def capability(self):
        """(kind, name) of the Capability whose dead-letter permission works this entry."""
        if self.action_id:
            return Capability.Kind.ACTION_TYPE, self.action.action_type
        return Capability.Kind.WORKFLOW, self.task.workflow

    @property
    def redrive_needs_reason(self):
        """A permanent failure is retried only on a person's word, and they say why."""
        return bool(self.action_id) and not self.last_error.get("retryable")

    def actions_asked(self):
        """The actions under whose keys `redrive_refusal` looks for an effect the provider holds: an
        action and those it was edited down from (one decision: an effect under the original's is
        the decision's), or a task's (its runner retries a failed one; a version of one is its
        task's too). A redrive locks them before it asks (dlq.entries): reconciliation opens its
        incident under the action's lock."""
        if self.action_id:
            return Action.objects.filter(pk__in=[action.pk for action in edited_from(self.action)])
        return Action.objects.filter(task_id=self.task_id)

    @cached_property  # the page asks it three times
    def redrive_refusal(self):
        """Why this entry cannot be redriven ("" when it can): a failed task is final; a booking that
        failed for good gave its slot up; and an action (or a task's) whose effect reconciliation found
        at the provider (dlq.reconcile: a denied effect, or a double or a mismatch found while it was in
        flight and marked failed since) was done there, so a retry against a provider that has
        forgotten the key would do it again."""
        if self.task_id and self.task.state == TaskState.FAILED:
            return "a failed task is final (its error is one no retry will change): resolve or discard it"
        if self.action_id and self.action.action_type == ActionType.CREATE_BOOKING and not self.last_error.get(
                "retryable"):
            return "its slot was given up when it failed: request a new booking"
        # A double or a mismatch under the key of an action that succeeded says nothing of a retry:
        # none comes for it (a task resumes after its done steps).
        actions = self.actions_asked()
        keys = actions.values("operation_key")
        unsettled = keys if self.action_id else actions.exclude(status=ActionStatus.SUCCEEDED).values("operation_key")
        found = Incident.objects.filter(
            Q(kind=IncidentKind.DENIED_EFFECT, operation_key__in=keys)
            | Q(kind__in=EFFECT_FOUND, operation_key__in=unsettled)).order_by("pk").first()
        if found is not None:
            return (f"the provider holds an effect under {found.operation_key} (incident #{found.pk}, {found.status}): "
                    "a retry could make it again; resolve it by hand")
        return ""

    def get_absolute_url(self):
        return f"/dlq/{self.pk}/"

    # A person's decisions (dlq.entries), each audited under its own name. `locked`: the
    # caller has just locked the entry.

    def redrive(self, *, actor, reason, locked=False):
        """Its task or action went back to the queue."""
        return self._decided(E.REDRIVEN, actor, reason, locked)

    def resolve(self, *, actor, note, locked=False):
        """Finished by hand; the note says what was done."""
        return self._decided(E.RESOLVED, actor, note, locked)

    def discard(self, *, actor, reason, locked=False):
        return self._decided(E.DISCARDED, actor, reason, locked)

    def _decided(self, to, actor, reason, locked):
        return self._move(to, actor=actor, verb=to, reason=reason, locked=locked, decided_by=actor_label(actor),
                          decided_at=timezone.now(), note=reason)


class AlertManager(models.Manager):
    def raise_for(self, entry=None, *, subject="", body="", link="", kind="dead_letter", review_item=None,
                  incident=None, recipients=None):
        """Record the alert in the caller's transaction; deliver it by a job after commit
        (`dlq.alerts.alert_deliver`, named by path: the transports depend on this module)."""
        if entry is not None:
            subject = subject or entry_subject(entry)
            body = body or entry_body(entry)
            link = link or entry.get_absolute_url()
        alert = self.create(kind=kind, dead_letter=entry, review_item=review_item, incident=incident,
                            subject=subject[:255], body=body, link=link, recipients=recipients or None)
        transaction.on_commit(lambda: enqueue("dlq.alerts.alert_deliver", alert.pk), robust=True)
        return alert


class Alert(models.Model):
    class Kind(models.TextChoices):
        DEAD_LETTER = "dead_letter"
        OVERDUE_REVIEW = "overdue_review"
        SECOND_APPROVAL = "second_approval"  # the first of two approvals given (dlq.alerts)
        INCIDENT = "incident"

    kind = models.CharField(max_length=30, choices=Kind.choices)
    dead_letter = models.ForeignKey(DeadLetter, null=True, blank=True, on_delete=models.PROTECT, related_name="alerts")
    review_item = models.ForeignKey(
        "approvals.ReviewItem", null=True, blank=True, on_delete=models.PROTECT, related_name="alerts"
    )
    incident = models.ForeignKey("dlq.Incident", null=True, blank=True, on_delete=models.PROTECT, related_name="alerts")
    subject = models.CharField(max_length=255)
    body = models.TextField(blank=True, default="")
    link = models.CharField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # The addresses its e-mail goes to instead of ALERT_EMAILS (a review item's tier); null: those.
    recipients = models.JSONField(null=True, blank=True)
    # When the sweeper last queued its delivery again (dlq.alerts.alerts_redeliver_stale).
    redelivery_queued_at = models.DateTimeField(null=True, blank=True)

    objects = AlertManager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["delivered_at", "created_at"], name="alert_undelivered_idx")]
        constraints = [
            # Every alert is about the one thing its kind names.
            models.CheckConstraint(
                condition=Q(kind="dead_letter", dead_letter__isnull=False, review_item__isnull=True,
                            incident__isnull=True)
                | Q(kind__in=["overdue_review", "second_approval"], review_item__isnull=False, dead_letter__isnull=True,
                    incident__isnull=True)
                | Q(kind="incident", incident__isnull=False, dead_letter__isnull=True, review_item__isnull=True),
                name="alert_names_its_subject",
            ),
        ]

    def __str__(self):
        return self.subject


class AlertDelivery(models.Model):
    """One attempt to deliver an alert on one channel; saved whatever the outcome."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=20)  # "email" or "webhook"
    attempt = models.PositiveSmallIntegerField()
    ok = models.BooleanField()
    detail = models.TextField(blank=True, default="")
    # The addresses this attempt's e-mail got to: a later attempt mails only the others.
    reached = models.JSONField(default=list, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["alert", "at"]
        constraints = [
            # Two jobs delivering one alert at once would both record "attempt 1".
            models.UniqueConstraint(fields=["alert", "channel", "attempt"], name="alertdelivery_once_per_attempt"),
        ]

    def __str__(self):
        return f"{self.channel} #{self.attempt} {'ok' if self.ok else 'failed'}"
