"""`python -m bench pages`: server time of the dashboard's list and search pages, at ~1,000 rows
and at volume (1,000,000 actions, 100,000 dead-letter entries).

Targets (issue 4, "Measure"): for each page, p95 at volume <= 1.5 x p95 at 1,000 rows, and
p95 at volume under 150 ms.

Two databases:

  small   `surety_bench_small` (--small-db): dropped, created, migrated and loaded with
          `seed_volume --actions 1000 --deadletters 100` on every run (a few seconds);
  volume  `surety_volume` (--volume-db): reused as it is, because loading 1M actions takes
          about two minutes. It is migrated (new indexes get built), never re-seeded, unless
          --seed-volume says so: `auto` (default) loads it only when the database is missing or
          holds no actions, `always` drops and reloads it, `never` stops if it is not there.

Server time is measured in-process: Django's test client (no HTTP, no gunicorn), logged in as a
superuser (`bench-pages`, created if missing) so every control and query of the page runs.
Each database is served by a child process of its own (Django is set up once per database);
this process drives both and interleaves them page by page and round by round, so a load
that comes and goes on a shared machine touches both sides of a ratio alike. Per page and
database: --warmup requests first, then --requests timed ones (wall time of the whole
request, response rendered), reported as p50/p95, with the SQL statements per request and
the median time spent in SQL.

--explain also runs EXPLAIN (ANALYZE, BUFFERS) on the slowest statements of each page at
volume and writes them next to the JSON (artifacts/bench-pages-explain.txt).

Prints a table (page, p95 small, p95 volume, ratio, PASS/MISS) and writes artifacts/bench-pages.json.
"""

import argparse
import html
import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from .results import write_results

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
SMALL = {"actions": 1000, "deadletters": 100}
RATIO_AT_MOST = 1.5
P95_UNDER_MS = 150.0
BENCH_USER = "bench-pages"
# What every process that sets Django up on a bench database runs under: production's settings
# with DEBUG off, but no second factor asked of the bench's person, signed in by force_login (the
# pages are measured, not the sign-in; with DEBUG off MFA_REQUIRED defaults on, and every page
# would answer a redirect to enrol one).
DJANGO_ENV = {"DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "false", "PRODUCTION": "false",
              "LOG_LEVEL": "WARNING", "MFA_REQUIRED": "false"}
TAG = "@@bench-pages "  # the child's answers on stdout start with this; anything else is passed on

# name -> (path and query, with {placeholders} the child fills from its own data; sent as htmx?)
PAGES = {
    "overview": ("/", False),
    "overview counts (htmx poll)": ("/?partial=counts", True),
    "approvals queue": ("/approvals/", False),
    "unknown outcomes": ("/unknown/", False),
    "dead-letter queue": ("/dlq/", False),
    "dead-letter queue ?workflow=refund": ("/dlq/?workflow=refund", False),
    "ledger search": ("/ledger/", False),
    "ledger ?status=failed": ("/ledger/?status=failed", False),
    "ledger ?customer=<busiest>": ("/ledger/?customer={customer}", False),
    "ledger ?agent=<name>": ("/ledger/?agent={agent}", False),
    "ledger ?key=<prefix>": ("/ledger/?key={key_prefix}", False),
    "ledger page 2 (after=)": ("/ledger/?{page2}", False),
    "audit log": ("/audit/", False),
    # Worst cases of the same pages: the filters whose matches are few, or spread thin over
    # history, so that walking the ledger newest first would read much of it.
    "ledger ?target=<busiest>": ("/ledger/?target={target}", False),
    "ledger ?status=rejected": ("/ledger/?status=rejected", False),
    "ledger ?agent=<idle agent>": ("/ledger/?agent={idle_agent}", False),
    "dead-letter queue ?workflow=noop": ("/dlq/?workflow=noop", False),
    "dead-letter queue ?code=<none open>": ("/dlq/?code=provider_unavailable", False),
}
IDLE_AGENT = "bench-pages-idle"  # an agent with no actions (created if missing)


def say(*parts):
    print(*parts, flush=True)


def db_url(name):
    return f"postgres://postgres@127.0.0.1:5432/{name}"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench pages", description=__doc__.split("\n\n")[0])
    p.add_argument("--small-db", default="surety_bench_small",
                   help="the ~1,000-row database, recreated and seeded each run (default surety_bench_small)")
    p.add_argument("--volume-db", default="surety_volume", help="the 1M-action database (default surety_volume)")
    p.add_argument("--seed-volume", choices=("auto", "always", "never"), default="auto",
                   help="auto: load the volume database only if it is missing or empty (~2 min); always: drop and "
                        "reload it; never: stop if it is missing (default auto)")
    p.add_argument("--keep-small", action="store_true",
                   help="reuse the small database if it is already seeded (faster re-runs)")
    p.add_argument("--requests", type=int, default=30, help="timed requests per page and database (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed requests first (default 3)")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds the timed requests are split into (default 3)")
    p.add_argument("--only", default="", help="measure only the pages whose name contains this text")
    p.add_argument("--explain", action="store_true",
                   help="EXPLAIN ANALYZE the slowest statements of each page at volume")
    p.add_argument("--out", default="artifacts/bench-pages.json")
    return p.parse_args(argv)


# --- the databases (this process, psycopg and manage.py only; no Django here) -----------------------


def admin():
    import psycopg

    return psycopg.connect(ADMIN_URL, autocommit=True)


def database_exists(name):
    with admin() as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None


def recreate_database(name):
    from psycopg import sql

    with admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def row_counts(name):
    """Exact counts of the tables the pages read (a few hundred ms at volume), or None if the
    schema is not there yet."""
    import psycopg

    tables = ("ledger_action", "approvals_reviewitem", "dlq_deadletter", "ledger_task", "ledger_auditevent")
    with psycopg.connect(db_url(name), autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('ledger_action')").fetchone()[0] is None:
            return None
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}  # noqa: S608


def manage(name, *args):
    env = {**os.environ, "DATABASE_URL": db_url(name), **DJANGO_ENV}
    done = subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} on {name} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def prepare_small(args, timings):
    name = args.small_db
    t0 = time.monotonic()
    if args.keep_small and database_exists(name) and (row_counts(name) or {}).get("ledger_action"):
        manage(name, "migrate", "--noinput", "-v", "0")
        say(f"   small: reusing {name} (--keep-small), migrated in {time.monotonic() - t0:.1f} s")
    else:
        recreate_database(name)
        manage(name, "migrate", "--noinput", "-v", "0")
        manage(name, "seed_volume", "--actions", str(SMALL["actions"]), "--deadletters", str(SMALL["deadletters"]),
               "--seed", "1", "-v", "0")
        say(f"   small: {name} recreated, migrated and seeded in {time.monotonic() - t0:.1f} s")
    timings["small_prepare_s"] = round(time.monotonic() - t0, 1)


def prepare_volume(args, timings):
    name = args.volume_db
    exists = database_exists(name)
    if args.seed_volume == "never" and not exists:
        raise SystemExit(f"bench pages: the volume database {name} does not exist and --seed-volume never was given")
    seed = args.seed_volume == "always" or not exists
    if not seed:
        t0 = time.monotonic()
        manage(name, "migrate", "--noinput", "-v", "0")  # builds indexes added since it was loaded
        timings["volume_migrate_s"] = round(time.monotonic() - t0, 1)
        counts = row_counts(name)
        if not counts or not counts["ledger_action"]:
            if args.seed_volume == "never":
                raise SystemExit(f"bench pages: {name} holds no actions and --seed-volume never was given")
            seed = True
        else:
            say(f"   volume: reusing {name} (migrated in {timings['volume_migrate_s']} s; not re-seeded)")
            if counts["ledger_action"] < 900_000:
                say(f"   ! {name} holds only {counts['ledger_action']:,} actions (a load cut short?); "
                    "--seed-volume always reloads it")
    if seed:
        say(f"   volume: {'reloading' if exists else 'creating'} {name}: seed_volume, 1,000,000 actions and "
            "100,000 dead-letter entries (about two minutes)...")
        t0 = time.monotonic()
        recreate_database(name)
        manage(name, "migrate", "--noinput", "-v", "0")
        manage(name, "seed_volume", "--seed", "1", "-v", "0")
        timings["volume_seed_s"] = round(time.monotonic() - t0, 1)
        say(f"   volume: {name} created, migrated and seeded in {timings['volume_seed_s']} s")


# --- the child: one per database, Django set up on it ---------------------------------------------------


class Child:
    """A `python -m bench.pages --serve` process on one database, driven by JSON lines."""

    def __init__(self, label, name):
        self.label, self.name = label, name
        env = {**os.environ, "DATABASE_URL": db_url(name), **DJANGO_ENV, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen([PYTHON, "-m", "bench.pages", "--serve"], cwd=ROOT, env=env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.hello = self.read()

    def read(self):
        for line in self.process.stdout:
            if line.startswith(TAG):
                answer = json.loads(line[len(TAG):])
                if "error" in answer:
                    raise RuntimeError(f"{self.label} ({self.name}): {answer['error']}")
                return answer
            sys.stdout.write(f"   [{self.label}] {line}")
        raise RuntimeError(f"the {self.label} child ({self.name}) exited with {self.process.wait()}")

    def ask(self, **command):
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self):
        if self.process.poll() is None:
            try:
                self.ask(op="quit")
            except (RuntimeError, BrokenPipeError):
                pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def serve():
    """The child's loop: set Django up on DATABASE_URL, log a superuser in, answer commands."""
    import warnings

    warnings.filterwarnings("ignore", message="No directory at", module="django.core.handlers.base")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.test import Client

    def answer(payload):
        sys.stdout.write(TAG + json.dumps(payload, default=str) + "\n")
        sys.stdout.flush()

    try:
        User = get_user_model()
        user = User.objects.filter(username=BENCH_USER).first()
        if user is None:
            user = User.objects.create_superuser(BENCH_USER, f"{BENCH_USER}@bench.invalid", None)
        client = Client()
        client.force_login(user)
        urls = page_urls(client)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which stops
        answer({"error": f"{type(exc).__name__}: {exc}"})
        return
    answer({"urls": urls})
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if command["op"] == "quit":
                answer({"bye": True})
                return
            if command["op"] == "measure":
                answer(measure(client, urls[command["page"]], PAGES[command["page"]][1], command["n"],
                               command["warmup"]))
            elif command["op"] == "explain":
                answer({"text": explain(client, urls[command["page"]], PAGES[command["page"]][1],
                                        command["min_ms"])})
        except Exception as exc:  # noqa: BLE001
            answer({"error": f"{command}: {type(exc).__name__}: {exc}"})


def page_urls(client):
    """The pages' URLs on this database: the busiest customer and target, an agent, an agent with
    no actions, the order part of the newest refund's key (an operator pasting an order id),
    page 2 of the plain ledger from page 1's link."""
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.db.models import Count

    from ledger.agents import agent_create
    from ledger.models import Action, Agent

    def busiest(field):
        return (Action.objects.exclude(**{field: ""}).values(field).annotate(n=Count("id"))
                .order_by("-n", field).values_list(field, flat=True).first()) or "-"

    customer, target = busiest("customer"), busiest("target")
    if not Agent.objects.filter(name=IDLE_AGENT).exists():
        with transaction.atomic():
            owner = get_user_model().objects.get_or_create(username="bench-owner", defaults={"is_active": False})[0]
            agent_create(IDLE_AGENT, actor="system:bench-pages", owner=owner)
    agent = (Agent.objects.filter(name="vol-refunds-eu").values_list("name", flat=True).first()
             or Agent.objects.order_by("name").values_list("name", flat=True).first() or "")
    key = Action.objects.filter(action_type="refund").order_by("-created_at", "-id").values_list(
        "operation_key", flat=True).first() or "refund:"
    key_prefix = ":".join(key.split(":")[:2])  # refund:ORD-123456789
    page1 = client.get("/ledger/").content.decode()
    found = re.search(r'href="\?([^"]*)" rel="next"', page1)
    page2 = html.unescape(found.group(1)) if found else "after="
    from urllib.parse import quote

    values = {"customer": quote(customer), "target": quote(target), "agent": quote(agent),
              "idle_agent": IDLE_AGENT, "key_prefix": quote(key_prefix), "page2": page2}
    return {name: path.format(**values) for name, (path, _) in PAGES.items()}


def _headers(htmx):
    return {"HX-Request": "true"} if htmx else {}


def measure(client, url, htmx, n, warmup):
    from django.db import connection

    sql = {"statements": 0, "seconds": 0.0}

    def timed(execute, statement, params, many, context):
        started = time.perf_counter()
        try:
            return execute(statement, params, many, context)
        finally:
            sql["statements"] += 1
            sql["seconds"] += time.perf_counter() - started

    headers = _headers(htmx)
    for _ in range(warmup):
        client.get(url, headers=headers)
    wall, in_sql, statements, statuses = [], [], [], set()
    with connection.execute_wrapper(timed):
        for _ in range(n):
            sql["statements"], sql["seconds"] = 0, 0.0
            started = time.perf_counter()
            response = client.get(url, headers=headers)
            response.content  # noqa: B018 - rendered and read, as a server would send it
            wall.append((time.perf_counter() - started) * 1000)
            in_sql.append(sql["seconds"] * 1000)
            statements.append(sql["statements"])
            statuses.add(response.status_code)
    page = response.content.decode()
    return {"wall_ms": wall, "sql_ms": in_sql, "statements": statements, "statuses": sorted(statuses),
            "bytes": len(page), "table_rows": page.count("<tr") - page.count("<thead")}


def explain(client, url, htmx, min_ms):
    """EXPLAIN (ANALYZE, BUFFERS) of each statement of one request that took at least min_ms."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        client.get(url, headers=_headers(htmx))
    out = []
    for q in sorted(captured.captured_queries, key=lambda q: -float(q["time"])):
        ms = float(q["time"]) * 1000
        if ms < min_ms or not q["sql"].lstrip().upper().startswith("SELECT"):
            continue
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + q["sql"])
            plan = "\n".join(row[0] for row in cursor.fetchall())
        out.append(f"-- {ms:.1f} ms\n{q['sql']}\n{plan}\n")
    return "\n".join(out) or f"(no statement took {min_ms} ms or more)\n"


# --- the run ----------------------------------------------------------------------------------------------


def percentile(values, p):
    ordered = sorted(values)
    if not ordered:
        return None
    k = (len(ordered) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarise(samples):
    wall, in_sql = samples["wall_ms"], samples["sql_ms"]
    return {"requests": len(wall), "p50_ms": round(percentile(wall, 50), 2), "p95_ms": round(percentile(wall, 95), 2),
            "max_ms": round(max(wall), 2), "sql_ms_median": round(statistics.median(in_sql), 2),
            "statements": max(samples["statements"]), "statuses": samples["statuses"], "bytes": samples["bytes"],
            "table_rows": samples["table_rows"]}


def verdict(small, volume):
    ratio = volume["p95_ms"] / small["p95_ms"] if small["p95_ms"] else None
    ok_ratio = ratio is not None and ratio <= RATIO_AT_MOST
    ok_abs = volume["p95_ms"] < P95_UNDER_MS
    return {"ratio": round(ratio, 2) if ratio else None, "ratio_ok": ok_ratio, "under_150ms": ok_abs,
            "pass": ok_ratio and ok_abs}


def print_table(rows):
    """One line per page; the columns after the verdict explain it: p50, the median time in SQL,
    the SQL statements per request and the table rows the page rendered (small / volume)."""
    say(f"\n  {'page':<36} {'p95 small':>9} {'p95 volume':>10} {'ratio':>6}  {'verdict':<19} "
        f"{'p50 s/v ms':>12} {'SQL ms s/v':>11} {'stmts':>6} {'rows s/v':>8}")
    for name, r in rows.items():
        s, v, x = r["small"], r["volume"], r["verdict"]
        why = "" if x["pass"] else " (" + ", ".join(
            w for w, bad in (("ratio", not x["ratio_ok"]), (">=150ms", not x["under_150ms"])) if bad) + ")"
        verdict = ("PASS" if x["pass"] else "MISS") + why
        say(f"  {name:<36} {s['p95_ms']:>7.1f}ms {v['p95_ms']:>8.1f}ms {x['ratio']:>6.2f}  {verdict:<19} "
            f"{s['p50_ms']:>5.1f}/{v['p50_ms']:<6.1f} {s['sql_ms_median']:>5.1f}/{v['sql_ms_median']:<5.1f} "
            f"{s['statements']:>2}/{v['statements']:<3} {s['table_rows']:>3}/{v['table_rows']:<4}")


def main(argv=None):
    args = parse_args(argv if argv is not None else sys.argv[1:])
    os.chdir(ROOT)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    say(f"bench pages: list and search pages, in-process (Django test client, superuser), {args.warmup} warm-up + "
        f"{args.requests} timed requests per page and database in {args.rounds} interleaved rounds; small database "
        f"{args.small_db} (~{SMALL['actions']:,} actions, {SMALL['deadletters']} dead letters, fresh), volume database "
        f"{args.volume_db} (--seed-volume {args.seed_volume})")
    timings = {}
    prepare_small(args, timings)
    prepare_volume(args, timings)
    sizes = {"small": row_counts(args.small_db), "volume": row_counts(args.volume_db)}
    for label, counts in sizes.items():
        say(f"   {label}: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))
    pages = [name for name in PAGES if args.only.lower() in name.lower()]
    children = {}
    results = {}
    explains = []
    try:
        children = {"small": Child("small", args.small_db), "volume": Child("volume", args.volume_db)}
        say("   page URLs at volume: " + "; ".join(f"{children['volume'].hello['urls'][p]}" for p in pages))
        measured_from = time.monotonic()
        per_round = [args.requests // args.rounds + (1 if i < args.requests % args.rounds else 0)
                     for i in range(args.rounds)]
        for page in pages:
            samples = {label: {"wall_ms": [], "sql_ms": [], "statements": [], "statuses": set(), "bytes": 0,
                               "table_rows": 0}
                       for label in children}
            for round_no, n in enumerate(per_round):
                if not n:
                    continue
                for label, child in children.items():
                    got = child.ask(op="measure", page=page, n=n, warmup=args.warmup if round_no == 0 else 0)
                    s = samples[label]
                    for key in ("wall_ms", "sql_ms", "statements"):
                        s[key] += got[key]
                    s["statuses"].update(got["statuses"])
                    s["bytes"], s["table_rows"] = got["bytes"], got["table_rows"]
            row = {label: summarise({**s, "statuses": sorted(s["statuses"])}) for label, s in samples.items()}
            row["urls"] = {label: child.hello["urls"][page] for label, child in children.items()}
            row["verdict"] = verdict(row["small"], row["volume"])
            results[page] = row
            bad = [f"{label} answered {row[label]['statuses']}" for label in children
                   if row[label]["statuses"] != [200]]
            say(f"   {page:<36} p95 {row['small']['p95_ms']:>7.1f} ms small, {row['volume']['p95_ms']:>7.1f} ms volume"
                + (f"   ! {'; '.join(bad)}" if bad else ""))
            if args.explain:
                text = children["volume"].ask(op="explain", page=page, min_ms=2.0)["text"]
                explains.append(f"==== {page}  ({row['urls']['volume']})\n{text}")
        timings["measure_s"] = round(time.monotonic() - measured_from, 1)
    finally:
        for child in children.values():
            child.close()
    say("\n" + "=" * 100)
    say(f"PAGES: server time per request, in-process; targets: p95 volume <= {RATIO_AT_MOST} x p95 small and "
        f"< {P95_UNDER_MS:g} ms")
    print_table(results)
    passed = sum(r["verdict"]["pass"] for r in results.values())
    say(f"\n  {passed} of {len(results)} pages meet both targets")
    document = {
        "when": datetime.now(UTC).isoformat(), "seconds": round(time.monotonic() - began, 1), "timings": timings,
        "setup": {"small_db": args.small_db, "volume_db": args.volume_db, "seed_volume": args.seed_volume,
                  "requests": args.requests, "warmup": args.warmup, "rounds": args.rounds,
                  "client": "django.test.Client, in-process, force_login superuser", "settings": "config.settings",
                  "cpus": os.cpu_count()},
        "targets": {"ratio_at_most": RATIO_AT_MOST, "p95_volume_under_ms": P95_UNDER_MS},
        "sizes": sizes, "pages": results, "passed": passed, "total": len(results),
    }
    write_results(out, document)
    if explains:
        explain_path = out.with_name(out.stem + "-explain.txt")
        explain_path.write_text("\n".join(explains))
        say(f"  EXPLAIN ANALYZE at volume written to {explain_path}")
    say(f"\nwritten to {out} in {document['seconds']} s")
    return document


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        main()
