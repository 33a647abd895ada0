"""The dead-letter queue's figures for /metrics (see ledger.metrics), read at scrape time."""

from prometheus_client.core import GaugeMetricFamily

from .incidents import Incident, IncidentStatus
from .models import DeadLetter, EntryStatus


class DeadLetterCollector:
    def collect(self):
        # Exact: cheap through deadletter_queue_idx, and a scrape comes every 15-60 s (decision 38).
        yield GaugeMetricFamily("surety_deadletter_entries_open", "Open dead-letter entries.",
                                value=DeadLetter.objects.filter(status=EntryStatus.OPEN).count())
        # Exact too, through incident_queue_idx: what reconciliation found waits for people as well.
        yield GaugeMetricFamily("surety_incidents_open", "Open reconciliation incidents.",
                                value=Incident.objects.filter(status=IncidentStatus.OPEN).count())
