from django.apps import AppConfig


class DlqConfig(AppConfig):
    name = "dlq"
    verbose_name = "Dead-letter queue"

    def ready(self):
        from ledger import hooks
        from ledger.metrics import register_collector
        from ledger.models import Action, Task

        from .alerts import alerts_redeliver_stale
        from .bulk import bulk_redrives_resume
        from .evidence import DeadLettersEvidenceSerializer, deadletters_evidence
        from .incident_views import incident_card
        from .metrics import DeadLetterCollector
        from .models import deadletter_open_when_failed_for_good, deadletter_open_when_task_gives_up
        from .overdue import review_alert_overdue
        from .reconcile import reconcile_schedule
        from .views import deadletter_card

        # Never silent: a task out of attempts or failed for good, and a standalone action that
        # failed for good, gets its entry and alert in the same transaction; overdue review items,
        # undelivered alerts and bulk redrives whose job was lost are looked at every pass, and the
        # ledger is compared with the providers' records every few minutes.
        hooks.on_move(Task, deadletter_open_when_task_gives_up)
        hooks.on_move(Action, deadletter_open_when_failed_for_good)
        hooks.on_sweep("reviews_overdue", review_alert_overdue)
        hooks.on_sweep("alerts_redelivered", alerts_redeliver_stale)
        hooks.on_sweep("reconciliations_started", reconcile_schedule)
        hooks.on_sweep("bulk_redrives_resumed", bulk_redrives_resume)
        hooks.on_overview(deadletter_card)
        hooks.on_overview(incident_card)
        hooks.on_evidence("dead_letters", deadletters_evidence, schema=DeadLettersEvidenceSerializer,
                          template="ledger/evidence_dead_letters.html")
        register_collector(DeadLetterCollector())
