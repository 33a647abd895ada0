"""An action's evidence record (ledger/evidence.py), made from an action with a long history
through the product's own code paths (bench/evidence_scenario.py: approvals by two people, a
decline and its dead-letter entry redriven, an unknown outcome a person had verified again, a
success, its webhook twice), against the live server's sandbox provider."""

import json
from urllib.parse import quote

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.evidence_scenario import rich_action
from console.evidence import evidence_export
from ledger.actions import action_request
from ledger.audit import CONTENT_FIELDS, chain_hash, content_hash
from ledger.evidence import evidence_actions, record_digest, record_problems
from ledger.models import Action, AuditEvent
from tests.factories import api_client, make_agent, post_action, refund_body



@pytest.fixture
def rich(stack):
    action = rich_action(stack.url)
    return evidence_actions().get(pk=action.pk)


def events_named(record, verb, object_type="ledger.action"):
    return [e for e in record["audit"]["events"] if e["verb"] == verb and e["object_type"] == object_type]


def test_the_record_of_an_action_with_a_long_history_holds_every_part_of_it(rich):
    record = evidence_export(rich)

    request = record["request"]
    assert request["operation_key"] == rich.operation_key == "refund:ORD-EV1:full:dec-ev1"
    assert (request["fingerprint"], request["params"]["amount"], request["customer"], request["decision_id"]) == (
        rich.fingerprint, "1200.00", "CUST-EV1", "dec-ev1")
    assert record["outcome"]["status"] == "succeeded" and record["outcome"]["external_ref"] == rich.external_ref
    assert record["outcome"]["attempts"] == 3
    assert record["outcome"]["approved_fingerprint"] == (rich.approved_fingerprint or None)
    assert (request["supersedes"], request["superseded_by"]) == (None, None)

    grant = record["agent"]["grant"]
    assert (record["agent"]["name"], record["agent"]["owner"]) == ("evidence-bot", "evidence-owner")
    assert (grant["state_at_request"], grant["state_now"]) == ("live", "live")
    assert grant["promotion"]["by"] == "user:evidence-admin" and grant["promotion"]["replay_run"]

    # What the provider said: the 500 (a call, the look before it inside), the look-up that failed,
    # "no effect", then the call that made it (a failure tried again: the look before it inside).
    kinds = [e["kind"] for e in record["provider_evidence"]]
    assert kinds == ["call", "verification", "verification", "call"]
    assert [e["entry"].get("looked_first", {}).get("found") for e in record["provider_evidence"]] == [
        False, None, None, False]
    assert record["provider_evidence"][-2]["entry"]["found"] is False
    [webhook] = record["webhooks"]  # delivered twice, stored once
    assert webhook["event_id"] == "evt_ev1" and webhook["payload"]["data"]["metadata"]["operation_key"] == rich.operation_key

    approvals = record["sections"]["approvals"]
    assert approvals["limit_in_force"]["limit"]["max_amount"] == "500.00"
    assert approvals["limit_in_force"]["limit"]["dual_approval_above"] == "1000.00"
    # Approved, failed for good, redriven and approved again (over its limit: decision 19), then unknown.
    approval_item, again_item, unknown_item = approvals["review_items"]
    assert (again_item["kind"], again_item["status"], again_item["decided_by"]) == ("approval", "approved", "evidence-bob")
    assert (approval_item["kind"], approval_item["status"], approval_item["approvals_needed"]) == (
        "approval", "approved", 2)
    assert approval_item["limit_snapshot"]["max_amount"] == "500.00"
    # What each approver saw: the fingerprint of the params on their page, when it was recorded.
    assert {"decided_fingerprint", "expires_at"} <= approval_item.keys()
    assert all("fingerprint" in approval for approval in approval_item["approvals"])
    assert [(a["user"], a["reason"]) for a in approval_item["approvals"]] == [
        ("evidence-alice", "photos of the damage attached"), ("evidence-bob", "second look: the order is damaged")]
    assert (approval_item["decided_by"], approval_item["note"]) == ("evidence-bob", "second look: the order is damaged")
    assert (unknown_item["kind"], unknown_item["status"], unknown_item["decided_by"]) == (
        "unknown_outcome", "resolved", "evidence-alice")

    dead_letters = record["sections"]["dead_letters"]
    [entry] = dead_letters["dead_letters"]
    assert (entry["status"], entry["decided_by"], entry["note"]) == (
        "redriven", "user:evidence-admin", "the card issuer lifted its block")
    assert entry["last_error"]["code"] == "declined" and entry["snapshot"]["operation_key"] == rich.operation_key
    [alert] = dead_letters["alerts"]
    assert alert["kind"] == "dead_letter" and alert["dead_letter"] == entry["id"]

    # The audit events that cover all of it, each sealed, with its links.
    events = record["audit"]["events"]
    assert len(events) >= 20 and record["audit"]["unsealed"] == 0
    covered = {(e["object_type"], e["verb"]) for e in events}
    assert {("ledger.action", "requested"), ("ledger.action", "approved"), ("ledger.action", "failed"),
            ("ledger.action", "retry_allowed"), ("ledger.action", "outcome_unknown"), ("ledger.action", "verify_again"),
            ("ledger.action", "succeeded"), ("ledger.action", "sent_for_approval"),
            ("approvals.reviewitem", "approval_recorded"),
            ("approvals.reviewitem", "approve"), ("approvals.reviewitem", "verify"), ("approvals.limit", "limit_set"),
            ("dlq.deadletter", "dead_letter_opened"), ("dlq.deadletter", "redriven"),
            ("ledger.agent", "granted"), ("ledger.agent", "promoted")} <= covered
    for event in events:
        stored = AuditEvent.objects.get(pk=event["id"])
        assert (event["seq"], event["prev_hash"], event["hash"], event["content_hash"]) == (
            stored.seq, stored.prev_hash, stored.hash, stored.content_hash)
    assert record_problems(record) == []


def test_the_verify_command_passes_a_saved_record_and_fails_one_with_any_field_changed(rich, tmp_path, capsys):
    record = json.loads(json.dumps(evidence_export(rich)))
    saved = tmp_path / "evidence.json"
    saved.write_text(json.dumps(record))
    call_command("evidence_verify", str(saved), "--chain")
    call_command("evidence_verify", str(saved), "--offline")
    assert "intact" in capsys.readouterr().out

    # An approver's reason changed in an audit event: caught from the file alone.
    tampered = json.loads(json.dumps(record))
    approved = next(e for e in tampered["audit"]["events"] if e["verb"] == "approve")
    approved["reason"] = "approved without looking"
    saved.write_text(json.dumps(tampered))
    for args in ([], ["--offline"]):
        with pytest.raises(CommandError, match="its fields are not what its content hash was computed from"):
            call_command("evidence_verify", str(saved), *args)

    # A field outside the audit trail (the amount asked for), the digest written again to fit:
    # the file alone cannot tell, the signature can.
    tampered = json.loads(json.dumps(record))
    tampered["request"]["params"]["amount"] = "12.00"
    with pytest.raises(CommandError, match="the digest is not the record's"):
        saved.write_text(json.dumps(tampered))
        call_command("evidence_verify", str(saved), "--offline")
    tampered["integrity"]["digest"] = record_digest(tampered)
    saved.write_text(json.dumps(tampered))
    call_command("evidence_verify", str(saved), "--offline")
    with pytest.raises(CommandError, match="the signature is not this ledger's"):
        call_command("evidence_verify", str(saved))

    # An event rewritten with hashes of its own: the next event no longer follows it, and the
    # database's chain holds other hashes.
    tampered = json.loads(json.dumps(record))
    seqs = {e["seq"] for e in tampered["audit"]["events"]}
    event = next(e for e in tampered["audit"]["events"] if e["seq"] + 1 in seqs)
    event["actor"] = "user:someone-else"
    event["content_hash"] = content_hash({field: event[field] for field in CONTENT_FIELDS})
    event["hash"] = chain_hash(event["prev_hash"], event["content_hash"], event["seq"])
    tampered["integrity"]["digest"] = record_digest(tampered)
    assert record_problems(tampered, database=False) == [f"event #{event['seq'] + 1}: it does not follow event #{event['seq']}"]
    saved.write_text(json.dumps(tampered))
    with pytest.raises(CommandError, match="its content hash is not the database's"):
        call_command("evidence_verify", str(saved))


def test_the_verify_command_refuses_a_file_that_is_not_a_record(tmp_path, db):
    saved = tmp_path / "evidence.json"
    for content in ("not json", "[]", json.dumps({"audit": {"events": "x"}, "integrity": {}})):
        saved.write_text(content)
        with pytest.raises(CommandError):
            call_command("evidence_verify", str(saved), "--offline")


def _hold_and_release(action, times):
    """`times` rounds of a person's hold and release: two audit events and a review item each."""
    for n in range(times):
        action.hold(actor="system:tests", reason=f"round {n}")
        action.release(actor="system:tests", reason=f"round {n}")


def test_building_a_record_costs_the_same_queries_however_long_the_history(db):
    agent, _ = make_agent("billing")
    counts = {}
    for rounds in (1, 12):
        action, _ = action_request(agent=agent, operation_key=f"refund:ORD-Q{rounds}:full", action_type="refund",
                                   target=f"ORD-Q{rounds}", customer=f"CUST-Q{rounds}",
                                   params={"amount": "10.00", "currency": "EUR"})
        _hold_and_release(action, rounds)
        action = evidence_actions().get(pk=action.pk)
        with CaptureQueriesContext(connection) as queries:
            record = evidence_export(action)
        counts[rounds] = len(queries)
        assert len(record["audit"]["events"]) >= 1 + 2 * rounds
    assert counts[1] == counts[12], counts
    assert Action.objects.count() == 2


def test_a_key_that_itself_ends_in_evidence_is_still_read_as_the_action(stack):
    """gunicorn keeps the path as it was sent: an encoded slash is part of the key."""
    agent, token = make_agent("billing")
    with api_client(stack.url, token) as api:
        for key, order in (("refund:x/evidence", "ORD-S1"), ("refund:x", "ORD-S2")):
            assert post_action(api, key, refund_body(order=order)).status_code == 201
        action = api.get(f"/api/v1/actions/{quote('refund:x/evidence', safe='')}")
        assert action.status_code == 200 and action.json()["operation_key"] == "refund:x/evidence"
        record = api.get(f"/api/v1/actions/{quote('refund:x/evidence', safe='')}/evidence")
        assert record.status_code == 200 and record.json()["request"]["operation_key"] == "refund:x/evidence"
        record = api.get(f"/api/v1/actions/{quote('refund:x', safe='')}/evidence")
        assert record.status_code == 200 and record.json()["request"]["operation_key"] == "refund:x"
