"""Several hosts, simulated: two web servers (two gunicorns), four RQ workers and two sweepers
(`manage.py sweep`, as deploy/ runs them) on one database and one Redis. Refunds are posted to
both servers while workers and the leading sweeper are SIGKILLed at random and started again:
the test is their supervisor, as systemd is in production.

Whatever dies, every refund ends `succeeded` once, with one refund at the sandbox (its own
idempotency off, so only the ledger prevents a second), no answer is a 5xx other than 503, and
the audit chain the sweepers sealed verifies. Some refunds time out after the sandbox committed,
so outcomes go unknown and are verified rather than retried.

What holds it: every claim is a SKIP LOCKED or conditional update fenced by its lease (no effect
twice, however many workers and sweepers); the sweepers' leader election (ledger.locks.StepLease)
only makes steps run once per interval, and this test finds "the leader" (the holder of the seal's
lease) and times each handover (kill to its step's next run elsewhere) by it.

Scale from CHAOS_SCALE ("ci", the default, or "full"), random choices from CHAOS_SEED, as in
test_chaos.py.
"""

import threading
import time
from collections import Counter

import httpx
import pytest
from django.db.models import Count
from django.utils import timezone

from ledger.locks import StepLease
from ledger.models import Action, AuditEvent
from tests.chaos.runs import chaos_scale, publish
from tests.conftest import serving, wait_until
from tests.factories import agent_api, api_client, refund_body, sandbox, sandbox_list, sandbox_without_idempotency

pytestmark = pytest.mark.chaos

SCALES = {
    # refunds, seconds of killing (refunds are posted during its first two thirds), drain bound
    "ci": {"refunds": 60, "chaos_seconds": 18, "drain_seconds": 45},
    "full": {"refunds": 300, "chaos_seconds": 60, "drain_seconds": 180},
}
WORKERS, SWEEPERS = 4, 2
# Two lanes per worker: 12 database connections for the four rather than 20, on a PostgreSQL
# whose 100 connections other test runs share (two gunicorns hold up to 48 more).
WORKER = {"DRAIN_LANES": 2}
KILL_EVERY = 1.5  # seconds between kills, give or take a quarter
LEADER_EVERY = 3  # every third kill is the leading sweeper's
TIMEOUT_SHARE = 0.1  # of the refunds, the sandbox commits and then stalls past the worker's timeout
SWEEPER = {"interval": 0.5, "SWEEP_LEASE_SECONDS": 2}  # a leader's steps are taken over 2 s after it died
SEALING = "audit_sealed"  # the step whose leader is "the leading sweeper"
HANDOVER_BOUND = 5  # seconds from the leader's kill to its step's next run by another


def leader_pid(step=SEALING):
    """The pid of the sweeper whose lease on `step` lasts (its holder is host:pid:nonce)."""
    lease = StepLease.objects.filter(step=step, expires_at__gt=timezone.now()).first()
    return lease and int(lease.holder.split(":")[1])


def busy_worker_pids():
    """Workers (lease owner host:pid) now calling the sandbox."""
    owners = Action.objects.filter(status="pending").values_list("lease_owner", flat=True)
    return {int(owner.rpartition(":")[2]) for owner in owners if owner.rpartition(":")[2].isdigit()}


def post_all(client, keys, bodies, until, answers):
    """Post each refund under its key by `until` (evenly spread), retrying as an agent does: the
    same key after a dropped connection or a 503 (after its Retry-After). Every answer's status
    goes to `answers`."""
    started = time.monotonic()
    for i, (key, body) in enumerate(zip(keys, bodies)):
        time.sleep(max(0.0, started + (until - started) * i / len(keys) - time.monotonic()))
        for _ in range(20):
            try:
                response = client.post("/api/v1/actions", json=body, headers={"Idempotency-Key": key})
            except httpx.TransportError:
                answers.append("dropped")
                time.sleep(0.2)
                continue
            answers.append(response.status_code)
            if response.status_code != 503:
                break
            answers.append("retry-after" if response.headers.get("Retry-After") else "503 without Retry-After")
            time.sleep(min(1.0, float(response.headers.get("Retry-After") or 1)))


def test_two_web_servers_four_workers_and_two_sweepers_killed_at_random_make_each_refund_once(stack):
    scale_name, scale, seed, rng = chaos_scale(SCALES)
    n = scale["refunds"]

    client = agent_api(stack.url, "hosts", grants=("refund",))
    sandbox_without_idempotency(client)
    orders = [f"ORD-H{i:04d}" for i in range(n)]
    keys = [f"refund:{order}:full:dec-h{i}" for i, order in enumerate(orders)]
    bodies = [refund_body(order, customer=f"CUST-H{i:04d}", decision=f"dec-h{i}") for i, order in enumerate(orders)]
    stalled = rng.sample(orders, round(n * TIMEOUT_SHARE))
    for order in stalled:
        armed = sandbox(client, "POST", "faults", json={"target": order, "fault": "timeout_after_commit", "times": 1})
        assert armed.status_code == 201, armed.text

    # The second host's web server: the same database, Redis and sandbox.
    with serving(stack.env["DATABASE_URL"], SANDBOX_BASE_URL=stack.env["SANDBOX_BASE_URL"]) as second:
        other = api_client(second.url, client.token)  # the same agent, through the second host
        webs = [client, other]
        for _ in range(WORKERS):
            stack.start_worker(**WORKER)
        for _ in range(SWEEPERS):
            stack.start_sweeper(**SWEEPER)
        figures = {"scale": scale_name, "seed": seed, "refunds": n, "timeouts_after_commit": len(stalled),
                   "web_servers": len(webs), "workers": WORKERS, "sweepers": SWEEPERS, "worker_kills": 0,
                   "worker_kills_while_busy": 0, "leader_kills": 0, "handover_seconds": [],
                   "workers_exited_on_their_own": 0, "sweepers_exited_on_their_own": 0}
        handovers = []  # when each killed leader died, until another sweeper runs its step

        def restart_exited():
            """Start again a process that ended by itself (counted)."""
            for group, start, kind in ((stack.workers, lambda: stack.start_worker(**WORKER), "workers"),
                                       (stack.sweepers, lambda: stack.start_sweeper(**SWEEPER), "sweepers")):
                for process in [p for p in group if p.poll() is not None]:
                    group.remove(process)
                    start()
                    figures[f"{kind}_exited_on_their_own"] += 1

        def kill_the_leader():
            pid = leader_pid()
            victim = next((s for s in stack.sweepers if s.pid == pid), None)
            if victim is None:
                return False  # its lease lapsed meanwhile: nobody leads now
            stack.kill_sweeper(victim)
            handovers.append((timezone.now(), victim.pid))  # after the kill: no pass of its own counts
            stack.start_sweeper(**SWEEPER)
            figures["leader_kills"] += 1
            return True

        def kill_a_worker(now):
            """SIGKILL a worker calling the sandbox (waiting up to a second for one: killing idle
            workers proves little), else any."""
            busy = busy_worker_pids() & {w.pid for w in stack.workers}
            if not busy and now < next_kill + 1:
                return False
            victim = rng.choice([w for w in stack.workers if w.pid in busy] or stack.workers)
            figures["worker_kills_while_busy"] += victim.pid in busy
            stack.kill_worker(victim)
            stack.start_worker(**WORKER)
            figures["worker_kills"] += 1
            return True

        def note_handover():
            """Once another sweeper ran the killed leader's step: the seconds since the kill."""
            lease = StepLease.objects.get(step=SEALING)
            if handovers and lease.ran_at > handovers[0][0] and int(lease.holder.split(":")[1]) != handovers[0][1]:
                killed_at, _ = handovers.pop(0)
                figures["handover_seconds"].append(round((lease.ran_at - killed_at).total_seconds(), 1))

        # 1. The load, from two agents' threads (one per web server), while this thread kills.
        wait_until(leader_pid, seconds=30, message="a sweeper to lead")
        started = time.monotonic()
        chaos_until = started + scale["chaos_seconds"]
        answers = [[], []]
        posters = [threading.Thread(target=post_all, args=(web, keys[i::2], bodies[i::2],
                                                           started + scale["chaos_seconds"] * 2 / 3, answers[i]))
                   for i, web in enumerate(webs)]
        for poster in posters:
            poster.start()
        next_kill = started + KILL_EVERY * rng.uniform(0.5, 1.0)
        while (now := time.monotonic()) < chaos_until:
            note_handover()
            leader_next = (figures["worker_kills"] + figures["leader_kills"]) % LEADER_EVERY == LEADER_EVERY - 1
            # One leader dies at a time: the next kill waits until another sweeper took over.
            if now >= next_kill and not handovers and (leader_next and kill_the_leader() or kill_a_worker(now)):
                next_kill = now + KILL_EVERY * rng.uniform(0.75, 1.25)
            restart_exited()
            time.sleep(0.05)
        for poster in posters:
            poster.join(60)
        figures["chaos_seconds"] = round(time.monotonic() - started, 1)

        # 2. Drain: nothing is killed any more; the workers and sweepers settle every refund.
        def all_settled():
            restart_exited()
            note_handover()
            return Action.objects.filter(status="succeeded").count() == n and not handovers

        try:
            wait_until(all_settled, seconds=scale["drain_seconds"], interval=0.2, message="every refund to succeed")
        finally:
            figures["drain_seconds"] = round(max(0.0, time.monotonic() - started - figures["chaos_seconds"]), 1)
            actions = {a.operation_key: a for a in Action.objects.all()}
            refunds = {order: sandbox_list(client, "refunds", order_id=order) for order in orders}
            successes = Counter(dict(AuditEvent.objects.filter(verb="succeeded", object_type="ledger.action")
                                     .values_list("object_id").annotate(n=Count("id")).values_list("object_id", "n")))
            statuses = Counter(answer for both in answers for answer in both)
            figures.update({
                "answers": {str(status): count for status, count in sorted(statuses.items(), key=str)},
                "answers_per_web_server": [sum(1 for a in both if isinstance(a, int) and a < 300) for both in answers],
                "states": dict(Counter(a.status for a in actions.values())),
                "sandbox_refunds": sum(map(len, refunds.values())),
                "outcomes_found_unknown": AuditEvent.objects.filter(verb="outcome_unknown").count(),
                "step_runs": dict(StepLease.objects.values_list("step", "runs")),
            })
            publish(figures, "chaos-hosts")

        # Both hosts look healthy again: a worker and a sweeper seen, the database and Redis up.
        for web in webs:
            wait_until(lambda: web.get("/healthz").status_code == 200, seconds=10, message=f"{web.base_url}/healthz")
        other.close()  # a connection kept alive would hold the server's shutdown

    # 3. The guarantees.
    assert sorted(actions) == sorted(keys), "a refund was lost, or one appeared that nobody asked for"
    assert all(action.status == "succeeded" for action in actions.values()), figures["states"]
    for key, order in zip(keys, orders):
        assert [r["id"] for r in refunds[order]] == [actions[key].external_ref], (order, refunds[order])
        assert refunds[order][0]["operation_key"] == key
        assert successes[str(actions[key].pk)] == 1, (key, "succeeded events", successes[str(actions[key].pk)])
    server_errors = {status: count for status, count in statuses.items() if isinstance(status, int) and status >= 500}
    assert set(server_errors) <= {503}, server_errors
    assert "503 without Retry-After" not in statuses
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None, "the audit chain is broken"
    assert figures["sweepers_exited_on_their_own"] == 0, "a sweeper died of the chaos"
    assert figures["leader_kills"] >= 1 and figures["worker_kills_while_busy"] >= 1, figures
    assert len(figures["handover_seconds"]) == figures["leader_kills"]
    assert max(figures["handover_seconds"]) <= HANDOVER_BOUND, figures["handover_seconds"]
