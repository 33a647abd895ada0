"""The clock leases and verification times are told by: the database's, not the host's.

A lease is written by the worker that claims (its end), and read by others: the sweeper, which
takes an action whose lease lapsed for verification, and the worker that claims a verification
once it is due. They often run on different hosts. On each host's own clock, a sweeper whose
clock runs ahead of a worker's by more than CONNECTOR_TIMEOUT + LEASE_MARGIN_SECONDS would take
an action whose call is still in flight, and a verifier whose clock runs ahead would look for an
effect before the provider could have recorded it; finding none, the action is tried again, and
a provider that ignores the idempotency key acts twice. Told by PostgreSQL's clock, every process
reads the same time, whatever its host's.

Reading the database's clock for every lease would cost a statement each: a process reads it
once a minute (`clock_timestamp()`), keeps its host's offset from it, and adds that offset to its
own clock. Hosts' clocks drift apart by milliseconds a minute, not seconds. On SQLite, which
has no server of its own, the host's clock is the database's.
"""

import threading
import time

from django.db import connection
from django.utils import timezone

# How often a process reads the database's clock again (seconds of its monotonic clock).
REFRESH_SECONDS = 60.0

_lock = threading.Lock()
_offset = None  # the database's clock minus this host's, as last read
_read_at = None  # time.monotonic() of that reading


def now():
    """The database's time now."""
    if connection.vendor != "postgresql":
        return timezone.now()
    return timezone.now() + offset()


def offset():
    """The database's clock minus this host's (a timedelta), read again once a minute."""
    global _offset, _read_at
    with _lock:
        if _offset is None or time.monotonic() - _read_at > REFRESH_SECONDS:
            with connection.cursor() as cursor:
                before = timezone.now()
                cursor.execute("SELECT clock_timestamp()")
                theirs = cursor.fetchone()[0]
                after = timezone.now()
            # The database read its clock somewhere in the round trip: its middle, at most half
            # a round trip off.
            _offset, _read_at = theirs - (before + (after - before) / 2), time.monotonic()
        return _offset


def forget():
    """Read the database's clock again at the next `now()` (a test that moves the host's)."""
    global _offset
    with _lock:
        _offset = None
