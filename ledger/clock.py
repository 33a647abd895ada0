"""The clock leases, verification and due times are told by: the database's, not the host's.

A lease is written by the worker that claims (its end), and read by others: the sweeper, which
takes an action whose lease lapsed for verification, and the worker that claims a verification
once it is due. They often run on different hosts. On each host's own clock, a sweeper whose
clock runs ahead of a worker's by more than CONNECTOR_TIMEOUT + LEASE_MARGIN_SECONDS would take
an action whose call is still in flight, and a verifier whose clock runs ahead would look for an
effect before the provider could have recorded it; finding none, the action is tried again, and
a provider that ignores the idempotency key acts twice. Told by PostgreSQL's clock, every process
reads the same time, whatever its host's. When work is due is written on it too: the claim reads
it, and what a host ahead recorded as due now would not be due yet for the drain its commit rang.

Reading the database's clock for every lease would cost a statement each: a process reads it
once a minute (`clock_timestamp()`, taken as read at the middle of the round trip, so at most
half a round trip off) and counts on from it by its monotonic clock, which a step of the host's
clock (NTP correcting it) does not move; when the two disagree about the time since the reading
(a step, or a pause the monotonic clock did not count), it reads again at once. The monotonic
clock drifts from the database's by the host's oscillator, parts per million: milliseconds a
minute. On
SQLite, which has no server of its own, the host's clock is the database's.
"""

import time
from datetime import timedelta

from django.db import connection
from django.utils import timezone

# How often a process reads the database's clock again (seconds of its monotonic clock).
REFRESH_SECONDS = 60.0
# How far the host's wall clock and its monotonic clock may disagree about the time since the
# reading before it is taken again.
DISAGREEMENT_SECONDS = 0.5

_reading = None  # (the database's time, time.monotonic(), time.time()) at the last reading


def now():
    """The database's time now."""
    if connection.vendor != "postgresql":
        return timezone.now()
    theirs, at, _ = reading()
    return theirs + timedelta(seconds=time.monotonic() - at)


def reading():
    """The database's time at a moment of this process's monotonic clock (and its wall clock's
    then), read again once a minute, and at once if the two clocks disagree since.

    A thread that finds it stale reads it on its own connection, holding no lock: one whose round
    trip hangs (a connection the network lost) keeps no other thread waiting. Threads that find it
    stale at once each read it, and the last one's stays; the reading is one tuple, replaced whole."""
    global _reading
    taken = _reading
    if taken is None or _stale(taken):
        with connection.cursor() as cursor:
            before, wall = time.monotonic(), time.time()
            cursor.execute("SELECT clock_timestamp()")
            theirs = cursor.fetchone()[0]
            after = time.monotonic()
        taken = _reading = (theirs, (before + after) / 2, wall + (after - before) / 2)
    return taken


def _stale(taken):
    since = time.monotonic() - taken[1]
    # A wall clock stepped since, or a pause the monotonic clock did not count (a VM resumed):
    # one of the two is wrong about the time since, and the database says which.
    return since > REFRESH_SECONDS or abs((time.time() - taken[2]) - since) > DISAGREEMENT_SECONDS


def forget():
    """Read the database's clock again at the next `now()` (a test that moves the host's)."""
    global _reading
    _reading = None
