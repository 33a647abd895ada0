"""The scale databases of `python -m bench scale`: 1M actions, and the same grown to 10M, loaded once and kept.

`surety_scale_1m`: migrated and loaded by `seed_volume --seed 1` (1M actions over 90 days, 100k
dead-letter entries; the shape bench pages measures on). `surety_scale`: a copy of it (CREATE
DATABASE ... TEMPLATE, a file copy) grown to 10M actions in SQL: every seeded action is copied
nine times (`INSERT ... SELECT` over `generate_series`, one statement per slice of the seed, in
time order so that ids still grow with time within the copies), each copy with a customer,
target, decision and key of its own, so a copy is another customer's action of the same kind
at about the same moment: ten times the customers at the same intensity, what a busier team
sees. The review items of the copied actions are copied with them. Tasks and dead letters are
not grown (they are 150k either way). Each database is reused if it holds its actions.
"""

import time

import psycopg
from psycopg import sql

from .pages import database_exists, db_url, manage, recreate_database, say
from .stack import ADMIN_URL

ONE_M, TEN_M = "surety_scale_1m", "surety_scale"
SEEDED = 1_000_000  # seed_volume's actions
FACTOR = 10
SLICE = 50_000  # seeded actions per statement (x9 rows written, sorted in memory)

ACTION_COLUMNS = ("operation_key", "fingerprint", "action_type", "target", "customer", "params", "amount", "currency",
                  "decision_id", "task_id", "agent_id", "status", "attempts", "external_ref", "result", "error",
                  "evidence", "next_attempt_at", "lease_owner", "lease_expires_at", "fence", "created_at",
                  "updated_at", "approved_fingerprint", "supersedes_id")
# What a copy changes: its own key, target, customer and decision (the unique rules hold), a
# moment g seconds earlier, and its amount by g thousandths, so that its amounts (and its
# customer's totals) are its own too: ten times the distinct amounts of a day, as real ones
# would be, not the seed's ten times over (which the what-if's summaries would fold into one).
COPIED = {"operation_key": "a.operation_key || '~' || g", "target": "a.target || '~' || g",
          "customer": "a.customer || '~' || g", "decision_id": "a.decision_id || '~' || g",
          "amount": "a.amount + g * 0.001",
          "created_at": "a.created_at - g * interval '1 second'", "updated_at": "a.updated_at - g * interval '1 second'"}
REVIEW_COLUMNS = ("updated_at", "kind", "status", "why", "approvals_needed", "limit_snapshot", "deadline",
                  "created_at", "decided_by_label", "decided_at", "note", "overdue_alerted_at", "decided_by_id",
                  "escalate_at", "escalated_at", "decided_fingerprint", "expires_at")
TIMED = {"updated_at", "deadline", "created_at", "decided_at", "overdue_alerted_at", "escalate_at", "escalated_at",
         "expires_at"}


def actions(name):
    with psycopg.connect(db_url(name), autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('ledger_action')").fetchone()[0] is None:
            return 0
        return conn.execute("SELECT count(*) FROM ledger_action").fetchone()[0]


def ensure(timings):
    """Both databases, loaded if missing or empty (timed), migrated either way."""
    if not database_exists(ONE_M) or actions(ONE_M) == 0:
        say(f"   {ONE_M}: creating, migrating, seed_volume --seed 1 (1M actions)...")
        started = time.monotonic()
        recreate_database(ONE_M)
        manage(ONE_M, "migrate", "--noinput", "-v", "0")
        manage(ONE_M, "seed_volume", "--seed", "1", "-v", "0")
        timings["load_1m_s"] = round(time.monotonic() - started, 1)
        say(f"   {ONE_M}: loaded in {timings['load_1m_s']} s")
    # (The runs' own rows, (b)-(d)'s, come on top of the loaded ones: a database is kept once it holds those.)
    if not database_exists(TEN_M) or actions(TEN_M) < FACTOR * SEEDED:
        say(f"   {TEN_M}: a copy of {ONE_M} grown x{FACTOR} in SQL...")
        started = time.monotonic()
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(TEN_M)))
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(TEN_M), sql.Identifier(ONE_M)))
        timings["copy_1m_s"] = round(time.monotonic() - started, 1)
        grow(TEN_M, timings)
        timings["load_10m_s"] = round(time.monotonic() - started, 1)
        say(f"   {TEN_M}: loaded in {timings['load_10m_s']} s")
    for name in (ONE_M, TEN_M):
        started = time.monotonic()
        manage(name, "migrate", "--noinput", "-v", "0")
        timings[f"migrate_{name}_s"] = round(time.monotonic() - started, 1)


def grow(name, timings):
    """Nine copies of every seeded action (and of its review items), slice by slice."""
    copy = ", ".join(COPIED.get(c, f"a.{c}") for c in ACTION_COLUMNS)
    insert_actions = (f"INSERT INTO ledger_action ({', '.join(ACTION_COLUMNS)}) SELECT {copy} "
                      "FROM ledger_action a CROSS JOIN generate_series(1, %(copies)s) g "
                      "WHERE a.id BETWEEN %(lo)s AND %(hi)s ORDER BY a.created_at - g * interval '1 second', a.id, g")
    review = ", ".join(f"r.{c} - g * interval '1 second'" if c in TIMED else f"r.{c}" for c in REVIEW_COLUMNS)
    insert_reviews = (f"INSERT INTO approvals_reviewitem ({', '.join(REVIEW_COLUMNS)}, action_id) SELECT {review}, c.id "
                      "FROM approvals_reviewitem r JOIN ledger_action a ON a.id = r.action_id "
                      "CROSS JOIN generate_series(1, %(copies)s) g "
                      "JOIN ledger_action c ON c.operation_key = a.operation_key || '~' || g "
                      "WHERE a.id BETWEEN %(lo)s AND %(hi)s")
    with psycopg.connect(db_url(name), autocommit=True) as conn:
        first, last = conn.execute("SELECT min(id), max(id) FROM ledger_action").fetchone()
        started = time.monotonic()
        for lo in range(first, last + 1, SLICE):
            params = {"copies": FACTOR - 1, "lo": lo, "hi": min(lo + SLICE - 1, last)}
            with conn.transaction():
                # Copied history, not requests: the same-subject rule would hold them (as seed_volume says).
                conn.execute("ALTER TABLE ledger_action DISABLE TRIGGER ledger_action_same_subject")
                conn.execute(insert_actions, params)
                conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
                conn.execute("ALTER TABLE ledger_action ENABLE TRIGGER ledger_action_same_subject")
                conn.execute(insert_reviews, params)
            done = params["hi"] - first + 1
            say(f"     {done * FACTOR:,} actions ({time.monotonic() - started:.0f} s)")
        timings["grow_insert_s"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        for table in ("ledger_action", "approvals_reviewitem"):
            conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table)))
        timings["grow_vacuum_s"] = round(time.monotonic() - started, 1)
