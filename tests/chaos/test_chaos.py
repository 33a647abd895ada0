"""Chaos: refund tasks under SIGKILLed workers, a flushed Redis and a faulty provider.

Whatever happens, no operation key has more than one effect at the provider, no task is
lost, and every task ends in a state a person can act on. The sandbox's own idempotency is
off, so only the ledger prevents duplicates. The sweeper runs here, in the test process.

Scale from CHAOS_SCALE: "ci" (the default, part of every test run) or "full" (`make chaos`).
CHAOS_SEED replays a run's random choices (faults, which worker dies, when).
"""

import time
from collections import Counter

import httpx
import pytest
import redis

from approvals.models import ReviewItem
from console.sweeper import sweep_once
from dlq.models import DeadLetter
from ledger.models import Action, AuditEvent, Task
from tests.chaos.runs import chaos_scale, publish
from tests.conftest import REDIS_URL
from tests.factories import agent_api, sandbox, sandbox_list, sandbox_order, sandbox_without_idempotency

pytestmark = pytest.mark.chaos

SCALES = {
    # tasks, workers, seconds of killing (tasks are posted during its first two thirds), drain bound
    "ci": {"tasks": 40, "workers": 2, "chaos_seconds": 14, "drain_seconds": 90},
    "full": {"tasks": 200, "workers": 3, "chaos_seconds": 60, "drain_seconds": 300},
}
FAULTS = [("timeout_after_commit", 0.10), ("error_500", 0.10), ("decline", 0.05)]
FINAL = {"succeeded", "failed", "dead_lettered", "waiting"}
KILL_EVERY, SWEEP_EVERY = 2.0, 0.5


def pick_fault(rng):
    roll, edge = rng.random(), 0.0
    for fault, share in FAULTS:
        edge += share
        if roll < edge:
            return fault
    return None


def test_killed_workers_and_a_flushed_redis_never_double_an_effect_or_lose_a_task(stack):
    scale_name, scale, seed, rng = chaos_scale(SCALES)
    n = scale["tasks"]

    client = agent_api(stack.url, "chaos", grants=("refund", "send_message"))
    sandbox_without_idempotency(client)
    orders = [(f"ORD-C{i:04d}", f"CUST-C{i:04d}") for i in range(n)]
    faults = {}
    for order, customer in orders:
        sandbox_order(client, order, customer)
        fault = pick_fault(rng)
        if fault:
            faults[order] = fault
            armed = sandbox(client, "POST", "faults", json={"target": order, "fault": fault, "times": 1})
            assert armed.status_code == 201, armed.text

    workers = [stack.start_worker() for _ in range(scale["workers"])]
    figures = {"scale": scale_name, "seed": seed, "tasks": n, "workers": scale["workers"], "kills": 0, "kills_while_busy": 0,
               "redis_flushes": 0, "workers_exited_on_their_own": 0, "sweeps": 0,
               "faults": dict(Counter(faults.values()))}
    started = time.monotonic()
    chaos_until = started + scale["chaos_seconds"]
    post_window = scale["chaos_seconds"] * 2 / 3
    flush_at = started + scale["chaos_seconds"] / 2
    next_kill = started + KILL_EVERY * rng.uniform(0.5, 1.0)
    next_sweep = started
    posted = {}

    def post(i):
        order, customer = orders[i]
        task_id = f"chaos-{i:04d}"
        body = {"workflow": "refund", "input": {"order_id": order, "amount": "25.00", "currency": "EUR",
                                                "customer": customer}}
        response = None
        for _ in range(5):  # an agent retries a request that did not come back, with the same key
            try:
                response = client.post("/api/v1/tasks", json=body, headers={"Idempotency-Key": task_id})
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert response is not None and response.status_code in (200, 201), response and response.text
        posted[task_id] = response.status_code

    def busy_pids():
        """Workers (lease owner `host:pid`) now running a task or calling a provider."""
        owners = {*Task.objects.filter(state="running").values_list("lease_owner", flat=True),
                  *Action.objects.filter(status="pending").values_list("lease_owner", flat=True)}
        return {int(owner.rpartition(":")[2]) for owner in owners if owner.rpartition(":")[2].isdigit()}

    def restart_exited():
        for process in list(workers):
            if process.poll() is not None:  # died by itself (e.g. confused by the flush)
                stack.workers.remove(process)
                workers.remove(process)
                workers.append(stack.start_worker())
                figures["workers_exited_on_their_own"] += 1

    def sweep_if_due(now):
        nonlocal next_sweep
        if now >= next_sweep:
            sweep_once()
            figures["sweeps"] += 1
            next_sweep = now + SWEEP_EVERY

    # 1. The chaos period: tasks arrive, workers die every ~2 s, Redis is flushed once.
    while (now := time.monotonic()) < chaos_until:
        due = min(n, int(n * (now - started) / post_window) + 1)
        while len(posted) < due:
            post(len(posted))
        # Prefer a worker that holds a lease right now (waiting up to a second for one):
        # killing idle workers proves little.
        busy = busy_pids() if now >= next_kill else set()
        if now >= next_kill and (busy & {w.pid for w in workers} or now >= next_kill + 1):
            victim = rng.choice([w for w in workers if w.pid in busy] or workers)
            figures["kills_while_busy"] += victim.pid in busy
            stack.kill_worker(victim)
            workers.remove(victim)
            workers.append(stack.start_worker())
            figures["kills"] += 1
            next_kill = now + KILL_EVERY * rng.uniform(0.75, 1.25)
        if not figures["redis_flushes"] and now >= flush_at:
            redis.Redis.from_url(REDIS_URL).flushdb()
            figures["redis_flushes"] += 1
        restart_exited()
        sweep_if_due(now)
        time.sleep(0.05)
    while len(posted) < n:
        post(len(posted))
    figures["chaos_seconds"] = round(time.monotonic() - started, 1)

    # 2. Drain: no more killing; the sweeper keeps going until every task has settled.
    drain_until = time.monotonic() + scale["drain_seconds"]
    while time.monotonic() < drain_until:
        if not Task.objects.exclude(state__in=FINAL).exists():
            break
        restart_exited()
        sweep_if_due(time.monotonic())
        time.sleep(0.1)
    figures["drain_seconds"] = round(time.monotonic() - started - figures["chaos_seconds"], 1)
    figures["duration_seconds"] = round(time.monotonic() - started, 1)

    # 3. The figures, then the guarantees.
    tasks = {t.task_id: t for t in Task.objects.all()}
    states = Counter(t.state for t in tasks.values())
    refunds = {order: sandbox_list(client, "refunds", order_id=order) for order, _ in orders}
    messages = {task_id: sandbox_list(client, "messages", operation_key=f"{task_id}:notify_customer:v1")
                for task_id in tasks}
    figures.update({
        "states": dict(states),
        "refunds": sum(map(len, refunds.values())),
        "messages": sum(map(len, messages.values())),
        "max_refunds_per_order": max(map(len, refunds.values()), default=0),
        "max_messages_per_key": max(map(len, messages.values()), default=0),
        "dead_letter_entries": DeadLetter.objects.count(),
        "tasks_taken_back_from_lost_workers": AuditEvent.objects.filter(verb="lease_expired").count(),
        "actions_found_unknown": AuditEvent.objects.filter(verb="outcome_unknown").count(),
    })
    publish(figures, "chaos")

    assert len(posted) == n and sorted(posted) == sorted(tasks), "a task was lost"
    assert len(tasks) == n
    unsettled = {t.task_id: t.state for t in tasks.values() if t.state not in FINAL}
    assert not unsettled, f"not settled within the bound: {unsettled}"
    doubled = {order: [r["id"] for r in found] for order, found in refunds.items() if len(found) > 1}
    assert not doubled, f"orders refunded more than once: {doubled}"
    resent = {key: len(found) for key, found in messages.items() if len(found) > 1}
    assert not resent, f"messages sent more than once: {resent}"
    for task_id, task in tasks.items():
        refund_count, message_count = len(refunds[task.input["order_id"]]), len(messages[task_id])
        if task.state == "succeeded":
            # Done means done exactly once: the effect exists, and it is the ledger's.
            assert (refund_count, message_count) == (1, 1), (task_id, refund_count, message_count)
            assert refunds[task.input["order_id"]][0]["operation_key"] == f"{task_id}:call_refund_api:v1"
        elif task.state == "failed":
            assert task.last_error["code"] == "declined", (task_id, task.last_error)
            assert faults.get(task.input["order_id"]) == "decline", task_id
            assert (refund_count, message_count) == (0, 0), task_id
        elif task.state == "dead_lettered":
            entry = DeadLetter.objects.get(task=task, status="open")
            assert entry.alerts.exists(), f"dead-letter entry of {task_id} has no alert"
        else:  # waiting: for a person, who must have something open to decide
            assert ReviewItem.objects.filter(action__task=task, status="open").exists(), f"{task_id} waits for nobody"
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None, "the audit chain is broken"
    assert figures["kills"] >= scale["chaos_seconds"] / KILL_EVERY / 2
    assert figures["kills_while_busy"] >= 1, "no worker was killed in the middle of work"
