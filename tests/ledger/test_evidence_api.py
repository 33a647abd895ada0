"""GET /api/v1/actions/{operation_key}/evidence: the agent's own actions only, and the
dashboard's printable page and JSON file, for the people who may read the audit log."""

import json
from urllib.parse import quote

import pytest

from bench.evidence_scenario import rich_agent
from console.evidence import evidence_export
from ledger.actions import action_request
from ledger.evidence import evidence_actions, record_problems
from ledger.grants import agent_grant, agent_revoke, capability
from ledger.models import Action, AuditEvent, Capability
from tests.factories import make_agent, make_agent_on, person

pytestmark = pytest.mark.django_db

KEY = "refund:ORD-E1:full:dec-1"


def recorded(agent, key=KEY, order="ORD-E1"):
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target=order, customer="CUST-E1",
                               decision_id="dec-1", params={"amount": "25.00", "currency": "EUR"})
    action.hold(actor="system:tests", reason="a person looks first")
    AuditEvent.objects.seal()
    return action


def test_an_agent_reads_the_record_of_its_own_action(client):
    agent = make_agent_on(client)
    action = recorded(agent)
    response = client.get(f"/api/v1/actions/{quote(KEY, safe='')}/evidence")
    assert response.status_code == 200, response.content
    record = response.json()
    assert record["request"]["operation_key"] == KEY and record["outcome"]["status"] == "held"
    assert [e["verb"] for e in record["audit"]["events"] if e["object_type"] == "ledger.action"] == ["requested", "held"]
    assert record["sections"]["approvals"]["review_items"][0]["kind"] == "held"
    ids = {e["id"] for e in record["audit"]["events"]}
    assert set(AuditEvent.objects.history(action).values_list("pk", flat=True)) <= ids
    # The grant it acted under (made live straight in the table by the tests: no promotion event).
    assert [e["verb"] for e in record["audit"]["events"] if e["object_type"] == "ledger.agent"] == ["granted"]
    assert record["agent"]["grant"]["state_at_request"] == "live" and record["agent"]["grant"]["promotion"] is None
    assert record_problems(record) == []


def test_another_agents_action_and_an_unknown_key_are_404_problems(client):
    recorded(make_agent("someone-else")[0])
    make_agent_on(client)
    for key in (KEY, "refund:ORD-NONE:full", "a\x00b"):
        response = client.get(f"/api/v1/actions/{quote(key, safe='')}/evidence")
        assert response.status_code == 404, key
        assert response["Content-Type"] == "application/problem+json" and response.json()["code"] == "not_found"


def test_without_a_token_it_is_401(client):
    recorded(make_agent("billing")[0])
    response = client.get(f"/api/v1/actions/{quote(KEY, safe='')}/evidence")
    assert response.status_code == 401 and response.json()["code"] == "unauthenticated"


# --- the dashboard -------------------------------------------------------------------------------


def test_an_auditor_gets_the_printable_page_linked_from_the_action_and_the_json_file(client, auditor):
    action = recorded(make_agent("billing")[0])
    client.force_login(auditor)
    detail = client.get(f"/actions/{action.pk}/")
    assert f'href="/actions/{action.pk}/evidence"' in detail.content.decode()

    page = client.get(f"/actions/{action.pk}/evidence")
    assert page.status_code == 200
    html = page.content.decode()
    first = AuditEvent.objects.history(action).first()
    assert KEY in html and action.fingerprint in html and first.hash in html and first.content_hash in html
    assert "a person looks first" in html and f'href="/actions/{action.pk}/evidence.json"' in html

    download = client.get(f"/actions/{action.pk}/evidence.json")
    assert download.status_code == 200
    assert download["Content-Disposition"] == f'attachment; filename="evidence-action-{action.pk}.json"'
    record = json.loads(download.content)
    assert record["request"]["operation_key"] == KEY and record_problems(record) == []


def test_the_record_is_refused_to_people_outside_the_dashboards_groups(client):
    action = recorded(make_agent("billing")[0])
    client.force_login(person("visitor"))
    for path in (f"/actions/{action.pk}/evidence", f"/actions/{action.pk}/evidence.json"):
        assert client.get(path).status_code == 403
    client.logout()
    assert client.get(f"/actions/{action.pk}/evidence").status_code == 302
    assert client.get(f"/actions/{Action.objects.count() + 10}/evidence").status_code == 302


def test_an_unknown_action_is_404_on_the_dashboard(client, auditor):
    client.force_login(auditor)
    assert client.get("/actions/999999/evidence").status_code == 404
    assert client.get("/actions/999999/evidence.json").status_code == 404


def test_the_grant_an_action_acted_under_is_the_one_in_force_when_it_was_requested(db):
    agent, _ = rich_agent()  # promoted live by a person after a replay run
    live = recorded(agent, key="refund:ORD-G1:full", order="ORD-G1")
    cap = capability(Capability.Kind.ACTION_TYPE, "refund")
    agent_revoke(agent, cap, actor="system:tests", reason="the connector changed")
    agent_grant(agent, cap, actor="system:tests", reason="granted again: shadow until promoted")
    shadow, _ = action_request(agent=agent, operation_key="refund:ORD-G2:full", action_type="refund", target="ORD-G2",
                               params={"amount": "25.00", "currency": "EUR"}, shadow=True)

    promoted = evidence_export(evidence_actions().get(pk=live.pk))["agent"]["grant"]
    assert (promoted["state_at_request"], promoted["state_now"]) == ("live", "shadow")
    assert promoted["promotion"]["by"] == "user:evidence-admin"
    assert promoted["promotion"]["reason"] == "the replay set passed against the sandbox"
    revoked = evidence_export(evidence_actions().get(pk=shadow.pk))
    assert (revoked["agent"]["grant"]["state_at_request"], revoked["agent"]["grant"]["promotion"]) == ("shadow", None)
    assert [e["verb"] for e in revoked["audit"]["events"] if e["object_type"] == "ledger.agent"] == [
        "granted", "promoted", "revoked", "granted"]


def test_an_agents_record_names_no_key_of_another_agents_action(client):
    """A request held behind another agent's action on the same order: the reasons in each one's
    record (held as it arrived, the other held with it, released once the other settled) name
    the other by its id, never by its key (its order and decision are that agent's)."""
    others, _ = make_agent("agent-b")
    theirs, _ = action_request(agent=others, operation_key="refund:ORD-S:secret-decision", action_type="refund",
                               target="ORD-S", customer="CUST-B", decision_id="b-1",
                               params={"amount": "25.00", "currency": "EUR"})
    mine, _ = action_request(agent=make_agent_on(client), operation_key="refund:ORD-S:a-1", action_type="refund",
                             target="ORD-S", customer="CUST-A", decision_id="a-1",
                             params={"amount": "25.00", "currency": "EUR"})
    theirs.refresh_from_db()
    assert (mine.status, theirs.status) == ("held", "held")
    theirs.release(actor="system:tests", reason="a person let it go", needs_approval=False)
    claimed = Action.objects.get(pk=theirs.pk).claim(owner="tests")
    claimed.mark_succeeded(actor="system:executor", claim=claimed.fence, external_ref="re_b")
    assert Action.objects.get(pk=mine.pk).status == "queued"
    AuditEvent.objects.seal()
    record = client.get(f"/api/v1/actions/{quote(mine.operation_key, safe='')}/evidence").content.decode()
    assert f"action #{theirs.pk} (another agent's)" in record and "secret-decision" not in record
    their_reasons = " ".join(AuditEvent.objects.history(theirs).values_list("reason", flat=True))
    assert f"action #{mine.pk} (another agent's) arrived" in their_reasons and "a-1" not in their_reasons
