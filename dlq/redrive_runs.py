"""A bulk redrive, kept: its dry run (what each selected entry would do), who ran it, why, at
what rate, when it started and ended, why it stopped, and what became of every entry.

The work itself is in `dlq/bulk.py`; these are the rows and their moves. A run's moves are
audited like every other status change. An item's outcome is written in the transaction of
the entry's own redrive or of the run's start or end, audited there; an outcome no such event
explains (a redrive refused, an entry someone else decided first) is audited on the item.
"""

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from ledger.audit import actor_label
from ledger.statemachine import CONDITIONAL, Machine, StateMachine


class RunStatus(models.TextChoices):
    PLANNED = "planned"  # the dry run: a list, nothing done
    RUNNING = "running"
    STOPPING = "stopping"  # a person asked it to stop: it stops before its next entry
    FINISHED = "finished"
    STOPPED = "stopped"


R = RunStatus
RUN_TRANSITIONS = {
    R.PLANNED: {R.RUNNING},
    R.RUNNING: {R.STOPPING, R.FINISHED, R.STOPPED},
    R.STOPPING: {R.STOPPED},
    R.FINISHED: set(),
    R.STOPPED: set(),
}
ACTIVE_STATUSES = (R.RUNNING, R.STOPPING)
# A dry run lists the queue as it was: past this age it is stale, and only a new one starts.
DRY_RUN_FRESH_FOR = timedelta(hours=1)


class Plan(models.TextChoices):
    """What a selected entry would do, as the dry run says it."""

    TASK_RESUME = "task_resume", "task resumes at its checkpoint"
    ACTION_RETRY = "action_retry", "action retried under the retry rule"
    ACTION_RETRY_BY_PERSON = "action_retry_by_person", "action retried on a person's word"
    SKIP = "skip", "skipped"


class Outcome(models.TextChoices):
    PLANNED = "planned"
    REDRIVEN = "redriven"
    SKIPPED = "skipped"
    FAILED = "failed"  # the redrive itself was refused (the entry stays as it was)
    LEFT_OPEN = "left_open"  # the run stopped before reaching it


O = Outcome
ITEM_TRANSITIONS = {O.PLANNED: {O.REDRIVEN, O.SKIPPED, O.FAILED, O.LEFT_OPEN}, O.REDRIVEN: set(),
                    O.SKIPPED: set(), O.FAILED: set(), O.LEFT_OPEN: set()}


class BulkRedrive(StateMachine):
    TRANSITIONS = RUN_TRANSITIONS
    AUDITED = ("rate", "ceiling", "stop_reason")

    status = models.CharField(max_length=20, choices=RunStatus.choices, default=R.PLANNED)
    # The queue's filters as given ({"workflow": ..., "code": ...}): the run's selection is
    # the open entries they match, oldest first, up to dlq.bulk.RUN_MAX.
    filters = models.JSONField(default=dict)
    planned_by = models.CharField(max_length=150)
    planned_at = models.DateTimeField(default=timezone.now)
    # The person whose redrive it is: the job acts as them (a permanent failure is retried
    # only on a person's word), and may not outlive their permission.
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="+")
    note = models.TextField(blank=True, default="")  # the person's reason for the run, as given
    # Entries per minute: what the person chose, never above `ceiling`, the strictest
    # redrive rate of the connectors the selection calls (settings.CONNECTOR_REDRIVE_RATES).
    rate = models.DecimalField(max_digits=8, decimal_places=2, null=True, blank=True)
    ceiling = models.DecimalField(max_digits=8, decimal_places=2)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-planned_at", "-id"]
        indexes = [models.Index(fields=["status"], name="bulkredrive_status_idx")]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="bulkredrive_status_valid"),
            models.CheckConstraint(condition=Q(rate__isnull=True) | Q(rate__gt=0, rate__lte=models.F("ceiling")),
                                   name="bulkredrive_rate_within_ceiling"),
            models.CheckConstraint(condition=Q(status="planned") | Q(started_by__isnull=False, rate__isnull=False,
                                                                      started_at__isnull=False),
                                   name="bulkredrive_started_says_who_and_how_fast"),
        ]

    def __str__(self):
        return f"bulk redrive #{self.pk}"

    def get_absolute_url(self):
        return f"/dlq/redrives/{self.pk}/"

    @property
    def stale(self):
        """A dry run too old to start: the queue it listed has moved on since."""
        return self.status == R.PLANNED and self.planned_at < timezone.now() - DRY_RUN_FRESH_FOR

    @property
    def seconds_apart(self):
        """The spacing of two redrives at the run's rate."""
        return 60 / float(self.rate)

    # `locked`: the caller has just locked the run (dlq.bulk looks at it under the lock first).

    def start(self, *, actor, reason, rate, ceiling, locked=False):
        return self._move(R.RUNNING, actor=actor, verb="bulk_redrive_started", reason=reason, locked=locked,
                          started_by=actor, rate=rate, ceiling=ceiling, started_at=timezone.now(), note=reason)

    def ask_to_stop(self, *, actor, reason, locked=False):
        return self._move(R.STOPPING, actor=actor, verb="bulk_redrive_stop_asked", reason=reason, locked=locked,
                          stop_reason=f"stopped by {actor_label(actor)}: {reason}")

    def stop(self, *, actor, stop_reason="", locked=False):
        """Ended before every entry was reached: by a person (the reason they gave when they
        asked) or by the run itself (`stop_reason`, e.g. a provider error spike)."""
        stop_reason = stop_reason or self.stop_reason
        return self._move(R.STOPPED, actor=actor, verb="bulk_redrive_stopped", reason=stop_reason, locked=locked,
                          finished_at=timezone.now(), stop_reason=stop_reason)

    def finish(self, *, actor, locked=False):
        return self._move(R.FINISHED, actor=actor, verb="bulk_redrive_finished", locked=locked,
                          finished_at=timezone.now())

    def counts(self):
        found = dict(self.items.values_list("outcome").annotate(n=models.Count("id")))
        return {outcome: found.get(outcome, 0) for outcome in Outcome.values}


class BulkRedriveItem(Machine, models.Model):
    """One selected entry of a run: what the dry run said it would do, and what it did."""

    STATUS_FIELD = "outcome"
    TRANSITIONS = ITEM_TRANSITIONS
    # A job that stalled with a stale copy must not overwrite what another wrote meanwhile.
    LOCKING = CONDITIONAL
    AUDITED = ()

    run = models.ForeignKey(BulkRedrive, on_delete=models.CASCADE, related_name="items")
    entry = models.ForeignKey("dlq.DeadLetter", on_delete=models.PROTECT, related_name="bulk_items")
    position = models.PositiveIntegerField()
    plan = models.CharField(max_length=30, choices=Plan.choices)
    plan_detail = models.CharField(max_length=500, blank=True, default="")
    outcome = models.CharField(max_length=20, choices=Outcome.choices, default=O.PLANNED)
    outcome_detail = models.TextField(blank=True, default="")
    redriven_at = models.DateTimeField(null=True, blank=True)
    # What the provider said of the redriven work afterwards, when it failed again there
    # (the run's error spike is counted from these).
    failed_again = models.TextField(blank=True, default="")
    failed_again_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "position"], name="bulkredriveitem_position_once"),
            models.UniqueConstraint(fields=["run", "entry"], name="bulkredriveitem_entry_once"),
            models.CheckConstraint(condition=Q(outcome__in=Outcome.values), name="bulkredriveitem_outcome_valid"),
            models.CheckConstraint(condition=Q(plan__in=Plan.values), name="bulkredriveitem_plan_valid"),
        ]

    def __str__(self):
        return f"{self.run}: entry #{self.entry_id} {self.outcome}"

    def settle(self, to, detail="", *, actor=None, **changes):
        """Its one move out of `planned` (ITEM_TRANSITIONS), inside the caller's transaction;
        with `actor`, audited on the item (the detail its reason).

        Written only if the row still holds the outcome this copy was checked against: a job
        that stalled with a stale copy must not overwrite what another wrote meanwhile (a
        `redriven` turned `skipped`); it is refused instead, and nothing changes."""
        detail = detail[:2000]
        return self._move(to, actor=actor, verb=f"bulk_redrive_item_{to}", reason=detail, outcome_detail=detail,
                          **changes)

    def _snapshot(self, changes=()):
        snap = super()._snapshot(changes)
        return {**snap, "entry": self.entry_id} if changes else snap  # what the move was about, in its event

    def note_failed_again(self, detail, at):
        """Observed after the redrive: appended once, never changed after."""
        BulkRedriveItem.objects.filter(pk=self.pk, failed_again="").update(failed_again=detail[:2000], failed_again_at=at)
        self.failed_again, self.failed_again_at = detail, at
