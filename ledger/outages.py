"""When the database goes away for a moment: a failover, a restarted pooler, an idle timeout.

Every connection dies at once, and for a few seconds new ones may be refused. What must
hold meanwhile: nothing half-written (the database rolls back the transaction it lost, whole),
no 500 (a request answers 503 with Retry-After, and the same request with the same key may
be sent again: it is recorded once), and no long-running process dying of it (a drain lane
closes its connection, waits and goes on; what it had claimed comes back when its lease
lapses, through the sweeper).

1. `database_unreachable(exc)`: an error that says the database could not be reached or
   dropped the connection, or did not answer in time (as opposed to a bug in a statement, or a
   statement the server refuses for what it holds, which stay errors).
2. `connection_lost(exc)`: of those, the ones where the connection itself is gone, so that a
   fresh one may try the same thing again (an intake, which is idempotent by key); and
   `rolled_back(exc)`: the ones where the database is there and rolled the transaction back to
   break a deadlock or a serialization failure, which is no outage. `waited_out(exc)`: what a
   long-running loop waits out (any error of the connection, and a lost one of any class).
3. `Outage`: the failures of one loop while the database (or, for the sweeper, Redis) is
   away, logged once per outage with what failed and once more when it answers again,
   instead of a traceback per row or pass; with a capped backoff.
4. `close_broken_connection()`: this thread's connection closed if it is unusable, so the
   next statement opens a fresh one (with CONN_HEALTH_CHECKS, a request's first statement
   checks a persistent connection the same way).
"""

import threading
import time

import psycopg
import redis
from django.db import Error, InterfaceError, OperationalError, close_old_connections

UNREACHABLE = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
# Redis is away too while it answers but refuses every write: full (maxmemory reached under
# noeviction: OutOfMemoryError), or a replica (after a failover demoted it: ReadOnlyError). Each
# passes as the failover or the operator's fix does. (Still loading its data, it answers LOADING,
# a BusyLoadingError, which redis-py counts as a ConnectionError.)
REDIS_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.OutOfMemoryError,
                     redis.exceptions.ReadOnlyError)
# What Retry-After says while the database is away: a failover or a restart takes seconds.
RETRY_AFTER_SECONDS = 2
# SQLSTATEs of a connection the server ended: class 08 (connection exception), and
# admin_shutdown (pg_terminate_backend, a fast shutdown), crash_shutdown, cannot_connect_now,
# idle_session_timeout, and idle_in_transaction_session_timeout (an InternalError to psycopg:
# told by its SQLSTATE, whatever its class).
_LOST_SQLSTATES = {"57P01", "57P02", "57P03", "57P05", "25P03"}
# deadlock_detected and serialization_failure: the database rolled the whole transaction back, and
# running it again may well go through.
ROLLED_BACK_SQLSTATES = {"40P01", "40001"}
# Besides a lost connection, what database_unreachable counts, as it always did: a transaction
# rolled back (above), a statement timeout (query_canceled), a lock timeout (lock_not_available).
# Sent again, the same request may well get through.
_AWAITED_SQLSTATES = ROLLED_BACK_SQLSTATES | {"57014", "55P03"}
BACKOFF_FIRST_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 2.0
# Failures further apart than this belong to two outages, each logged.
QUIET_SECONDS = 30.0


def database_unreachable(exc):
    """A lost connection, or a statement that did not get through in time. Not every
    OperationalError: one the server raises for what a statement holds (an index row past its
    size, SQLSTATE 54000) fails the same way each time, and a 503 would have it sent forever."""
    sqlstate = _sqlstate(exc)
    # Class 53, insufficient resources (too many connections, disk full, out of memory): the
    # server's state, not the statement's, which the same request may well get past later.
    return connection_lost(exc) or sqlstate in _AWAITED_SQLSTATES or (sqlstate or "").startswith("53")


def too_large(exc):
    """A statement the server refuses for what it holds (class 54, program_limit_exceeded: an
    index row past its size, too many values): the same request fails the same way each time."""
    return (_sqlstate(exc) or "").startswith("54")


def rolled_back(exc):
    """The database is there, and rolled the transaction back to break a deadlock (or a
    serialization failure): nothing of it was written, and it is no outage."""
    return _sqlstate(exc) in ROLLED_BACK_SQLSTATES


def connection_lost(exc):
    """The connection is gone (not a statement the server refused): psycopg raised without
    a SQLSTATE (the socket closed, nothing answered), or the server said it ended it."""
    if isinstance(exc, (InterfaceError, psycopg.InterfaceError)):
        return True
    if not isinstance(exc, (Error, psycopg.Error)):
        return False
    sqlstate = _sqlstate(exc)
    if sqlstate is None:
        return isinstance(exc, (OperationalError, psycopg.OperationalError))
    return sqlstate.startswith("08") or sqlstate in _LOST_SQLSTATES


def waited_out(exc):
    """Whether a long-running loop (a drain lane, the sweeper) waits `exc` out, as the database
    being away, rather than ending or taking it for a bug: an error of the connection
    (`UNREACHABLE`), or a connection the server ended whatever class psycopg gives it (an idle
    transaction's timeout, 25P03, is an InternalError)."""
    return isinstance(exc, UNREACHABLE) or connection_lost(exc)


def _sqlstate(exc):
    """The SQLSTATE of psycopg's error, or of the one Django's wraps; None if it has none."""
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    return getattr(cause, "sqlstate", None)


def close_broken_connection():
    """Close this thread's connections that failed and no longer answer (a healthy one that
    only saw a deadlock is kept). Never raises: closing a dead connection may fail too."""
    try:
        close_old_connections()
    except UNREACHABLE:
        pass


def first_line(exc):
    return (str(exc).strip().splitlines() or [""])[0]


class Outage:
    """One loop's view of the database (or Redis) being away, shared by the threads of a loop:
    its lock keeps the log to one line per thing that went away and one more when the loop
    works again. `failed(exc)` counts a failure, drops the broken connection (`reset_redis`
    does that for Redis, where the loop uses it) and says how long to wait before the next
    try, doubling from `first` up to `most`; `answered()` after a success ends the outage,
    logging how long it lasted. While one is `ongoing`, the sweeper's pass rings every doorbell:
    what came due meanwhile was never rung."""

    def __init__(self, what, logger, *, first=BACKOFF_FIRST_SECONDS, most=BACKOFF_MAX_SECONDS, reset_redis=None):
        self.what, self.logger = what, logger
        self.first, self.most, self.reset_redis = first, most, reset_redis
        self.since = None  # time.monotonic() of the outage's first failure
        self.last = None
        self.failures = 0
        self.away = []  # what went away ("the database", "Redis"), each logged once
        self._lock = threading.Lock()

    @property
    def ongoing(self):
        return self.since is not None

    def failed(self, exc):
        away = "Redis" if isinstance(exc, REDIS_UNREACHABLE) else "the database"
        now = time.monotonic()
        with self._lock:
            if self.since is not None and now - self.last > QUIET_SECONDS:
                self._end(self.last)
            if self.since is None:
                self.since, self.failures, self.away = now, 0, []
            if away not in self.away:
                self.away.append(away)
                self.logger.warning("%s: %s is unreachable (%s: %s); retrying until it answers",
                                    self.what, away, type(exc).__name__, first_line(exc))
            self.failures += 1
            self.last = now
            wait = min(self.first * 2 ** min(self.failures - 1, 16), self.most)
        if away == "Redis":
            if self.reset_redis is not None:
                self.reset_redis()
        else:
            close_broken_connection()
        return wait

    def answered(self):
        if self.since is None:  # the common case: no lock taken
            return
        with self._lock:
            if self.since is not None:
                self._end(time.monotonic())

    def _end(self, until):
        self.logger.warning("%s: back after %.1f s without %s (%d failed attempts)", self.what, until - self.since,
                            " and ".join(sorted(self.away)), self.failures)
        self.since = None
