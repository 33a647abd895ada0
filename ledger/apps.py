import logging
import sys

from django.apps import AppConfig
from django.conf import settings

logger = logging.getLogger("surety")


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Ledger"

    def ready(self):
        from . import checks  # noqa: F401 (registers the system checks)

        # Said once per process, so whoever starts the app knows where work will run.
        if not settings.RQ_ASYNC and "test" not in sys.argv[1:2]:
            logger.warning(
                "Redis at %s does not answer: jobs run in-process (no background workers).",
                settings.REDIS_URL,
            )
