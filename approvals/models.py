from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.db.models import Q
from django.db.models.lookups import LessThanOrEqual
from django.utils import timezone

from ledger.audit import actor_label
from ledger.models import ActionType, AuditEvent
from ledger.statemachine import StateMachine

from .policies import money


def tier_addresses(tier):
    """A tier as the policy form stores it ("a@x.example, b@x.example") -> its addresses."""
    return [address.strip() for address in tier.split(",") if address.strip()]


def item_tiers(item):
    """`item`'s tiers as its limit named them when the item opened (`limit_snapshot`: like every
    policy change, a new tier applies to new actions): the first tier's addresses and the next
    tier's, either empty when the limit names none (the first tier's alerts go to the operations
    group then: dlq.alerts.group_emails). Read by every alert about the item (dlq.overdue,
    dlq.alerts.review_alert_second_approval)."""
    policy = item.limit_snapshot or {}
    return tier_addresses(policy.get("first_tier") or ""), tier_addresses(policy.get("next_tier") or "")


class Limit(models.Model):
    """Above `max_amount` a person approves; above `dual_approval_above`, two different people."""

    action_type = models.CharField(max_length=40, choices=ActionType.choices)
    currency = models.CharField(max_length=3)
    max_amount = models.DecimalField(max_digits=18, decimal_places=3)
    dual_approval_above = models.DecimalField(max_digits=18, decimal_places=3, null=True, blank=True)
    daily_customer_total = models.DecimalField(max_digits=18, decimal_places=3, null=True, blank=True)
    review_deadline_hours = models.PositiveIntegerField(default=4)
    # Who hears of an item past its review deadline (blank: ALERT_EMAILS), and who next if it
    # is still open `escalate_after_hours` after that deadline (blank: nobody more).
    first_tier = models.CharField(max_length=500, blank=True, default="",
                                  help_text="E-mail addresses alerted when a review item is overdue, comma-separated "
                                            "(blank: the operations group).")
    next_tier = models.CharField(max_length=500, blank=True, default="",
                                 help_text="E-mail addresses alerted when it is still open at the second deadline.")
    escalate_after_hours = models.PositiveIntegerField(
        null=True, blank=True, help_text="Hours after the review deadline; required with a next tier.")
    # An approval wait that nobody decides ends `expired` this many hours after it opened
    # (blank: it waits until someone does): never recorded as a person's rejection.
    approval_expires_after_hours = models.PositiveIntegerField(
        null=True, blank=True, help_text="Hours after which an approval nobody decided expires (blank: never).")
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)

    class Meta:
        ordering = ["action_type", "currency"]
        constraints = [
            models.UniqueConstraint(fields=["action_type", "currency"], name="limit_unique_type_currency"),
            models.CheckConstraint(condition=Q(max_amount__gte=0), name="limit_max_nonnegative"),
            models.CheckConstraint(
                condition=Q(dual_approval_above__isnull=True) | Q(dual_approval_above__gte=models.F("max_amount")),
                name="limit_dual_above_max",
            ),
            # What the policy form says to a person, held for every other writer too.
            models.CheckConstraint(
                condition=Q(daily_customer_total__isnull=True) | Q(daily_customer_total__gte=0),
                name="limit_daily_total_nonnegative",
            ),
            models.CheckConstraint(condition=Q(review_deadline_hours__gte=1, review_deadline_hours__lte=24 * 365),
                                   name="limit_deadline_an_hour_to_a_year"),
            models.CheckConstraint(condition=Q(approval_expires_after_hours__isnull=True)
                                   | Q(approval_expires_after_hours__gte=1, approval_expires_after_hours__lte=24 * 365),
                                   name="limit_expiry_an_hour_to_a_year"),
            # A next tier needs its deadline and a deadline needs someone to alert.
            models.CheckConstraint(
                condition=Q(next_tier="", escalate_after_hours__isnull=True)
                | (~Q(next_tier="") & Q(escalate_after_hours__isnull=False, escalate_after_hours__gte=1,
                                        escalate_after_hours__lte=24 * 365)),
                name="limit_next_tier_with_its_deadline",
            ),
        ]

    def __str__(self):
        return f"{self.action_type} {self.currency} ≤ {self.max_amount}"

    def snapshot(self):
        return {
            "max_amount": money(self.max_amount, self.currency),
            "dual_approval_above": None if self.dual_approval_above is None else money(self.dual_approval_above,
                                                                                      self.currency),
            "daily_customer_total": None if self.daily_customer_total is None else money(self.daily_customer_total,
                                                                                        self.currency),
            "review_deadline_hours": self.review_deadline_hours,
            "first_tier": self.first_tier,
            "next_tier": self.next_tier,
            "escalate_after_hours": self.escalate_after_hours,
            "approval_expires_after_hours": self.approval_expires_after_hours,
        }

    @classmethod
    def limit_set(cls, *, actor, action_type, currency, reason, preview=None, **values):
        """Create or change a limit; audited, and applies to actions requested from now on.
        Refused (ValueError) without a reason: a limit decides what happens to money.
        `preview`: the what-if shown before saving (approvals.whatif), kept in the event."""
        reason = reason.strip()
        if not reason:
            raise ValueError("a reason is required to change a limit")
        try:
            return cls._limit_set(actor, action_type, currency, reason, values, preview)
        except IntegrityError:
            # Two first saves of one limit at once: the other created it, so this one changes
            # it (any other refusal by the database comes back the same way and is raised).
            return cls._limit_set(actor, action_type, currency, reason, values, preview)

    @classmethod
    def _limit_set(cls, actor, action_type, currency, reason, values, preview=None):
        with transaction.atomic():
            limit = cls.objects.select_for_update().filter(action_type=action_type, currency=currency).first()
            before = limit.snapshot() if limit else None
            limit = limit or cls(action_type=action_type, currency=currency)
            for field, value in values.items():
                setattr(limit, field, value)
            limit.updated_at = timezone.now()
            limit.updated_by = actor if getattr(actor, "pk", None) and not hasattr(actor, "agent") else None
            limit.save()
            AuditEvent.objects.record(
                actor=actor, verb="limit_set", obj=limit, before=before,
                after={**limit.snapshot(), **({"preview": preview} if preview else {})}, reason=reason
            )
        return limit


class LimitsVersion(models.Model):
    """One row whose `version` grows with every change to the limits, by the database's own
    triggers (migration 0004): the key of each process's copy of the limits, read by the
    statement that authenticates an API request, so that the intake need not ask for them."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    version = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="limits_version_one_row")]


class ReviewStatus(models.TextChoices):
    OPEN = "open"
    APPROVED = "approved"
    REJECTED = "rejected"
    RESOLVED = "resolved"
    CLOSED = "closed"  # the action was settled elsewhere (a webhook, verification)
    EDITED = "edited"  # a person edited the action down: its new version has an item of its own
    EXPIRED = "expired"  # nobody decided before the limit's approval window ended


class ReviewKind(models.TextChoices):
    APPROVAL = "approval", "approval"
    HELD = "held", "held group"
    UNKNOWN_OUTCOME = "unknown_outcome", "unknown outcome"


R = ReviewStatus
REVIEW_TRANSITIONS = {
    R.OPEN: {R.APPROVED, R.REJECTED, R.RESOLVED, R.CLOSED, R.EDITED, R.EXPIRED},
    R.APPROVED: set(),
    R.REJECTED: set(),
    R.RESOLVED: {R.OPEN},  # only an unknown outcome sent back to verify that came back unproven
    R.CLOSED: {R.OPEN},  # only an approval a hold closed, waiting again with the approvals given (reviews)
    R.EDITED: set(),
    R.EXPIRED: set(),
}


class ReviewItem(StateMachine):
    """What waits for a person: one open item per action at a time, each with a deadline."""

    TRANSITIONS = REVIEW_TRANSITIONS
    AUDITED = ("decided_by_label",)

    kind = models.CharField(max_length=20, choices=ReviewKind.choices)
    action = models.ForeignKey("ledger.Action", on_delete=models.PROTECT, related_name="review_items")
    status = models.CharField(max_length=20, choices=ReviewStatus.choices, default=R.OPEN)
    why = models.TextField(blank=True, default="")
    approvals_needed = models.PositiveSmallIntegerField(default=1)
    limit_snapshot = models.JSONField(null=True, blank=True)
    deadline = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    decided_by_label = models.CharField(max_length=150, blank=True, default="")
    # The person who decided (none when the system closed it): four eyes check it against the
    # agent's owner, in the database too (approvals.dbrules).
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="+")
    # Whose authority the decider used when it was a delegate's (approvals.delegation): four eyes
    # hold for that person too.
    decided_for = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                    related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True, default="")
    overdue_alerted_at = models.DateTimeField(null=True, blank=True)
    # The second deadline (set with the first alert, from the limit's next tier) and when the
    # next tier was alerted (dlq.overdue).
    escalate_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    # When an approval nobody decided expires (the limit's approval_expires_after_hours; none: never).
    expires_at = models.DateTimeField(null=True, blank=True)
    # The fingerprint of the action's params the decider saw (approvals.decisions).
    decided_fingerprint = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["deadline", "id"]
        indexes = [
            models.Index(fields=["kind", "status", "deadline", "id"], name="review_queue_idx"),
            models.Index(fields=["status", "deadline"], name="review_overdue_idx"),
            models.Index(fields=["escalate_at"], condition=Q(status="open", escalated_at__isnull=True),
                         name="review_escalate_idx"),
            models.Index(fields=["expires_at"], condition=Q(status="open", expires_at__isnull=False),
                         name="review_expiry_idx"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["action"], condition=Q(status="open"), name="review_one_open_per_action"),
            models.CheckConstraint(condition=Q(status__in=ReviewStatus.values), name="review_status_valid"),
            models.CheckConstraint(condition=Q(kind__in=ReviewKind.values), name="review_kind_valid"),
            models.CheckConstraint(condition=Q(approvals_needed__in=[1, 2]), name="review_approvals_one_or_two"),
        ]

    def __str__(self):
        return f"{self.get_kind_display()} #{self.pk} ({self.action.operation_key})"

    def get_absolute_url(self):
        return f"/review/{self.pk}/"

    @property
    def is_overdue(self):
        return self.status == R.OPEN and self.deadline < timezone.now()

    @property
    def is_escalated(self):
        return self.status == R.OPEN and self.escalated_at is not None

    def _snapshot(self, changes=()):
        snap = super()._snapshot(changes)
        if self.decided_fingerprint:  # what the decider saw, in the decision's audit event
            snap["decided_fingerprint"] = self.decided_fingerprint
        if self.decided_for_id:
            snap["on_behalf_of"] = self.decided_for_label
        return snap

    @property
    def decided_for_label(self):
        """Whose authority a delegate decided with, labelled as the decision's audit event names
        them (`on_behalf_of`); "" for a decision on the decider's own."""
        return actor_label(self.decided_for) if self.decided_for_id else ""

    # A person's decisions (approvals.decisions), each on the params they saw (`fingerprint`);
    # `on_behalf_of`: the person whose authority a delegate used. `locked`: the caller has just
    # locked the item (a decision locks each row once).

    def approve(self, *, user, reason, fingerprint="", locked=False, on_behalf_of=None):
        return self._decided(R.APPROVED, user, "approve", reason, fingerprint, locked, on_behalf_of)

    def reject(self, *, user, reason, fingerprint="", locked=False, on_behalf_of=None):
        return self._decided(R.REJECTED, user, "reject", reason, fingerprint, locked, on_behalf_of)

    def resolve(self, *, user, verb, reason, fingerprint="", locked=False, on_behalf_of=None):
        """Settled by the person's decision `verb` (released, marked, sent back to verify)."""
        return self._decided(R.RESOLVED, user, verb, reason, fingerprint, locked, on_behalf_of)

    def edited(self, *, user, reason, fingerprint="", locked=False, on_behalf_of=None):
        """The person edited the action down: its new version has an item of its own."""
        return self._decided(R.EDITED, user, "edit", reason, fingerprint, locked, on_behalf_of)

    def _decided(self, outcome, user, verb, reason, fingerprint, locked, on_behalf_of):
        return self._move(outcome, actor=user, verb=verb, reason=reason, locked=locked,
                          decided_by_label=actor_label(user), decided_by=user, decided_for=on_behalf_of,
                          decided_at=timezone.now(), note=reason, decided_fingerprint=fingerprint)

    def expire(self, *, reason, locked=False):
        """Nobody decided in time (approvals.reviews.approval_expire_due)."""
        return self._move(R.EXPIRED, actor="system:approvals", verb="expired", reason=reason, locked=locked,
                          decided_at=timezone.now(), note=reason)

    def reopen(self, *, reason, deadline, expires_at=None):
        """The same item waits again (with a new deadline, and approval window), rather than a new
        one: an unknown outcome a person sent back to verify, that came back still unproven (`reason`
        is why it waits now), or an approval a hold closed after its first of two approvals, which
        stands (approvals.reviews; it waits for the same reason as before, and those it waits for
        are told again, as after the first approval: dlq.alerts.review_alert_when_second_awaited)."""
        why = self.why if self.kind == ReviewKind.APPROVAL else reason
        return self._move(R.OPEN, actor="system:reviews", verb="reopened", reason=reason, why=why,
                          deadline=deadline, expires_at=expires_at, decided_by=None, decided_for=None,
                          decided_by_label="", decided_at=None, note="", decided_fingerprint="",
                          overdue_alerted_at=None, escalate_at=None, escalated_at=None)

    def _refuse(self, to):
        if self.status == R.RESOLVED and to == R.OPEN and not self.sent_back_to_verify:
            return "only an unknown outcome sent back to verify opens again"
        if self.status == R.CLOSED and to == R.OPEN and self.kind != ReviewKind.APPROVAL:
            return "only an approval a hold closed opens again"
        return ""

    @property
    def sent_back_to_verify(self):
        """Resolved by a person's "verify again" (its last decision), not settled."""
        last = AuditEvent.objects.history(self).filter(verb__in=["verify", "mark_succeeded", "mark_failed"]).last()
        return (self.kind == ReviewKind.UNKNOWN_OUTCOME and self.status == R.RESOLVED and last is not None
                and last.verb == "verify")

    def close(self, *, reason):
        """The action no longer waits for a person in this way (approvals.reviews)."""
        return self._move(R.CLOSED, actor="system:reviews", verb="closed", reason=reason)


class Approval(models.Model):
    """One approver's yes on an item that needs two: the second must be someone else."""

    item = models.ForeignKey(ReviewItem, on_delete=models.CASCADE, related_name="approvals")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    reason = models.TextField(blank=True, default="")
    at = models.DateTimeField(default=timezone.now)
    # The fingerprint of the params this approver saw: two approvals count only for the same.
    fingerprint = models.CharField(max_length=64, blank=True, default="")
    # Whose authority a delegate approved with: that person's eyes too (approvals.dbrules).
    on_behalf_of = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["item", "user"], name="approval_once_per_user")]

    def __str__(self):
        return f"{self.user} approved {self.item_id}"


class SummaryDay(models.Model):
    """A UTC day of actions summarised for the what-if (approvals.summaries); `stale`: an action
    of that day changed since (the database marks it, approvals.dbrules.SUMMARY_STALE), so the
    what-if reads that day's rows until the sweeper summarises it again."""

    day = models.DateField(primary_key=True)
    stale = models.BooleanField(default=False)
    summarised_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return f"{self.day}{' (stale)' if self.stale else ''}"


class ActionSummary(models.Model):
    """The requests of one day, type and currency with one amount and one customer's total that
    day before them (`total_before`; 0 for a customer's first of the day): how many (`n`), and
    how many opened an approval item (`asked`). Where `total_before` is 0, `n_upto` and
    `asked_upto` count the same over the day's rows of total 0 up to this amount, so that a
    threshold's count is one look per day (approvals.summaries)."""

    day = models.ForeignKey(SummaryDay, on_delete=models.CASCADE, related_name="rows")
    action_type = models.CharField(max_length=40)
    currency = models.CharField(max_length=3)
    amount = models.DecimalField(max_digits=18, decimal_places=3, null=True)
    total_before = models.DecimalField(max_digits=18, decimal_places=3)
    n = models.PositiveIntegerField()
    asked = models.PositiveIntegerField()
    n_upto = models.PositiveIntegerField(default=0)
    asked_upto = models.PositiveIntegerField(default=0)

    class Meta:
        # Read by index alone (decision 39): a cut's running counts, one look per day, and the
        # rows with a total before them, a range per day.
        indexes = [models.Index(fields=["action_type", "currency", "day", "amount"], name="summary_first_idx",
                                include=["n_upto", "asked_upto", "n", "asked"], condition=Q(total_before=0)),
                   models.Index(fields=["action_type", "currency", "day"], name="summary_after_idx",
                                include=["amount", "total_before", "n", "asked"], condition=Q(total_before__gt=0))]

    def __str__(self):
        return f"{self.day_id} {self.action_type} {self.amount} {self.currency} after {self.total_before}: {self.n}"


class DecisionLink(models.Model):
    """A link in an alert's e-mail to one person, to decide one review item on the params they
    were shown (approvals.links). Only the SHA-256 of its token is kept: a copy of this table
    decides nothing. Used once (`used_at`, set by a conditional UPDATE in the decision's
    transaction), by its person alone, before `expires_at`."""

    digest = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="decision_links")
    item = models.ForeignKey(ReviewItem, on_delete=models.CASCADE, related_name="decision_links")
    fingerprint = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(expires_at__gt=models.F("created_at")),
                                              name="decisionlink_expires_after_creation")]

    def __str__(self):
        return f"link #{self.pk} for {self.user_id} on item {self.item_id}"


class DelegationQuerySet(models.QuerySet):
    def running(self, at=None):
        """In force at `at` (now), between two active people."""
        at = at or timezone.now()
        return self.filter(starts_at__lte=at, ends_at__gt=at, revoked_at__isnull=True,
                           person__is_active=True, delegate__is_active=True)


# A delegation covers an absence, not a standing second role (approvals.delegation).
DELEGATION_MAX_DAYS = 90


class Delegation(models.Model):
    """A person's review items offered to a delegate from `starts_at` to `ends_at`
    (approvals.delegation): while it runs, the delegate is mailed the person's alerts and may
    decide what the person may decide, on the person's behalf, with four eyes held for both.
    Ended early by `revoked_at`."""

    person = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="delegations_given")
    delegate = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                 related_name="delegations_taken")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    reason = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = DelegationQuerySet.as_manager()

    class Meta:
        ordering = ["-starts_at", "-id"]
        indexes = [models.Index(fields=["delegate", "ends_at"], name="delegation_taken_idx"),
                   models.Index(fields=["person", "ends_at"], name="delegation_given_idx")]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=models.F("starts_at")), name="delegation_ends_after_start"),
            models.CheckConstraint(condition=~Q(delegate=models.F("person")), name="delegation_not_to_oneself"),
            # As a length, not as `ends_at <= starts_at + 90 days`: adding days to a time depends on
            # the session's time zone (a day across a clock change is 23 or 25 hours), a length does not.
            models.CheckConstraint(
                condition=LessThanOrEqual(
                    models.ExpressionWrapper(models.F("ends_at") - models.F("starts_at"),
                                             output_field=models.DurationField()),
                    timedelta(days=DELEGATION_MAX_DAYS)),
                name="delegation_at_most_max_days"),
        ]

    def __str__(self):
        return f"{self.person} to {self.delegate}, {self.starts_at:%Y-%m-%d} to {self.ends_at:%Y-%m-%d}"
