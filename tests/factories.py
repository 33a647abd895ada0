"""Named actors and small helpers shared by the tests."""

import httpx

from ledger.agents import agent_create


def make_agent(name, grants=("refund", "send_message", "create_booking")):
    """Returns (agent, token)."""
    return agent_create(name, actor="system:tests", grants=grants)


def api_client(base_url, token):
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def refund_body(order="ORD-8841", amount="25.00", currency="EUR", customer="CUST-17", **extra):
    return {"action_type": "refund", "target": order, "customer": customer, "decision_id": "dec-77",
            "params": {"amount": amount, "currency": currency, **extra}}


def post_action(client, key, body):
    return client.post("/api/v1/actions", json=body, headers={"Idempotency-Key": key})


def sandbox(client, method, path, **kwargs):
    return client.request(method, f"/sandbox/v1/{path}", **kwargs)
