"""`python -m bench mechanisms`: each hand-made mechanism for speed against the plain code it
stands in for (the mechanism switched off), side by side in one run.

Ways, each its own gunicorn and (d)'s workers, all with the same switch (`BENCH_SWITCHED_OFF`,
applied by the baseline app as each process starts, `switched_off` below):
- `as_is`: the product as it is;
- `doorbell_windows`: no trust window and no linger (ledger/jobs.py): every commit asks Redis
  whether a drain job waits, and a drain ends at its first empty claim;
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
shared machine barely moves), each way's ratio to `as_is`, and the SQL statements per request
in-process (bench/probe.py) with the switch on; writes artifacts/bench-mechanisms.json.
"""

import argparse
import contextlib
import os
import statistics
from pathlib import Path
from unittest import mock

from .results import write_results

WAYS = ["as_is", "doorbell_windows", "limits_copy", "grant_cache"]
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
    "doorbell_windows": [("ledger.jobs", "DOORBELL_TRUST_SECONDS", 0), ("ledger.jobs", "DRAIN_LINGER_SECONDS", 0)],
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
    """In a served process (bench.baseline's ready()): the way named by BENCH_SWITCHED_OFF, for good."""
    way = os.environ.get("BENCH_SWITCHED_OFF")
    if way:
        switched_off(way).__enter__()


def say(*parts):
    print(*parts, flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench mechanisms", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=6.0, help="seconds measured per HTTP figure, way and round (default 6)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per HTTP figure, way and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--actions", type=int, default=600, help="actions for (d) per way and round (default 600)")
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")
    p.add_argument("--out", default="artifacts/bench-mechanisms.json")
    args = p.parse_args(argv)
    ways = args.ways.split(",")
    if "as_is" not in ways or set(ways) - set(WAYS):
        p.error(f"--ways: as_is and any of {', '.join(WAYS[1:])}")

    from . import probe
    from .__main__ import GRANTS, combine, figure_a_b_c, figure_d, setup_django
    from .cpu import CpuMonitor
    from .stack import PROVIDER_DB_NAME, ROOT, Stack, flush_redis, reset_database, wait_for_connection_slots

    os.chdir(ROOT)
    out = Path(args.out)
    logs = out.parent / "bench-mechanisms-logs"
    logs.mkdir(parents=True, exist_ok=True)
    free, limit = wait_for_connection_slots(60)
    say(f"bench mechanisms: ways {', '.join(ways)}; {args.rounds} rounds; {free} of {limit} PostgreSQL connections free")
    flush_redis()
    reset_database()
    reset_database(PROVIDER_DB_NAME)
    first = Stack(logs, gunicorn_workers=2, gunicorn_threads=8, provider_database=PROVIDER_DB_NAME)
    stacks = {way: first if way == "as_is" else Stack(logs, gunicorn_workers=2, gunicorn_threads=8,
                                                      provider_url=first.provider_url,
                                                      env={"BENCH_SWITCHED_OFF": way})
              for way in ways}
    per_round = argparse.Namespace(**{**vars(args), "only": "bc", "rounds": 1})  # figure_a_b_c's, one round a call
    rounds = {way: [] for way in ways}
    statements = {}
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
    write_results(out, {"args": vars(args), "statements_per_request": statements, "results": results})
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


if __name__ == "__main__":
    raise SystemExit(main())
