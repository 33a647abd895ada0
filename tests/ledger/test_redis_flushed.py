"""Redis is a delivery mechanism, not a store: flush it and the sweeper brings every action back."""

import time

import redis
from rq import Worker

from console.sweeper import sweep_once
from ledger.models import Action, ActionStatus
from tests.conftest import REDIS_URL, wait_until
from tests.factories import agent_api, post_action, refund_body, sandbox

S = ActionStatus
COUNT = 20


def test_actions_whose_jobs_were_flushed_from_redis_all_run_once_after_a_sweep(stack):
    client = agent_api(stack.url)
    keys = [f"refund:ORD-F{i}:full:dec-{i}" for i in range(COUNT)]
    for i, key in enumerate(keys):
        # One order and one customer each, so that no action holds another.
        response = post_action(client, key, refund_body(f"ORD-F{i}", customer=f"CUST-F{i}"))
        assert response.status_code == 201, response.text
        assert response.json()["status"] == "queued"

    connection = redis.Redis.from_url(REDIS_URL)
    connection.flushdb()
    stack.start_worker()
    stack.start_worker()

    wait_until(lambda: len(Worker.all(connection=connection)) == 2, message="two workers to be up")
    time.sleep(1)  # up and idle: nothing tells them there is work
    assert Action.objects.filter(status=S.QUEUED).count() == COUNT
    assert sandbox(client, "GET", "refunds").json()["data"] == []

    def all_succeeded():
        sweep_once()
        return Action.objects.filter(status=S.SUCCEEDED).count() == COUNT

    wait_until(all_succeeded, seconds=30, interval=0.5, message="every action to succeed")

    refunds = sandbox(client, "GET", "refunds").json()["data"]
    assert sorted(r["operation_key"] for r in refunds) == sorted(keys)
    by_key = {a.operation_key: a for a in Action.objects.all()}
    for refund in refunds:
        action = by_key[refund["operation_key"]]
        assert (action.external_ref, action.attempts) == (refund["id"], 1)
