import logging
import sys

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_migrate

logger = logging.getLogger("surety")


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Ledger"

    def ready(self):
        from . import checks  # noqa: F401 (registers the system checks)
        from .actions import action_ring_when_due, booking_follow_action, held_release_when_settled
        from .hooks import on_move
        from .models import Action, Task
        from .tasks import task_follow_action, task_ring_when_queued
        from .webhooks import failure_told_when_succeeded

        # The ledger's own reactions come first: a move rings the drains, a booking's slot
        # follows its action, a task waiting on an action wakes when it is decided, a
        # settled action lets go of what it held, and a success whose effect the provider
        # failed already tells a person.
        on_move(Action, action_ring_when_due)
        on_move(Action, booking_follow_action)
        on_move(Action, task_follow_action)
        on_move(Action, held_release_when_settled)
        on_move(Action, failure_told_when_succeeded)
        on_move(Task, task_ring_when_queued)
        # The partitioned tables' next partitions exist as soon as the tables do (the sweeper
        # keeps them ahead from then on).
        post_migrate.connect(_partitions, sender=self)
        # Said once per process, so whoever starts the app knows where work will run.
        if not settings.RQ_ASYNC and "test" not in sys.argv[1:2]:
            logger.warning(
                "Redis at %s does not answer: jobs run in-process (no background workers).",
                settings.REDIS_URL,
            )


def _partitions(**kwargs):
    from .partitions import partitions_extend

    partitions_extend()
