"""A spending limit's alert tiers name staff by e-mail address. The agent's evidence record (the API's
read: the agent's, and whoever holds its token) never holds one: not in the limit in force, not in a
review item's snapshot of its limit, not in the audit events that recorded the limit's change or an
item's escalation. Each tier is shown as how many addresses it names; such an event keeps the chain's
hashes and says what it withheld, so the record still verifies, and an edited one still fails.
Staff's record on the dashboard keeps the addresses (decision 62)."""

import json
from datetime import timedelta
from decimal import Decimal
from urllib.parse import quote

import pytest
from django.core.management import CommandError, call_command

from approvals.models import Limit, ReviewItem
from dlq.overdue import review_alert_overdue
from ledger.actions import action_request
from ledger.evidence import record_digest, record_problems
from ledger.models import AuditEvent
from tests.factories import make_agent_on, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

KEY = "refund:ORD-T1:full:dec-1"
STAFF = "@staff.example"  # the domain of every address the tiers name
FIRST = f"desk{STAFF}, lead{STAFF}"
NEXT = f"head-of-ops{STAFF}"


@pytest.fixture
def escalated(client):
    """A refund over a limit whose tiers name staff, set and then changed (both events name the
    tiers), its review item past both deadlines (escalated: its event names the next tier), sealed;
    the agent's token on `client`."""
    admin = person("limits-admin")
    Limit.limit_set(actor=admin, reason="refunds above 500 EUR need a person", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), first_tier=FIRST, next_tier=NEXT, escalate_after_hours=1)
    Limit.limit_set(actor=admin, reason="and above 1000 two", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("1000.00"))
    agent = make_agent_on(client)
    action, _ = action_request(agent=agent, operation_key=KEY, action_type="refund", target="ORD-T1",
                               customer="CUST-T1", decision_id="dec-1",
                               params={"amount": "750.00", "currency": "EUR"})
    item = ReviewItem.objects.get(action=action)
    assert review_alert_overdue(now=item.deadline + timedelta(minutes=1)) == 1
    assert review_alert_overdue(now=item.deadline + timedelta(hours=1, minutes=1)) == 1
    AuditEvent.objects.seal()
    return action


def agents_record(client):
    response = client.get(f"/api/v1/actions/{quote(KEY, safe='')}/evidence")
    assert response.status_code == 200, response.content
    return response


def event(record, verb):
    [found] = [e for e in record["audit"]["events"] if e["verb"] == verb]
    return found


def test_the_agents_record_names_no_staff_address_and_shows_what_each_tier_is(client, escalated):
    response = agents_record(client)

    assert STAFF not in response.content.decode()
    record = response.json()
    approvals = record["sections"]["approvals"]
    tiers = {"first_tier": {"withheld": 2}, "next_tier": {"withheld": 1}}
    limit = approvals["limit_in_force"]["limit"]
    assert limit == {**limit, **tiers, "max_amount": "500.00", "dual_approval_above": "1000.00",
                     "escalate_after_hours": 1}
    [item] = approvals["review_items"]
    assert item["limit_snapshot"] == {**item["limit_snapshot"], **tiers, "max_amount": "500.00"}
    assert item["escalated_at"] is not None

    # The events that named the tiers (the limit's change in force, before it and after; the item's
    # escalation): shown with them withheld, each saying which, with the chain's hashes.
    changed = event(record, "limit_set")
    assert changed["seq"] == approvals["limit_in_force"]["seq"]
    assert changed["redacted"] == ["after.first_tier", "after.next_tier", "before.first_tier", "before.next_tier"]
    assert changed["after"]["dual_approval_above"] == "1000.00" and changed["reason"] == "and above 1000 two"
    escalation = event(record, "review_escalated")
    assert escalation["redacted"] == ["after.next_tier"] and escalation["after"]["next_tier"] == {"withheld": 1}
    for shown in (changed, escalation):
        stored = AuditEvent.objects.get(pk=shown["id"])
        assert (shown["content_hash"], shown["prev_hash"], shown["hash"]) == (
            stored.content_hash, stored.prev_hash, stored.hash)
    assert "redacted" not in event(record, "requested")

    assert record_problems(record) == [] and record_problems(record, database=False) == []


def test_the_agents_saved_record_verifies_and_an_edited_one_fails(client, escalated, tmp_path, capsys):
    record = agents_record(client).json()
    saved = tmp_path / "evidence.json"
    saved.write_text(json.dumps(record))
    for args in (["--chain"], []):
        call_command("evidence_verify", str(saved), *args)
        assert "intact" in (out := capsys.readouterr().out)
        assert "; 2 with values withheld, checked with the chain's values put back" in out
    call_command("evidence_verify", str(saved), "--offline")
    assert "2 with values withheld: their content hashes cannot be recomputed" in capsys.readouterr().out

    def edited(change):
        tampered = json.loads(json.dumps(record))
        shown = event(tampered, "limit_set")
        change(tampered, shown)
        tampered["integrity"]["digest"] = record_digest(tampered)
        return tampered, f"event #{shown['seq']}: "

    # A value it did not withhold (the limit's maximum): the file alone cannot tell, the database can.
    tampered, name = edited(lambda _, shown: shown["after"].update(max_amount="50000.00"))
    assert record_problems(tampered, database=False) == []
    assert record_problems(tampered) == [
        "the signature is not this ledger's for this digest",
        name + "its fields, with the values it withheld put back, are not what its content hash was computed from"]
    # How many addresses a tier named.
    tampered, name = edited(lambda _, shown: shown["after"].update(first_tier={"withheld": 5}))
    assert name + "what it shows at after.first_tier is not the chain's value withheld" in record_problems(tampered)
    # A value it names as withheld that the chain does not hold.
    tampered, name = edited(lambda _, shown: shown["redacted"].append("after.approvers"))
    assert name + "it withheld after.approvers, which its fields as the chain holds them do not have" in (
        record_problems(tampered))
    # An event shown whole, said to have withheld a value it shows as the chain holds it.
    tampered, _ = edited(lambda tampered, _: event(tampered, "requested").update(redacted=["after.status"]))
    requested = event(tampered, "requested")
    assert f"event #{requested['seq']}: what it shows at after.status is not the chain's value withheld" in (
        record_problems(tampered))
    # What it withheld no longer said: its fields are checked from the file, and are not the hashed ones.
    tampered, name = edited(lambda _, shown: shown.pop("redacted"))
    assert name + "its fields are not what its content hash was computed from" in record_problems(tampered,
                                                                                                   database=False)
    tampered, name = edited(lambda _, shown: shown.update(redacted="after.first_tier"))
    saved.write_text(json.dumps(tampered))
    with pytest.raises(CommandError, match="an audit event's redacted is no list of paths"):
        call_command("evidence_verify", str(saved), "--offline")


def test_staffs_record_on_the_dashboard_keeps_the_addresses_the_agents_withholds(client, escalated, auditor):
    agents = agents_record(client).json()
    client.force_login(auditor)

    download = client.get(f"/actions/{escalated.pk}/evidence.json")
    page = client.get(f"/actions/{escalated.pk}/evidence")

    staffs = json.loads(download.content)
    assert staffs["sections"]["approvals"]["limit_in_force"]["limit"]["first_tier"] == FIRST
    assert agents["sections"]["approvals"]["limit_in_force"]["limit"]["first_tier"] == {"withheld": 2}
    assert staffs["sections"]["approvals"]["review_items"][0]["limit_snapshot"]["next_tier"] == NEXT
    assert event(staffs, "review_escalated")["after"]["next_tier"] == [NEXT.strip()]
    assert not any("redacted" in e for e in staffs["audit"]["events"])
    assert record_problems(staffs) == [] and record_problems(staffs, database=False) == []
    assert f"lead{STAFF}" in page.content.decode() and f"head-of-ops{STAFF}" in page.content.decode()
