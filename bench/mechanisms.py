"""`python -m bench mechanisms`: each hand-made mechanism for speed against the plain code it
stands in for (the mechanism switched off), side by side in one run.

Ways, each its own gunicorn and (d)'s workers, all with the same switch (`BENCH_SWITCHED_OFF`,
applied by the baseline app as each process starts, `switched_off` below):
- `as_is`: the product as it is;
- `limits_copy`: no copy of the limits per process (approvals/intake.py): the statement that
  authenticates a request reads no limits' version, and each request reads its limit;
- `grant_cache`: no grant cache (ledger/grants.py): each request and each claim reads the
  agent's grant.
On `surety_bench` (fresh; a refund EUR limit of 500 set, which the requests' 25.00 stays under,
so the limits are read and nothing is held) with the provider on `surety_bench_provider`, Redis
DB 15. Rounds (`--rounds 3`) go through the ways in turn, each round starting one way further on,
one gunicorn up at a time: (b) and (c)
of `python -m bench` (bench/__main__.py's `figure_a_b_c`), then (d) with `--actions` actions
(`figure_d`). Prints each figure's throughput and CPU time per request (what others' load on a
shared machine barely moves), each way's ratio to `as_is`, and, in-process with the switch on
(bench/probe.py), the SQL statements per request and a request's median wall and CPU time, also
in rounds; writes artifacts/bench-mechanisms.json.
"""

import argparse
import contextlib
import importlib
import os
import statistics
import tempfile
from pathlib import Path
from unittest import mock

from .results import write_results

WAYS = ["as_is", "limits_copy", "grant_cache"]
FIGURES = [("b_action_new", "(b) POST actions, new keys"), ("c_action_replay", "(c) POST actions, replayed keys"),
           ("d_end_to_end", "(d) actions end to end, 2 workers")]


class _Forgets(dict):
    """A cache that holds nothing: every look-up misses and is read afresh."""

    def __contains__(self, key):
        return False


def _no_limits_version():
    from django.db.models import IntegerField, Value

    return Value(None, output_field=IntegerField())


SWITCHES = {  # way -> (module, name, the plain code's value)
    "limits_copy": [("approvals.intake", "version_expression", _no_limits_version)],
    "grant_cache": [("ledger.grants", "_checked", _Forgets())],
}


@contextlib.contextmanager
def switched_off(way):
    """The mechanism of `way` switched off while inside (none for `as_is`); the compiled
    statements and caches are emptied on the way in and out, so none outlives its switch."""
    from ledger.compiled import clear_caches

    with contextlib.ExitStack() as stack:
        for module, name, value in SWITCHES.get(way, []):
            stack.enter_context(mock.patch(f"{module}.{name}", value))
        clear_caches()
        try:
            yield
        finally:
            clear_caches()


def switch_off_for_process():
    """In a served process (bench.baseline's ready(), before any request): the way named by
    BENCH_SWITCHED_OFF, for good."""
    for module, name, value in SWITCHES.get(os.environ.get("BENCH_SWITCHED_OFF"), []):
        setattr(importlib.import_module(module), name, value)


def say(*parts):
    print(*parts, flush=True)


def sqlite_triggers(args, logs):
    """`--sqlite`: on a fresh SQLite file, in-process (bench/probe.py, one request at a time),
    the API's requests with the SQLite triggers (ledger/dbrules.py and each app's) and with them
    dropped, interleaved (`--rounds`): what a Python check in their place could save at most,
    since it would run the same look-ups from Python."""
    import django

    from . import probe
    from .__main__ import GRANTS
    from .stack import STACK_ENV, Stack

    url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='bench-sqlite-')) / 'db.sqlite3'}"
    stack = Stack(logs, gunicorn_workers=1, gunicorn_threads=1, env={"DATABASE_URL": url})
    stack.migrate()
    token = stack.create_agent("bench", GRANTS)
    os.environ.update({**STACK_ENV, "DATABASE_URL": url})
    django.setup()
    from django.db import connection

    from approvals.dbrules import RULES as APPROVALS_RULES
    from dlq.dbrules import RULES as DLQ_RULES
    from ledger.dbrules import RULES, for_vendor

    triggers = for_vendor([*RULES, *APPROVALS_RULES, *DLQ_RULES], "sqlite")
    connection.ensure_connection()
    sql = {"triggers": "".join(t.create_sql() for t in triggers),
           "no_triggers": "".join(f"DROP TRIGGER IF EXISTS {t.name};" for t in triggers)}
    timing = {way: [] for way in sql}
    statements = {}
    for round_no in range(args.rounds):
        for way in (list(sql) if round_no % 2 == 0 else list(sql)[::-1]):
            connection.connection.executescript(sql[way])
            timing[way].append(probe.cpu_per_request(token))
            statements[way] = {name: shape["queries"] for name, shape in probe.query_counts(token).items()
                               if name in ("action_new", "action_replay")}
    connection.connection.executescript(sql["triggers"])
    results = {}
    say(f"\nSQLite, in-process, {len(triggers)} triggers; median over {args.rounds} rounds of each round's median "
        "of 200 requests:")
    for name in ("action_new", "action_replay"):
        results[name] = {way: round(statistics.median(r[name]["cpu_ms"] for r in timing[way]), 3) for way in sql}
        results[name]["over_triggers"] = round(results[name]["no_triggers"] / results[name]["triggers"], 3)
        say(f"  {name:<14} CPU {results[name]['triggers']} ms with the triggers, {results[name]['no_triggers']} ms "
            f"without: x{results[name]['over_triggers']}; statements {statements['triggers'][name]} / "
            f"{statements['no_triggers'][name]}   [rounds {[r[name]['cpu_ms'] for r in timing['triggers']]} / "
            f"{[r[name]['cpu_ms'] for r in timing['no_triggers']]}]")
    return {"cpu_ms_per_request": results, "statements_per_request": statements, "rounds": timing}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench mechanisms", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=6.0, help="seconds measured per HTTP figure, way and round (default 6)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per HTTP figure, way and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--actions", type=int, default=600, help="actions for (d) per way and round (default 600)")
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")
    p.add_argument("--sqlite", action="store_true",
                   help="instead: the SQLite triggers against none, in-process on a SQLite file (no server)")
    p.add_argument("--out", default="artifacts/bench-mechanisms.json")
    args = p.parse_args(argv)
    from .stack import ROOT

    os.chdir(ROOT)
    out = Path(args.out)
    logs = out.parent / "bench-mechanisms-logs"
    logs.mkdir(parents=True, exist_ok=True)
    if args.sqlite:
        results = sqlite_triggers(args, logs)
        out = out.with_name(out.stem + "-sqlite.json")
        write_results(out, {"args": vars(args), **results})
        say(f"\nwritten to {out}")
        return 0
    ways = args.ways.split(",")
    if "as_is" not in ways or set(ways) - set(WAYS):
        p.error(f"--ways: as_is and any of {', '.join(WAYS[1:])}")

    from . import probe
    from .__main__ import GRANTS, combine, figure_a_b_c, figure_d, setup_django
    from .cpu import CpuMonitor
    from .stack import PROVIDER_DB_NAME, Stack, flush_redis, reset_database, wait_for_connection_slots

    free, limit = wait_for_connection_slots(60)
    say(f"bench mechanisms: ways {', '.join(ways)}; {args.rounds} rounds; {free} of {limit} PostgreSQL connections free")
    flush_redis()
    reset_database()
    reset_database(PROVIDER_DB_NAME)
    for way in ways:
        (logs / way).mkdir(exist_ok=True)
    first = Stack(logs / "as_is", gunicorn_workers=2, gunicorn_threads=8, provider_database=PROVIDER_DB_NAME)
    stacks = {way: first if way == "as_is" else Stack(logs / way, gunicorn_workers=2, gunicorn_threads=8,
                                                      provider_url=first.provider_url,
                                                      env={"BENCH_SWITCHED_OFF": way})
              for way in ways}
    per_round = argparse.Namespace(**{**vars(args), "only": "bc", "rounds": 1})  # figure_a_b_c's, one round a call
    rounds = {way: [] for way in ways}
    statements, in_process = {}, {way: [] for way in ways}
    try:
        first.migrate()
        token = first.create_agent("bench", GRANTS)
        setup_django()
        from approvals.models import Limit

        Limit.objects.create(action_type="refund", currency="EUR", max_amount=500)
        first.start_provider()
        for way in ways:  # in-process, one at a time: statements per request with the switch
            with switched_off(way):
                shapes = probe.query_counts(token)
            statements[way] = {name: shapes[name]["queries"] for name in ("action_new", "action_replay")}
        for round_no in range(args.rounds):  # and the median time of a request, one at a time
            turn = round_no % len(ways)
            for way in ways[turn:] + ways[:turn]:
                with switched_off(way):
                    in_process[way].append(probe.cpu_per_request(token))
        provider = {pid: part for pid, part in first.named_pids().items() if part == "provider"}
        for round_no in range(1, args.rounds + 1):
            # Each round starts one way further on: no way is always the first up after a start.
            turn = (round_no - 1) % len(ways)
            for way in ways[turn:] + ways[:turn]:
                stack = stacks[way]
                say(f"\n=== round {round_no}, {way}")
                stack.start_server()
                monitor = CpuMonitor(lambda stack=stack: {**stack.named_pids(), **provider},
                                     databases={PROVIDER_DB_NAME: "provider_postgres"})
                figures = {}
                try:
                    figure_a_b_c(stack, token, per_round, figures, logs, monitor, tag=f"{way}{round_no}-")
                    figure_d(stack, token, args, figures, monitor, tag=f"{way}{round_no}-")
                finally:
                    stack.stop("gunicorn")
                rounds[way].append(figures)
    finally:
        for stack in stacks.values():
            stack.stop_all()
    results = summary(ways, rounds, statements, combine)
    medians = in_process_summary(ways, in_process)
    write_results(out, {"args": vars(args), "statements_per_request": statements,
                        "in_process_ms_per_request": medians, "results": results})
    say(f"\nwritten to {out} (process logs: {logs})")
    return 0


def summary(ways, rounds, statements, combine):
    """Each way's figures over its rounds, and its ratio to `as_is`: throughput, and CPU per
    request (the plain code's over the mechanism's: above 1, the mechanism saves CPU)."""
    results = {}
    for way in ways:
        results[way] = figures = {}
        for name, label in FIGURES[:2]:
            figures[name] = combine(name, label, [s for r in rounds[way] for s in r[name]["rounds"]])
        d = [r["d_end_to_end"] for r in rounds[way]]
        figures["d_end_to_end"] = {"ok_rps": round(statistics.median(r["ok_rps"] for r in d), 1),
                                   "rounds_ok_rps": [r["ok_rps"] for r in d],
                                   "cpu_ms_per_request": {"total": round(statistics.median(
                                       r["cpu_ms_per_request"]["total"] for r in d), 3)}}
    say("\n" + "=" * 78 + "\nSUMMARY (CPU ms per request: Surety's server, workers and PostgreSQL; ratios over as_is)")
    for name, label in FIGURES:
        base = results["as_is"][name]
        for way in ways:
            fig = results[way][name]
            rps, ms = fig["ok_rps"], fig["cpu_ms_per_request"]["total"]
            line = f"  {label:<36} {way:<17} {rps:>8.1f}/s  CPU {ms:>6.3f} ms"
            if way != "as_is":
                fig["over_as_is"] = {"throughput": round(rps / base["ok_rps"], 3),
                                     "cpu_per_request": round(ms / base["cpu_ms_per_request"]["total"], 3)}
                line += (f"   throughput x{fig['over_as_is']['throughput']:.3f}, "
                         f"CPU per request x{fig['over_as_is']['cpu_per_request']:.3f}")
            say(line + f"   [rounds {', '.join(str(r) for r in fig['rounds_ok_rps'])}]")
    for way in ways:
        say(f"  statements per request in-process, {way:<17} new key {statements[way]['action_new']}, "
            f"replay {statements[way]['action_replay']}")
    return results


def in_process_summary(ways, in_process):
    """Each way's median over its rounds of a request's median wall and CPU time in-process
    (bench/probe.py: one request at a time, so a load that comes and goes moves it least)."""
    medians = {}
    say("  in-process, one request at a time (median over rounds of the median of 200; PostgreSQL's and Redis's "
        "own CPU not counted, their round trips in the wall time):")
    for name in ("action_new", "action_replay"):
        for way in ways:
            m = medians.setdefault(way, {})[name] = {
                unit: round(statistics.median(r[name][unit] for r in in_process[way]), 3) for unit in ("wall_ms", "cpu_ms")}
            line = f"    {name:<14} {way:<17} wall {m['wall_ms']:>6.3f} ms  CPU {m['cpu_ms']:>6.3f} ms"
            if way != "as_is":
                base = medians["as_is"][name]
                m["over_as_is"] = {unit: round(m[unit] / base[unit], 3) for unit in ("wall_ms", "cpu_ms")}
                line += f"   wall x{m['over_as_is']['wall_ms']:.3f}, CPU x{m['over_as_is']['cpu_ms']:.3f}"
            say(line + f"   [CPU rounds {', '.join(str(r[name]['cpu_ms']) for r in in_process[way])}]")
    return medians


if __name__ == "__main__":
    raise SystemExit(main())
