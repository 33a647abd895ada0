import random
from datetime import timedelta

from django.conf import settings

from . import clock


def backoff_until(attempt):
    """When attempt `attempt + 1` may start: exponential, capped, with "equal jitter"
    (half fixed, half random) so that retries of many failures do not arrive together."""
    ceiling = min(settings.BACKOFF_MAX_SECONDS, settings.BACKOFF_BASE_SECONDS * 2 ** max(attempt - 1, 0))
    return clock.now() + timedelta(seconds=ceiling / 2 + random.uniform(0, ceiling / 2))
