"""The embedded default: with no Redis, work runs in the process that made it runnable."""

from ledger.models import Action
from ledger.sweeper import sweep_once
from tests.factories import make_agent, refund_body


def test_without_redis_an_action_is_executed_in_process_before_the_answer(live_server, settings, client):
    settings.RQ_ASYNC = False
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox/v1"
    _, token = make_agent("local")
    answer = client.post("/api/v1/actions", refund_body("ORD-LOCAL"), content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_IDEMPOTENCY_KEY="refund:ORD-LOCAL:1")
    assert answer.status_code == 201
    action = Action.objects.get(operation_key="refund:ORD-LOCAL:1")
    assert action.status == "succeeded" and action.external_ref.startswith("re_")


def test_without_redis_the_sweeper_runs_what_is_due(live_server, settings):
    settings.RQ_ASYNC = False
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox/v1"
    agent, _ = make_agent("local")
    Action.objects.create(operation_key="k-due", fingerprint="f", action_type="refund", target="ORD-DUE",
                          params={"amount": "1.00", "currency": "EUR"}, agent=agent,
                          next_attempt_at="2000-01-01T00:00:00Z")
    sweep_once()
    assert Action.objects.get(operation_key="k-due").status == "succeeded"
