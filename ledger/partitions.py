"""The audit trail's partitions: ranges of id, made ahead of the events and dropped once archived.

On PostgreSQL `ledger_auditevent` is partitioned by ranges of its id (migration 0032), and the id
grows with time, so each partition holds a stretch of time. Each ranged partition holds
AUDIT_PARTITION_EVENTS ids. `audit_partitions_extend` makes them ahead of the sequence: the one
being written and the next whole one exist at all times, so the default partition, which takes
any id above the ranges made so far, stays empty unless the sweeper stopped for that long. It
runs after
every `migrate` and as a sweeper step. The archive (dlq.archive) drops a partition whose every
event it has archived instead of deleting them row by row: the space comes back at once, with
no vacuum and no index bloat. SQLite keeps one table: there is nothing to do.
"""

import bisect
import logging
import re
from dataclasses import dataclass

from django.conf import settings
from django.db import OperationalError, connection, transaction
from psycopg import errors

logger = logging.getLogger("surety.sweeper")

PARENT = "ledger_auditevent"
DEFAULT = f"{PARENT}_default"
_BOUND = re.compile(r"FOR VALUES FROM \((MINVALUE|'?(\d+)'?)\) TO \('?(\d+)'?\)")
# A partition's DDL locks the parent for a moment; waiting longer than this behind a long reader
# would queue every insert of the audit trail behind the DDL. The next pass tries again.
DDL_LOCK_TIMEOUT = "2s"


@dataclass(frozen=True)
class Partition:
    name: str
    low: int | None  # None: from MINVALUE (the table as it was before partitioning)
    high: int


def partitioned():
    """Whether the audit trail is partitioned: on PostgreSQL, once migration 0032 has run."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)", [PARENT])
        row = cursor.fetchone()
    return bool(row and row[0])


def ranges():
    """The ranged partitions, lowest first (not the default one)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
                       "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass", [PARENT])
        rows = cursor.fetchall()
    found = []
    for name, bound in rows:
        match = _BOUND.fullmatch(bound)
        if match:
            found.append(Partition(name, None if match[1] == "MINVALUE" else int(match[2]), int(match[3])))
    return sorted(found, key=lambda p: p.high)


def table_of():
    """A function from an event's id to the table that holds it (the parent on SQLite)."""
    if not partitioned():
        return lambda pk: PARENT
    held = ranges()
    highs = [p.high for p in held]

    def table(pk):
        i = bisect.bisect_right(highs, pk)
        return held[i].name if i < len(held) and (held[i].low is None or held[i].low <= pk) else DEFAULT

    return table


def audit_partitions_extend():
    """Make the partitions the sequence will reach next: up to one whole partition past the
    next id. Returns how many it made (0 on SQLite)."""
    if not partitioned():
        return 0
    try:
        return _extend(settings.AUDIT_PARTITION_EVENTS)
    except OperationalError as exc:
        if not busy(exc):
            raise
        logger.info("the audit trail stayed busy past %s: its next partition waits for the next pass", DDL_LOCK_TIMEOUT)
        return 0


def _extend(size):
    made = 0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
        cursor.execute("SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM ledger_auditevent_id_seq")
        next_id = cursor.fetchone()[0]
        # Ids the default partition took (the sweeper was away) stay there: a range must not
        # hold a row of the default's.
        cursor.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {DEFAULT}")
        low = max([p.high for p in ranges()] + [cursor.fetchone()[0]])
        while low <= next_id + size:
            cursor.execute(f"CREATE TABLE {PARENT}_{low} PARTITION OF {PARENT} FOR VALUES FROM ({low}) TO ({low + size})")
            low, made = low + size, made + 1
    return made


def droppable(through_seq):
    """The ranged partitions below the next id whose every event is sealed and before
    `through_seq` (so an archive that takes the events before it takes all of theirs), lowest first."""
    if not partitioned():
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_value FROM ledger_auditevent_id_seq")
        written = cursor.fetchone()[0]
        found = []
        for partition in ranges():
            if partition.high > written:
                break
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {partition.name} WHERE seq IS NULL OR seq >= %s)",
                           [through_seq])
            if cursor.fetchone()[0]:
                break
            found.append(partition)
    return found


def busy(exc):
    """Whether an OperationalError is DDL_LOCK_TIMEOUT's: the parent stayed busy."""
    return isinstance(exc.__cause__, errors.LockNotAvailable)


def drop(partition):
    """Drop an archived partition, in the caller's transaction (the archive's), which should
    commit soon: the drop holds the parent until then. Raises OperationalError (`busy`) if the
    parent stays busy past DDL_LOCK_TIMEOUT."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
        cursor.execute(f"DROP TABLE {partition.name}")
        cursor.execute("RESET lock_timeout")
