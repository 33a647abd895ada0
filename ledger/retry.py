import random
from datetime import timedelta

from django.conf import settings

from . import clock


def backoff_until(attempt, *, wait=None):
    """When attempt `attempt + 1` may start: exponential, capped, with "equal jitter"
    (half fixed, half random) so that retries of many failures do not arrive together.

    `wait`: the seconds the provider asked for first (a rate limit's Retry-After). The backoff is
    counted from its end: never sooner than the provider said, and the actions one limit stopped
    together do not all come back in the instant it lifts."""
    ceiling = min(settings.BACKOFF_MAX_SECONDS, settings.BACKOFF_BASE_SECONDS * 2 ** max(attempt - 1, 0))
    return clock.now() + timedelta(seconds=(wait or 0) + ceiling / 2 + random.uniform(0, ceiling / 2))
