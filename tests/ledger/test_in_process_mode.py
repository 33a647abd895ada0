"""The embedded default: with no Redis, work runs in the process that made it runnable."""

from console.sweeper import sweep_once
from ledger.models import Action, ActionStatus
from tests.factories import make_action, make_agent, make_agent_on, post_action_in_process, refund_body


def test_without_redis_an_action_is_executed_in_process_before_the_answer(live_server, settings, client):
    settings.RQ_ASYNC = False
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox/v1"
    make_agent_on(client, "local")
    answer = post_action_in_process(client, "refund:ORD-LOCAL:1", refund_body("ORD-LOCAL"))
    assert answer.status_code == 201
    action = Action.objects.get(operation_key="refund:ORD-LOCAL:1")
    assert action.status == "succeeded" and action.external_ref.startswith("re_")


def test_without_redis_the_sweeper_runs_what_is_due(live_server, settings):
    settings.RQ_ASYNC = False
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox/v1"
    agent, _ = make_agent("local")
    make_action(agent, ActionStatus.QUEUED, key="k-due", target="ORD-DUE", amount="1.00",
                next_attempt_at="2000-01-01T00:00:00Z")
    sweep_once()
    assert Action.objects.get(operation_key="k-due").status == "succeeded"
