"""The partitioned tables: ranges of id, made ahead of the rows and dropped once archived.

On PostgreSQL the audit trail (`ledger_auditevent`, migration 0032) and the webhook events
(`ledger_webhookevent`, migration 0033) are partitioned by ranges of their id, and the id grows
with time, so each partition holds a stretch of time. Each ranged partition holds
PARTITION_EVENTS ids. `partitions_extend` makes them ahead of the sequences: the one being
written and the next whole one exist at all times, so a table's default partition, which takes
any id above the ranges made so far, stays empty unless the sweeper stopped for that long. It
runs after every `migrate` and as a sweeper step. Once the ids are past the ranges, the next one
starts HEADROOM ids above them, so that no writer reaches it before it is attached. The archive
(dlq.archive) drops a partition whose every row it has archived instead of deleting them one by
one: the space comes back at once, with no vacuum and no index bloat. SQLite keeps plain tables:
there is nothing to do.
"""

import bisect
import logging
import re
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from psycopg import errors

from .locks import PARTITIONS_MADE, take_turns

logger = logging.getLogger("surety.sweeper")

_BOUND = re.compile(r"FOR VALUES FROM \((MINVALUE|'?(\d+)'?)\) TO \('?(\d+)'?\)")
# How long a partition's DDL waits for a reader of the table before it gives up (the next pass
# tries again). While a drop waits for the parent's lock, every insert into the table waits
# behind it (every audited write inserts into the audit trail): this bounds that stall
# (`python -m bench partitioned_writes`: 2 s with "2s", 0.2 s with this; decision 55).
DDL_LOCK_TIMEOUT = "200ms"
# How many ids the writers may take while a pass makes its partitions: from its read of the
# sequence until its commit, a few statements that each wait at most DDL_LOCK_TIMEOUT for a lock
# (while the ATTACH holds the default partition, an insert bound for it takes its id, then waits).
# Once the ids are past the ranges, a new range starts this far above them. An id of it that the
# default took before the ATTACH makes the ATTACH fail; one taken by an insert that began before
# the commit makes the insert fail (routed to the default, whose bounds changed under it).
# 100,000 ids are 200 ms at 500,000 a second, some 200 times the most the intake wrote here
# (2,100 events a second, decision 52).
HEADROOM = 100_000


@dataclass(frozen=True)
class Partition:
    name: str
    low: int | None  # None: from MINVALUE (the table as it was before partitioning)
    high: int


def busy(exc):
    """Whether an OperationalError is DDL_LOCK_TIMEOUT's: the parent stayed busy."""
    return isinstance(exc.__cause__, errors.LockNotAvailable)


def overtaken(exc):
    """Whether an IntegrityError is an ATTACH's that found a row of the new range in the default
    partition: the writers reached the range while it was made."""
    return isinstance(exc.__cause__, errors.CheckViolation)


@dataclass(frozen=True)
class Partitioned:
    """A table partitioned by ranges of its id (on PostgreSQL, once its migration has run)."""

    table: str

    @property
    def default(self):
        return f"{self.table}_default"

    def active(self):
        if connection.vendor != "postgresql":
            return False
        with connection.cursor() as cursor:
            cursor.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)", [self.table])
            row = cursor.fetchone()
        return bool(row and row[0])

    def ranges(self):
        """The ranged partitions, lowest first (not the default one)."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
                           "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass", [self.table])
            rows = cursor.fetchall()
        found = []
        for name, bound in rows:
            match = _BOUND.fullmatch(bound)
            if match:
                found.append(Partition(name, None if match[1] == "MINVALUE" else int(match[2]), int(match[3])))
        return sorted(found, key=lambda p: p.high)

    def table_of(self):
        """A function from a row's id to the table that holds it (the parent if not partitioned)."""
        if not self.active():
            return lambda pk: self.table
        held = self.ranges()
        highs = [p.high for p in held]

        def table(pk):
            i = bisect.bisect_right(highs, pk)
            return held[i].name if i < len(held) and (held[i].low is None or held[i].low <= pk) else self.default

        return table

    def extend(self, size):
        """Make the partitions the sequence will reach next: up to one whole partition past the
        next id (and HEADROOM, once the ids are past the ranges). Returns how many it made (0 if not
        partitioned, or if the table stayed busy, or if the writers overtook it: the next pass
        tries again, from further on)."""
        if not self.active():
            return 0
        try:
            return self._extend(size)
        except OperationalError as exc:
            if not busy(exc):
                raise
            logger.info("%s stayed busy past %s: its next partition waits for the next pass", self.table,
                        DDL_LOCK_TIMEOUT)
        except IntegrityError as exc:
            if not overtaken(exc):
                raise
            logger.warning("%s: ids of its next partition were written while it was made: the next pass starts "
                           "above them", self.table)
        return 0

    def _extend(self, size):
        made = 0
        with transaction.atomic(), connection.cursor() as cursor:
            # Two passes at once (one that outlasted its step's lease and the next leader's, or
            # migrate's beside a sweeper's) would read the same ranges and make the same next one:
            # the later CREATE TABLE failed and ended its sweeper. The second waits for the first's
            # commit, with no lock_timeout (the first's own statements are bounded by it), and then
            # reads the ranges it made.
            take_turns(PARTITIONS_MADE)
            cursor.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
            cursor.execute(f"SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM {self.table}_id_seq")
            # 0: no range left (the archive dropped every one the ids had passed).
            next_id, end = cursor.fetchone()[0], max((p.high for p in self.ranges()), default=0)
            # Past the ranges' end (the sweeper was away), the default partition takes the ids: the
            # writers are writing where the next range would start. It starts HEADROOM above them
            # instead, and the ids in between stay in the default with the others it took.
            reach = next_id + HEADROOM if next_id > end else next_id
            low = max(end, reach)
            while low <= reach + size:
                # Made apart, then attached: ATTACH takes a lock on the parent that inserts do not
                # wait for, where CREATE TABLE ... PARTITION OF takes one they queue behind.
                cursor.execute(f"CREATE TABLE {self.table}_{low} (LIKE {self.table} INCLUDING DEFAULTS "
                               "INCLUDING CONSTRAINTS)")
                cursor.execute(f"ALTER TABLE {self.table} ATTACH PARTITION {self.table}_{low} "
                               f"FOR VALUES FROM ({low}) TO ({low + size})")
                low, made = low + size, made + 1
        return made

    def passed(self):
        """The ranged partitions the ids have gone past, lowest first: no row will be written
        into them any more ([] if the table is not partitioned)."""
        if not self.active():
            return []
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT last_value FROM {self.table}_id_seq")
            written = cursor.fetchone()[0]
        return [partition for partition in self.ranges() if partition.high <= written]

    def droppable(self, keep, params):
        """The passed partitions, lowest first, up to the first that holds a row matching `keep`
        (SQL over the partition's columns, with `params`)."""
        found = []
        with connection.cursor() as cursor:
            for partition in self.passed():
                cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {partition.name} WHERE {keep})", params)
                if cursor.fetchone()[0]:
                    break
                found.append(partition)
        return found

    def drop(self, partitions):
        """Drop archived partitions, lowest first, in the caller's transaction (the archive's),
        which should commit soon: a drop holds the parent until then. One the parent is too busy
        for (DDL_LOCK_TIMEOUT) stops the drops: its rows, and those after it, are the caller's
        to delete. Returns the partitions dropped."""
        dropped = []
        for partition in partitions:
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
                    cursor.execute(f"DROP TABLE {partition.name}")
                    cursor.execute("RESET lock_timeout")
            except OperationalError as exc:
                if not busy(exc):
                    raise
                break
            dropped.append(partition)
        return dropped


AUDIT = Partitioned("ledger_auditevent")
WEBHOOKS = Partitioned("ledger_webhookevent")


def partitions_extend():
    """The sweeper's step (and `migrate`'s): both tables' next partitions."""
    return sum(table.extend(settings.PARTITION_EVENTS) for table in (AUDIT, WEBHOOKS))
