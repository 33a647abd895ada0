"""Sweepers as a deployment runs them: `manage.py sweep` processes on the test database and this
run's Redis, one per host, killed and cut off from the database and Redis mid-run.

1. Three sweepers elect one leader per step: each step is run by one of them only (counted in
   the sweepers' logs, a line per step run), the leader SIGKILLed hands over within a few
   seconds to a survivor, which then runs it alone; the audit chain holds.
2. A sweeper whose Redis connections are killed and whose database connections are terminated
   (and refused for a while, as in a failover: the database's for 3 s, Redis's from the 2nd for
   longer than redis-py retries) keeps running, logs the outage once, and rings for the work posted
   meanwhile, whose drain jobs Redis lost: it all ends succeeded.
"""

import io
import json
import os
import subprocess
import time
from collections import Counter
from datetime import datetime

import httpx
import pytest
import redis
from django.core.management import call_command
from django.db import connection

from console.sweeper import STEPS
from ledger.models import Action, ActionStatus, AuditEvent, ChainWalk, StepLease
from tests.client.proxy import SwitchableRelay
from tests.conftest import PYTHON, REDIS_URL, ROOT, wait_until
from tests.factories import agent_api, post_action, refund_body, sandbox_list

pytestmark = pytest.mark.chaos

INTERVAL, LEASE = 0.3, 1.5
# redis-py retries a failed command 3 times, up to 2, 4 and 8 s apart: a shorter outage may go unseen.
REDIS_CUT_SECONDS = 15
ELECTED = {"actions_expired", "tasks_expired", *(name for name, _ in STEPS), "audit_sealed",
           "audit_verified", "audit_walked", "partitions_made"}


def leases():
    return {lease.step: lease for lease in StepLease.objects.all()}


def leader_pid(lease):
    return int(lease.holder.split(":")[1])  # "host:pid:nonce"


def led_by(pids):
    """Every elected step has a lease, held by one of `pids`."""
    now = leases()
    return set(now) >= ELECTED and all(leader_pid(now[step]) in pids for step in ELECTED)


def who_ran(seconds, sweepers):
    """For `seconds`, which sweepers ran each elected step and how often (their "ran STEP"
    lines): {step: {pid: runs}}. Elected, a step is run by its leader alone; without the
    election, by all of them. (Not a rate: a sweeper sleeps its interval after a pass, so how
    many passes fit in the window depends on how loaded the machine is.)"""
    started = datetime.now()
    time.sleep(seconds)
    ended = datetime.now()
    ran = {step: Counter() for step in ELECTED}
    for process in sweepers:
        for line in process.log.read_text().splitlines():
            stamp, _, rest = line.partition(" DEBUG surety.sweeper ran ")
            step = rest.partition(":")[0]
            if step in ran and started <= datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f") <= ended:
                ran[step][process.pid] += 1
    return {step: dict(runs) for step, runs in ran.items()}


def post_refunds(client, prefix, count):
    keys = [f"refund:ORD-{prefix}{i}:full:dec-{prefix}{i}" for i in range(count)]
    for i, key in enumerate(keys):  # one order and customer each: no action holds another
        response = post_action(client, key, refund_body(f"ORD-{prefix}{i}", customer=f"CUST-{prefix}{i}",
                                                        decision=f"dec-{prefix}{i}"))
        assert response.status_code == 201, response.text
    return keys


def all_succeeded(keys):
    return Action.objects.filter(operation_key__in=keys, status=ActionStatus.SUCCEEDED).count() == len(keys)


def test_three_sweepers_run_each_step_by_one_of_them_and_another_leads_soon_after_the_leader_is_killed(
        stack, tmp_path):
    client = agent_api(stack.url, "sweepers", grants=("refund",))
    stack.start_worker()
    processes = {process.pid: process for process in (
        stack.start_sweeper(INTERVAL, log=tmp_path / f"sweeper-{i}.log", SWEEP_LEASE_SECONDS=LEASE, LOG_LEVEL="DEBUG")
        for i in range(3))}
    started = list(processes.values())
    wait_until(lambda: led_by(set(processes)), seconds=30, message="every step to be led")
    keys = post_refunds(client, "L", 5)  # audit events for the leaders to seal

    # 1. Three sweepers, each a pass every INTERVAL: each step is run, by one of them.
    steady = who_ran(3, started)
    # 2. The leader (of every step, or of some) SIGKILLed: the next sweeper's pass takes its leases.
    # The leases may be spread over all three: then the one that leads the fewest steps is spared,
    # or no sweeper would be left to take them over.
    held = Counter(leader_pid(lease) for step, lease in leases().items() if step in ELECTED)
    leaders = set(held) - ({min(held, key=held.get)} if set(held) == set(processes) else set())
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        killed_at = cursor.fetchone()[0]
    kill_started = time.monotonic()
    for pid in leaders:
        stack.kill_sweeper(processes.pop(pid))
    survivors = set(processes)

    def handed_over():
        now = leases()
        return led_by(survivors) and all(now[step].ran_at > killed_at for step in ELECTED)

    wait_until(handed_over, seconds=15, interval=0.05, message="the survivors to lead every step")
    handover = time.monotonic() - kill_started
    keys += post_refunds(client, "M", 5)
    after = who_ran(3, started)
    wait_until(lambda: all_succeeded(keys), seconds=30, message="the refunds to succeed")
    wait_until(lambda: not AuditEvent.objects.filter(seq__isnull=True).exists(), seconds=10,
               message="the leaders to seal every event")
    call_command("audit_verify", "--whole", stdout=io.StringIO())  # a break exits with CommandError
    walk = ChainWalk.objects.first()

    figures = {"sweepers": 3, "interval_s": INTERVAL, "lease_s": LEASE, "leaders_killed": len(leaders),
               "handover_s": round(handover, 2), "runs_before": steady, "runs_after": after,
               "chain": str(walk)}
    print(f"\nsweepers figures: {json.dumps(figures, indent=2)}")
    # Without the election, every sweeper would run every step.
    for step in ELECTED:
        assert len(steady[step]) == 1 and set(steady[step]) <= set(p.pid for p in started), (step, steady)
        assert len(after[step]) == 1 and set(after[step]) <= survivors, (step, after)
    assert handover <= LEASE + 3, handover
    assert all(process.poll() is None for process in processes.values()), "a surviving sweeper exited"
    assert walk.broken_at is None and walk.events == AuditEvent.objects.count(), walk


@pytest.fixture
def sweeper_role():
    """A database role of the sweeper's own (the test database's owner's rights), so that the
    test can refuse its connections, and only its, for a while."""
    role = f"{connection.settings_dict['NAME']}_sweeper"
    with connection.cursor() as cursor:
        cursor.execute(f'DROP ROLE IF EXISTS "{role}"')
        cursor.execute(f'CREATE ROLE "{role}" LOGIN SUPERUSER')
    yield role
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER ROLE "{role}" NOLOGIN')
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])
        wait_until(lambda: not _backends_of(role), seconds=10, message="the role's sessions to end")
        cursor.execute(f'DROP ROLE "{role}"')


def _backends_of(role):
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role])
        return cursor.fetchone()[0]


def cut_off(role):
    """The role may no longer log in, and every session of it is terminated: its next
    statement fails, and so does every reconnection, until `restore`."""
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER ROLE "{role}" NOLOGIN')
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = %s", [role])
        return cursor.fetchone()[0]


def restore(role):
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER ROLE "{role}" LOGIN')


@pytest.fixture
def redis_relay():
    """A relay to this run's Redis for one process (its REDIS_URL is `url`): cut, Redis is
    unreachable for that process alone, until it is restored."""
    upstream = redis.Redis.from_url(REDIS_URL).connection_pool.connection_kwargs
    relay = SwitchableRelay(upstream.get("host", "127.0.0.1"), upstream["port"])
    relay.url = f"redis://127.0.0.1:{relay.port}/{upstream['db']}"
    yield relay
    relay.close()


def kill_redis_clients():
    """CLIENT KILL every connection to this run's Redis database (the web app's, the workers',
    the sweeper's) but this one; how many. Other databases' clients are left alone."""
    client = redis.Redis.from_url(REDIS_URL)
    me, db = client.client_id(), client.connection_pool.connection_kwargs["db"]
    victims = [c["id"] for c in client.client_list() if int(c["db"]) == db and int(c["id"]) != me]
    for victim in victims:
        client.client_kill_filter(_id=victim)
    return len(victims)


def test_a_sweeper_whose_redis_and_database_connections_die_keeps_running_and_rings_for_the_work_posted_meanwhile(
        stack, sweeper_role, redis_relay, tmp_path):
    client = agent_api(stack.url, "outage", grants=("refund",))
    worker = stack.start_worker()
    database_url = stack.env["DATABASE_URL"].replace("postgres://postgres@", f"postgres://{sweeper_role}@")
    assert sweeper_role in database_url
    sweeper = stack.start_sweeper(INTERVAL, log=tmp_path / "sweeper.log", SWEEP_LEASE_SECONDS=LEASE,
                                  DATABASE_URL=database_url, REDIS_URL=redis_relay.url, SWEEP_BACKOFF_MAX_SECONDS=0.5)
    wait_until(lambda: led_by({sweeper.pid}), seconds=30, message="the sweeper to lead")
    figures = {"redis_clients_killed": kill_redis_clients()}  # while it works: redis-py reconnects
    keys = post_refunds(client, "A", 10)

    # 1. Mid-run: the sweeper's sessions terminated and refused, every client of this Redis
    #    database killed, the worker SIGKILLed, and Redis's data (the drain jobs, the doorbells)
    #    lost; after 2 s the sweeper's Redis is cut off too, and 1 s later the database is back.
    outage_started = time.monotonic()

    def at(second):
        time.sleep(max(0.0, second - (time.monotonic() - outage_started)))

    figures["sweeper_sessions_terminated"] = cut_off(sweeper_role)
    figures["redis_clients_killed"] += kill_redis_clients()
    stack.kill_worker(worker)
    redis.Redis.from_url(REDIS_URL).flushdb()
    keys += post_refunds(client, "B", 10)  # rung by the web app, into a Redis about to lose them
    redis.Redis.from_url(REDIS_URL).flushdb()
    figures["redis_clients_killed"] += kill_redis_clients()
    at(2)
    redis_relay.cut()
    at(3)
    restore(sweeper_role)
    # 2. A worker starts, then Redis answers the sweeper again: only the sweeper knows there is work.
    stack.start_worker()
    at(2 + REDIS_CUT_SECONDS)
    assert sweeper.poll() is None, sweeper.log.read_text()
    redis_relay.restore()
    back = time.monotonic()
    figures["outage_s"] = round(back - outage_started, 1)
    wait_until(lambda: all_succeeded(keys), seconds=30, interval=0.2, message="every refund to succeed")
    figures["all_succeeded_after_s"] = round(time.monotonic() - back, 1)
    wait_until(lambda: httpx.get(f"{stack.url}/healthz", timeout=5).status_code == 200, seconds=10,
               message="/healthz to be green")
    figures["healthz_green_after_s"] = round(time.monotonic() - back, 1)

    log = sweeper.log.read_text()
    figures["log_lines_about_the_outage"] = [line.split(" ", 3)[3] for line in log.splitlines()
                                             if "unreachable" in line or "back after" in line]
    print(f"\nsweeper outage figures: {json.dumps(figures, indent=2)}")
    assert sweeper.poll() is None, log
    assert log.count("the database is unreachable") == 1, log
    # The sweeper's own lines (a ring cut off mid-pass may add the doorbell's, once each).
    assert log.count("sweeper: Redis is unreachable") == 1, log
    assert log.count("sweeper: back after") == 1 and "without Redis and the database" in log, log
    assert "Traceback" not in log, log
    refunds = sandbox_list(client, "refunds")
    assert sorted(refund["operation_key"] for refund in refunds) == sorted(keys), "a refund lost or doubled"

def test_a_sweeper_whose_lease_would_lapse_between_its_passes_exits_non_zero_at_once():
    done = subprocess.run([PYTHON, "manage.py", "sweep", "--interval", "5"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "SWEEP_LEASE_SECONDS": "2"}, timeout=60)
    assert done.returncode == 1, done
    assert "SWEEP_LEASE_SECONDS (2) must exceed the interval (5 s)" in done.stderr, done.stderr
