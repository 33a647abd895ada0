"""`python -m bench partitioned_writes`: what partitioning the ledger by ranges of id would cost its
two hot statements, measured by pgbench in one run (decision 55).

1. A fresh database `surety_bench_partitions` with tables of the ledger's shape reduced to what
   the statements touch: `--rows` rows once unpartitioned and once in 4 and in 16 range
   partitions; and a table with a unique key next to a partitioned one whose key is claimed, as
   it would have to be (a unique index on a partitioned table must hold its partition key), by
   an AFTER INSERT trigger writing a claims table.
2. pgbench, one client, prepared statements (generic plans, as psycopg's are after five runs),
   `synchronous_commit = off` (the commit's flush is the same for every table and would hide the
   difference), `--seconds` per figure, `--rounds` rounds alternating:
   - a worker's UPDATE of an action by id (a claim, a settle);
   - the intake's INSERT of an action under a new key.
3. Prints the median latency of each and its ratio to the unpartitioned table.
4. The longest INSERT while a partition's DDL (`DDL`: the archive's drop, the sweeper's new
   partition, each as it was and as it is) waits for a reader that holds the table for 3 s: the
   INSERTs queue behind DDL that waits for a lock they conflict with.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .stack import database_url, reset_database

DB_NAME = "surety_bench_partitions"
PGBENCH = [shutil.which("pgbench"), *sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), reverse=True)]

SETUP = """
CREATE TABLE updated_plain (id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'queued', target text NOT NULL,
                            attempts int NOT NULL DEFAULT 0);
CREATE INDEX ON updated_plain (target, status);
INSERT INTO updated_plain (id, target) SELECT g, 'ORD-' || g FROM generate_series(1, {rows}) g;
CREATE TABLE updated_4 (LIKE updated_plain INCLUDING ALL) PARTITION BY RANGE (id);
CREATE TABLE updated_16 (LIKE updated_plain INCLUDING ALL) PARTITION BY RANGE (id);
DO $$ BEGIN
  FOR i IN 0..3 LOOP
    EXECUTE format('CREATE TABLE updated_4_%s PARTITION OF updated_4 FOR VALUES FROM (%s) TO (%s)',
                   i, i * {rows} / 4 + 1, (i + 1) * {rows} / 4 + 1);
  END LOOP;
  FOR i IN 0..15 LOOP
    EXECUTE format('CREATE TABLE updated_16_%s PARTITION OF updated_16 FOR VALUES FROM (%s) TO (%s)',
                   i, i * {rows} / 16 + 1, (i + 1) * {rows} / 16 + 1);
  END LOOP;
END $$;
INSERT INTO updated_4 SELECT * FROM updated_plain;
INSERT INTO updated_16 SELECT * FROM updated_plain;

CREATE TABLE inserted_plain (id bigserial PRIMARY KEY, operation_key text NOT NULL UNIQUE, target text NOT NULL);
CREATE SEQUENCE inserted_claimed_seq;
CREATE TABLE inserted_claimed (id bigint NOT NULL DEFAULT nextval('inserted_claimed_seq') PRIMARY KEY,
                               operation_key text NOT NULL, target text NOT NULL) PARTITION BY RANGE (id);
CREATE INDEX ON inserted_claimed (operation_key);
DO $$ BEGIN
  FOR i IN 0..3 LOOP
    EXECUTE format('CREATE TABLE inserted_claimed_%s PARTITION OF inserted_claimed FOR VALUES FROM (%s) TO (%s)',
                   i, i * 100000000, (i + 1) * 100000000);
  END LOOP;
END $$;
CREATE TABLE claims (claim text PRIMARY KEY, action_id bigint NOT NULL);
CREATE FUNCTION claim_key() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO claims (claim, action_id) VALUES (jsonb_build_array('key', NEW.operation_key)::text, NEW.id);
    RETURN NULL;
END $f$;
CREATE TRIGGER inserted_claimed_claims AFTER INSERT ON inserted_claimed FOR EACH ROW EXECUTE FUNCTION claim_key();
VACUUM ANALYZE;
"""
UPDATE = "\\set id random(1, {rows})\nUPDATE {table} SET status = 'pending', attempts = attempts + 1 WHERE id = :id;\n"
INSERT = ("INSERT INTO {table} (operation_key, target) "
          "VALUES (md5(random()::text || clock_timestamp()::text), 'ORD-1');\n")
FIGURES = [  # (name, script, baseline name)
    ("UPDATE by id, unpartitioned", UPDATE.replace("{table}", "updated_plain"), None),
    ("UPDATE by id, 4 partitions", UPDATE.replace("{table}", "updated_4"), "UPDATE by id, unpartitioned"),
    ("UPDATE by id, 16 partitions", UPDATE.replace("{table}", "updated_16"), "UPDATE by id, unpartitioned"),
    ("INSERT, unique key", INSERT.replace("{table}", "inserted_plain"), None),
    ("INSERT, 4 partitions, key claimed", INSERT.replace("{table}", "inserted_claimed"), "INSERT, unique key"),
]


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench partitioned_writes")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args(argv)


def latency_ms(pgbench, script, seconds, url):
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as file:
        file.write(script)
        file.flush()
        out = subprocess.run([pgbench, "-n", "-c", "1", "-T", str(seconds), "-M", "prepared", "-f", file.name, url],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "PGOPTIONS": "-c synchronous_commit=off"}).stdout
    return float(re.search(r"latency average = ([\d.]+) ms", out)[1])


def main(argv):
    args = parse_args(argv)
    pgbench = next((str(p) for p in PGBENCH if p), None)
    if pgbench is None:
        sys.exit("pgbench is not installed (it comes with PostgreSQL's server package)")
    reset_database(DB_NAME)
    url = database_url(DB_NAME)
    subprocess.run(["psql", url, "-q", "-v", "ON_ERROR_STOP=1", "-f", "-"], input=SETUP.replace("{rows}", str(args.rows)),
                   text=True, check=True, capture_output=True)
    seen = {name: [] for name, _, _ in FIGURES}
    for round_ in range(args.rounds):
        for name, script, _ in FIGURES:
            seen[name].append(latency_ms(pgbench, script.replace("{rows}", str(args.rows)), args.seconds, url))
        print(f"round {round_ + 1}: " + ", ".join(f"{name} {values[-1]:.3f} ms" for name, values in seen.items()),
              flush=True)
    print(f"\n{args.rows:,} rows; pgbench, 1 client, prepared, synchronous_commit off; median of {args.rounds} "
          f"rounds of {args.seconds} s")
    for name, _, baseline in FIGURES:
        median = statistics.median(seen[name])
        ratio = f"   {median / statistics.median(seen[baseline]):.2f}x {baseline}" if baseline else ""
        print(f"  {name:<36} {median:.3f} ms{ratio}")
    print("\nThe longest INSERT while a partition's DDL waits for a reader that holds the table for 3 s:")
    for name, (timeout, statements) in DDL.items():
        stalls = [ddl_stall(url, timeout, statements) for _ in range(args.rounds)]
        print(f"  {name}: " + ", ".join(f"{stall * 1000:.0f} ms" for stall in stalls))


# The DDL the archive and the sweeper run on a partitioned table, as they ran it before decision 55
# and as they run it now.
DDL = {
    "DROP TABLE of a partition (the archive), lock_timeout 2s (before)": ("2s", ["DROP TABLE stalled_old"]),
    "DROP TABLE of a partition (the archive), lock_timeout 200ms": ("200ms", ["DROP TABLE stalled_old"]),
    "CREATE TABLE ... PARTITION OF (the sweeper, before)": (
        "2s", ["CREATE TABLE stalled_next PARTITION OF stalled FOR VALUES FROM (1000000) TO (2000000)"]),
    "CREATE TABLE, then ATTACH PARTITION (the sweeper, now)": (
        "200ms", ["CREATE TABLE stalled_next (LIKE stalled INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
                  "ALTER TABLE stalled ATTACH PARTITION stalled_next FOR VALUES FROM (1000000) TO (2000000)"]),
}


def ddl_stall(url, lock_timeout, statements, hold=3.0):
    """The longest INSERT into a partitioned table while `statements` (a partition's DDL) wait for
    a reader that holds the table for `hold` seconds, given up after `lock_timeout`: PostgreSQL
    queues the INSERTs behind DDL that waits for a lock they conflict with."""
    import threading
    import time

    import psycopg

    with psycopg.connect(url, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS stalled, stalled_next")
        setup.execute("CREATE TABLE stalled (id bigserial PRIMARY KEY, note text) PARTITION BY RANGE (id)")
        setup.execute("CREATE TABLE stalled_old PARTITION OF stalled FOR VALUES FROM (MINVALUE) TO (0)")
        setup.execute("CREATE TABLE stalled_now PARTITION OF stalled FOR VALUES FROM (0) TO (1000000)")
        setup.execute("CREATE TABLE stalled_default PARTITION OF stalled DEFAULT")
    latencies, stop = [], threading.Event()

    def write():
        with psycopg.connect(url, autocommit=True) as writer:
            while not stop.is_set():
                began = time.perf_counter()
                writer.execute("INSERT INTO stalled (note) VALUES ('an audit event')")
                latencies.append(time.perf_counter() - began)
                time.sleep(0.005)

    with psycopg.connect(url) as reader, psycopg.connect(url) as ddl:
        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(0.5)
        reader.execute("SELECT count(*) FROM stalled")  # holds every partition until its transaction ends
        release = threading.Timer(hold, reader.rollback)
        release.start()
        ddl.execute(f"SET LOCAL lock_timeout = '{lock_timeout}'")  # the transaction of the DDL below
        try:
            for statement in statements:
                ddl.execute(statement)
            ddl.commit()
        except psycopg.errors.LockNotAvailable:
            ddl.rollback()
        release.join()
        time.sleep(0.5)
        stop.set()
        writer.join()
    return max(latencies)
