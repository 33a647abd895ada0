"""Named actors and small helpers shared by the tests."""

import threading
import time

import httpx
from django.db import connection

from ledger.agents import agent_create
from ledger.models import StepStatus, TaskStep
from ledger.tasks import task_request


def make_agent(name, grants=("refund", "send_message", "create_booking")):
    """Returns (agent, token)."""
    return agent_create(name, actor="system:tests", grants=grants)


def api_client(base_url, token):
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def send_together(url, token, sends):
    """Call every `send(client)` at the same moment, each on a connection and thread of its
    own (all connect first, then a barrier releases them); return the answers in order. One
    that raised fails the test with its exception."""
    barrier = threading.Barrier(len(sends))
    answers = [None] * len(sends)

    def run(i, send):
        try:
            with api_client(url, token) as client:
                client.get("/api/v1/schema")  # connect first, so the barrier releases ready sockets
                barrier.wait(60)
                answers[i] = send(client)
        except Exception as exc:  # noqa: BLE001 (reported below, with the others)
            answers[i] = exc
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i, send)) for i, send in enumerate(sends)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    failed = [a for a in answers if not isinstance(a, httpx.Response)]
    assert not failed, f"{len(failed)} of {len(sends)} requests did not come back: {failed[:3]!r}"
    return answers


def another_waits_for_a_lock(seconds=5):
    """Whether, within `seconds`, another connection to this database waits for a lock (a
    row, an advisory lock, a unique key being written): what a test racing two transactions
    waits for before it lets the first one commit, instead of a sleep (PostgreSQL)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            if cursor.fetchone():
                return True
        time.sleep(0.01)
    return False


def refund_body(order="ORD-8841", amount="25.00", currency="EUR", customer="CUST-17", **extra):
    return {"action_type": "refund", "target": order, "customer": customer, "decision_id": "dec-77",
            "params": {"amount": amount, "currency": currency, **extra}}


def post_action(client, key, body):
    return client.post("/api/v1/actions", json=body, headers={"Idempotency-Key": key})


def sandbox(client, method, path, **kwargs):
    return client.request(method, f"/sandbox/v1/{path}", **kwargs)


def sandbox_list(client, kind, **params):
    """What the sandbox provider holds: its `kind` ("refunds", "messages", "bookings") matching `params`."""
    response = sandbox(client, "GET", kind, params=params)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def refund_input(order, customer, amount="25.00"):
    return {"order_id": order, "amount": amount, "currency": "EUR", "customer": customer}


def refund_task_body(order="ORD-8841", amount="25.00", customer="CUST-17"):
    return {"workflow": "refund", "input": refund_input(order, customer, amount)}


def post_task(client, task_id, body):
    return client.post("/api/v1/tasks", json=body, headers={"Idempotency-Key": task_id})


def dead_letter(agent, task_id, *, order=None, customer=None, done=None):
    """A refund task that ran out of attempts, made in this process: claimed once, optionally
    with steps already done in its checkpoint (`done`: step name -> result), then dead-lettered."""
    task, _ = task_request(agent=agent, task_id=task_id, workflow="refund",
                           input=refund_input(order or f"ORD-{task_id}", customer or f"CUST-{task_id}"))
    task.claim(owner="tests:1")
    for name, result in (done or {}).items():
        TaskStep.objects.filter(task=task, name=name).update(status=StepStatus.DONE, result=result)
    error = {"code": "crash", "message": "the worker gave up", "retryable": True, "step": "call_refund_api"}
    return task.mark_dead_lettered(actor="system:tests", error=error)
