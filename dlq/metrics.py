"""The dead-letter queue's figures for /metrics (see ledger.metrics), read at scrape time."""

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from .incidents import Incident, IncidentStatus
from .models import Alert, DeadLetter, EntryStatus


class DeadLetterCollector:
    def collect(self):
        # Exact: cheap through deadletter_queue_idx, and a scrape comes every 15-60 s (decision 38).
        yield GaugeMetricFamily("surety_deadletter_entries_open", "Open dead-letter entries.",
                                value=DeadLetter.objects.filter(status=EntryStatus.OPEN).count())
        # Exact too, through incident_queue_idx: what reconciliation found waits for people as well.
        yield GaugeMetricFamily("surety_incidents_open", "Open reconciliation incidents.",
                                value=Incident.objects.filter(status=IncidentStatus.OPEN).count())
        # Alerts not yet delivered on every channel, and how long the oldest has waited: a
        # receiver that is down or refuses them, or no channel set, is otherwise seen only on each
        # alert's page. One statement through alert_undelivered_idx (delivered_at, created_at).
        undelivered = Alert.objects.filter(delivered_at__isnull=True).aggregate(n=Count("id"), oldest=Min("created_at"))
        yield GaugeMetricFamily("surety_alerts_undelivered", "Alerts not yet delivered on every channel.",
                                value=undelivered["n"])
        waited = (timezone.now() - undelivered["oldest"]).total_seconds() if undelivered["oldest"] else 0
        yield GaugeMetricFamily("surety_alerts_undelivered_oldest_seconds",
                                "Seconds since the oldest undelivered alert was raised (0: none).",
                                value=max(waited, 0))
