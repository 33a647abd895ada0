"""Taking turns, and leading: the transaction-scoped advisory locks, and the leases of work
that spans many transactions (the sweeper's steps, a bulk redrive's run).

Advisory locks (PostgreSQL; SQLite's IMMEDIATE transactions serialise writers anyway): each use
has its own number under one class, so that no two uses share a key by accident. (The
subjects' locks, taken by `ledger_lock_subjects` in ledger/dbrules.py, use the one-key form: a
key space of their own.)

Leases (`StepLease`, one row per piece of work, named by it): a lock that outlives a transaction,
for work that spans many (see ledger.sweeper for why the steps need one; dlq.bulk for a bulk
redrive's run, worked by one job at a time). A holder leads the work while its row names it and
has not expired; it renews the lease each time it goes on, and another takes it once it lapses
(or is handed it by the holder). Times are the database's clock, so hosts whose clocks differ
agree on who leads.
"""

from django.db import connection, models

CLASS = 361478
AUDIT_SEAL = 1  # ledger.audit: one sealer at a time extends the hash chain
BULK_REDRIVE_START = 2  # dlq.bulk: one start at a time looks for runs over the same connectors
ARCHIVE_RUN = 3  # dlq.archive: one run at a time (webhook and audit events are taken without a row lock)
NO_CUSTOMER_TOTAL = 4  # approvals.intake: the requests naming no customer share a daily total, summed in turn
PARTITIONS_MADE = 5  # ledger.partitions: one pass at a time makes the next partitions (a sweeper's, migrate's)


def take_turns(lock):
    """Wait for `lock` (one of the numbers above) until the current transaction ends."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [CLASS, lock])


class StepLease(models.Model):
    """Who leads a sweeper step (or other leased work, `step` naming it), until when, and how
    often it was taken or renewed (`runs`, `ran_at`: the last time its leader went on)."""

    step = models.CharField(max_length=100, primary_key=True)
    holder = models.CharField(max_length=200)
    expires_at = models.DateTimeField()
    ran_at = models.DateTimeField()
    runs = models.BigIntegerField(default=0)

    class Meta:
        db_table = "ledger_step_lease"

    def __str__(self):
        return f"{self.step} led by {self.holder} until {self.expires_at:%H:%M:%S}"


# One statement takes, renews, hands over or refuses the lease, so that two holders at once
# cannot both take it: the conflicting insert locks the row and re-reads it before its
# condition (and holds that lock until its transaction ends).
_LEAD = f"""
INSERT INTO {StepLease._meta.db_table} AS lease (step, holder, expires_at, ran_at, runs)
VALUES (%(step)s, %(holder)s, now() + make_interval(secs => %(seconds)s), now(), 1)
ON CONFLICT (step) DO UPDATE
   SET holder = excluded.holder, expires_at = excluded.expires_at, ran_at = excluded.ran_at, runs = lease.runs + 1
 WHERE lease.holder IN (excluded.holder, %(handed_by)s) OR lease.expires_at < now()
RETURNING runs
"""


def lead(step, holder, seconds, *, handed_by=None):
    """Whether `holder` leads `step` for the next `seconds` (taking or renewing its lease, and
    counting a run); False while another holder's lease lasts. `handed_by`: the holder passing
    the lease on to `holder` (refused if that one no longer holds it). Outside PostgreSQL there
    is one process and nothing to elect: always True."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute(_LEAD, {"step": step, "holder": holder, "seconds": seconds, "handed_by": handed_by})
        return cursor.fetchone() is not None


def let_go(step, *, holder=None):
    """The lease of `step` goes (its work is over, or waits for whoever takes it next); with a
    `holder`, only while that one holds it."""
    leases = StepLease.objects.filter(step=step)
    (leases if holder is None else leases.filter(holder=holder)).delete()
