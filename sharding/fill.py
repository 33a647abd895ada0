"""Fills the shards' directory from a Surety that ran alone, before the router is switched on in
front of it as shard 0: `DATABASE_URL=<its database> SHARD_DIRECTORY_URL=<the directory>
python -m sharding.fill`.

An empty directory would send every name that Surety recorded by its hash, so a retry of a key
recorded before the switch could be recorded and executed again on another shard, and a
customer's new actions would miss the same-subject hold of its old ones. So every name the router
would place for what the database holds (each direct action's key, customer and target, each
task's id and subjects, each archived key and task id) is placed on shard 0, marked used (something is
recorded under it, so no request takes it back). It reads in batches and can be run again: a name
already placed is left as it is. A name found placed on another shard means the router served
before the fill: those are listed, and it exits 1. Run it with the ledger taking no requests
but through the router: a key recorded straight into it after the fill is never placed.
"""

import os
import sys
import uuid

import psycopg

from sharding.router import Unreadable, create_directory, names

BATCH = 5000
# Each row as the router reads a POST: the kind, the key and the body's fields that name subjects.
SOURCES = (
    # Not a task step's action: its names are its task's, placed from the task's row (its key goes
    # by the task's id, its customer and target are the task's customer and targets).
    ("action", "SELECT operation_key, jsonb_build_object('customer', customer, 'target', target) FROM ledger_action "
               "WHERE task_id IS NULL"),
    ("task", "SELECT task_id, jsonb_build_object('workflow', workflow, 'input', input) FROM ledger_task"),
    # An archived key has no subjects left, but a request under it must reach its 410.
    ("action", "SELECT operation_key, '{}'::jsonb FROM ledger_archivedkey"),
    ("task", "SELECT task_id, '{}'::jsonb FROM ledger_archivedtask"),
)


def fill(surety_url, directory_url):
    """Places the names of what `surety_url` holds on shard 0: how many it placed, and the names
    it found placed on another shard."""
    owner, count, elsewhere = uuid.uuid4(), 0, []
    with psycopg.connect(surety_url) as surety, psycopg.connect(directory_url, autocommit=True) as directory:
        create_directory(directory)
        for batch in batches(surety):
            count += directory.execute(
                "INSERT INTO shard_placement (name, shard, owner, used) SELECT unnest(%s::text[]), 0, %s, true "
                "ON CONFLICT DO NOTHING", [batch, owner]).rowcount
            elsewhere += directory.execute(
                "SELECT name, shard FROM shard_placement WHERE name = ANY(%s) AND shard <> 0", [batch]).fetchall()
    return count, elsewhere


def batches(surety):
    for kind, query in SOURCES:
        with surety.cursor(name="fill") as cursor:  # server-side: a big ledger is not read into memory
            cursor.execute(query)
            while rows := cursor.fetchmany(BATCH):
                yield sorted({name for key, body in rows for name in placed_names(kind, key, body)})


def placed_names(kind, key, body):
    try:
        key_name, subjects = names(kind, key, body)
    except Unreadable:  # a row the router could not read as a request: it routes it to shard 0 anyway
        return []
    return [key_name, *subjects]


if __name__ == "__main__":
    placed, elsewhere = fill(os.environ["DATABASE_URL"], os.environ["SHARD_DIRECTORY_URL"])
    print(f"{placed} names placed on shard 0")
    for name, shard in elsewhere:
        print(f"{name} is placed on shard {shard}: the router served before the fill", file=sys.stderr)
    sys.exit(1 if elsewhere else 0)
