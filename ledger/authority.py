"""Live authority: a grant's state, and the replay runs that decide whether it may be live.

A grant (django-guardian's permission to use an action type, ledger.grants) is `shadow` until
a person promotes it: the agent's actions are then recorded and fingerprinted but never
executed. A `Grant` row says whether and until when it is live; without one, past its review
date, or once its connector is no longer the one it was promoted against, it is shadow, so
falling back needs no job. A `ReplayRun` is one run of the
replay set against an action type's connector in its test mode (ledger.replay), kept with
every case's outcome and evidence.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone

from . import clock


class GrantState(models.TextChoices):
    SHADOW = "shadow"
    LIVE = "live"


class Grant(models.Model):
    """The authority of an agent's grant for one action type; the permission itself is guardian's."""

    agent = models.ForeignKey("ledger.Agent", on_delete=models.CASCADE, related_name="grant_states")
    capability = models.ForeignKey("ledger.Capability", on_delete=models.CASCADE, related_name="+")
    # Live until this review date, unless renewed; null: shadow.
    live_until = models.DateTimeField(null=True, blank=True)
    promoted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                    related_name="+")
    promoted_at = models.DateTimeField(null=True, blank=True)
    # The connector version it was promoted against (ledger.connectors.test_mode.connector_version):
    # live only while the connector is still that one. "": bound to none (promoted before versions
    # were kept, which its review date ends; or written straight to the table, as the demo seed does).
    connector_version = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent", "capability"], name="grant_unique_agent_capability"),
            models.CheckConstraint(
                condition=models.Q(live_until__isnull=True)
                | (models.Q(promoted_by__isnull=False) & models.Q(promoted_at__isnull=False)),
                name="grant_live_has_promoter",
            ),
        ]

    def __str__(self):
        return f"{self.agent_id}:{self.capability_id}"

    def state(self, version_now, now=None):
        """Live until its review date, while its connector's version (`version_now`) is the one it
        was promoted against: a changed connector passes the replay set again first. The review
        date is told by the database's clock (decision 57): on a host's own, a worker whose clock
        runs behind would act on the grant past it, and one ahead would hold it shadow early."""
        live = self.live_until and self.live_until > (now or clock.now())
        bound = not self.connector_version or self.connector_version == version_now
        return GrantState.LIVE if live and bound else GrantState.SHADOW


class ReplayRun(models.Model):
    """One run of the replay set against the connector serving `action_type`, in its test mode."""

    action_type = models.CharField(max_length=40)
    connector = models.CharField(max_length=50, blank=True, default="")
    connector_class = models.CharField(max_length=255, blank=True, default="")
    # The connector's options as configured, secrets masked.
    connector_options = models.JSONField(default=dict, blank=True)
    # ledger.replay.connector_version: what the gate compares with the connector as it is now.
    connector_version = models.CharField(max_length=64, blank=True, default="")
    ran_by = models.CharField(max_length=255)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Null while running; a run that stops midway (the connector is down) is False, never True.
    passed = models.BooleanField(null=True)
    # [{"case", "outcome": "passed" | "failed", "evidence": {...}}] in the order run.
    cases = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["action_type", "-started_at"], name="replayrun_recent_idx")]

    def __str__(self):
        return f"replay run {self.pk} of {self.action_type}"
