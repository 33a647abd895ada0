from django.apps import AppConfig


class DlqConfig(AppConfig):
    name = "dlq"
    verbose_name = "Dead-letter queue"

    def ready(self):
        from approvals.models import ReviewItem
        from ledger import hooks
        from ledger.models import Action, Task

        from .alerts import review_alert_when_second_awaited
        from .models import deadletter_open_when_failed_for_good, deadletter_open_when_task_gives_up, task_redrivable
        from .reconcile import incident_open_for_failed_effect

        # Never silent: a task out of attempts or failed for good, and a standalone action that
        # failed for good, gets its entry and alert in the same transaction.
        hooks.on_move(Task, deadletter_open_when_task_gives_up)
        hooks.on_move(Action, deadletter_open_when_failed_for_good)
        # A stopped task's action fails for good unless a person may still redrive the task.
        hooks.set_redrivable(task_redrivable)
        # The provider failed an effect the ledger recorded as made: an incident for a person.
        hooks.set_effect_failed(incident_open_for_failed_effect)
        # An approval item waiting for a second approval, whoever gave the first: those it waits for are mailed.
        hooks.on_move(ReviewItem, review_alert_when_second_awaited)
