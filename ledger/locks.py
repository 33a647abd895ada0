"""The transaction-scoped advisory locks that work takes turns on (PostgreSQL; SQLite's IMMEDIATE
transactions serialise writers anyway). Each use has its own number under one class, so that no
two uses share a key by accident. (The subjects' locks, taken by `ledger_lock_subjects` in
ledger/dbrules.py, use the one-key form: a key space of their own.)"""

from django.db import connection

CLASS = 361478
AUDIT_SEAL = 1  # ledger.audit: one sealer at a time extends the hash chain
BULK_REDRIVE_START = 2  # dlq.bulk: one start at a time looks for runs over the same connectors


def take_turns(lock):
    """Wait for `lock` (one of the numbers above) until the current transaction ends."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [CLASS, lock])
