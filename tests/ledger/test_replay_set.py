"""The replay set: what every connector must survive before an agent gets live authority."""

import json
import time

from console.sweeper import sweep_once
from ledger.models import Action, WebhookEvent
from sandbox.webhooks import sign_webhook
from tests.conftest import wait_until
from tests.factories import agent_api, post_action, refund_body, sandbox, sandbox_list, sandbox_without_idempotency


def settled(client, key, seconds=20):
    return wait_until(
        lambda: (a := client.get(f"/api/v1/actions/{key}").json())["status"] not in {"queued", "pending", "unknown"} and a,
        seconds=seconds, message=f"{key} to settle",
    )


def test_the_same_request_twice_returns_the_stored_result(stack):
    client = agent_api(stack.url)
    stack.start_worker()
    first = post_action(client, "refund:ORD-1:full:dec-1", refund_body("ORD-1"))
    assert first.status_code == 201
    done = settled(client, "refund:ORD-1:full:dec-1")
    again = post_action(client, "refund:ORD-1:full:dec-1", refund_body("ORD-1"))
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["external_ref"] == done["external_ref"]
    assert len(sandbox_list(client, "refunds", operation_key="refund:ORD-1:full:dec-1")) == 1


def test_a_timeout_after_commit_is_verified_not_repeated_even_without_provider_idempotency(stack):
    client = agent_api(stack.url)
    sandbox_without_idempotency(client)
    sandbox(client, "POST", "faults", json={"target": "ORD-2", "fault": "timeout_after_commit", "times": 1})
    stack.start_worker()
    posted = post_action(client, "refund:ORD-2:full:dec-2", refund_body("ORD-2"))
    assert posted.status_code == 201, posted.text
    action = settled(client, "refund:ORD-2:full:dec-2")
    assert action["status"] == "succeeded"
    assert action["attempts"] == 1
    refunds = sandbox_list(client, "refunds", operation_key="refund:ORD-2:full:dec-2")
    assert [r["id"] for r in refunds] == [action["external_ref"]]
    evidence = Action.objects.get(operation_key="refund:ORD-2:full:dec-2").evidence
    assert evidence[0]["code"] == "timeout" and evidence[-1]["found"] is True


def test_the_same_webhook_twice_does_nothing_the_second_time(stack):
    client = agent_api(stack.url)
    body = json.dumps({"id": "evt_1", "type": "refund.succeeded", "data": {"id": "re_x"}}).encode()
    headers = {"Sandbox-Signature": sign_webhook(body, "whsec-sandbox-dev"), "Content-Type": "application/json"}
    first = client.post("/webhooks/sandbox/", content=body, headers=headers)
    second = client.post("/webhooks/sandbox/", content=body, headers=headers)
    assert first.status_code == 200 and "duplicate" not in first.json()
    assert second.status_code == 200 and second.json() == {"duplicate": True}
    assert WebhookEvent.objects.count() == 1


def test_the_same_key_with_different_params_is_refused_and_changes_nothing(stack):
    client = agent_api(stack.url)
    post_action(client, "refund:ORD-3:full:dec-3", refund_body("ORD-3", amount="25.00"))
    before = Action.objects.values().get(operation_key="refund:ORD-3:full:dec-3")
    reused = post_action(client, "refund:ORD-3:full:dec-3", refund_body("ORD-3", amount="26.00"))
    assert reused.status_code == 422
    assert reused.headers["Content-Type"] == "application/problem+json"
    assert reused.json()["code"] == "idempotency_key_reused"
    assert Action.objects.values().get(operation_key="refund:ORD-3:full:dec-3") == before


def test_two_requests_for_the_same_order_close_together_make_at_most_one_effect(stack):
    client = agent_api(stack.url)
    first = post_action(client, "refund:ORD-4:full:dec-4", refund_body("ORD-4", decision="dec-4"))
    second = post_action(client, "refund:ORD-4:full:dec-5", refund_body("ORD-4", decision="dec-5"))
    assert first.status_code == second.status_code == 201
    stack.start_worker()
    sweep_once()
    time.sleep(2)
    statuses = {a.operation_key: a.status for a in Action.objects.all()}
    assert statuses == {"refund:ORD-4:full:dec-4": "held", "refund:ORD-4:full:dec-5": "held"}
    assert sandbox(client, "GET", "refunds", params={"order_id": "ORD-4"}).json()["data"] == []
