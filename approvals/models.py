from django.conf import settings
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from ledger.models import ActionType, AuditEvent


class Limit(models.Model):
    """Above `max_amount` a person approves; above `dual_approval_above`, two different people."""

    action_type = models.CharField(max_length=40, choices=ActionType.choices)
    currency = models.CharField(max_length=3)
    max_amount = models.DecimalField(max_digits=18, decimal_places=3)
    dual_approval_above = models.DecimalField(max_digits=18, decimal_places=3, null=True, blank=True)
    daily_customer_total = models.DecimalField(max_digits=18, decimal_places=3, null=True, blank=True)
    review_deadline_hours = models.PositiveIntegerField(default=4)
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
        ]

    def __str__(self):
        return f"{self.action_type} {self.currency} ≤ {self.max_amount}"

    def snapshot(self):
        return {
            "max_amount": str(self.max_amount),
            "dual_approval_above": None if self.dual_approval_above is None else str(self.dual_approval_above),
            "daily_customer_total": None if self.daily_customer_total is None else str(self.daily_customer_total),
            "review_deadline_hours": self.review_deadline_hours,
        }

    @classmethod
    def limit_set(cls, *, actor, action_type, currency, reason="", **values):
        """Create or change a limit; audited, and applies to actions requested from now on."""
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
                actor=actor, verb="limit_set", obj=limit, before=before, after=limit.snapshot(), reason=reason
            )
        return limit
