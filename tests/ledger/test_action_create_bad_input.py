"""POST /api/v1/actions refuses bad input with a problem and writes nothing.

No live server: validation happens before the ledger is touched, so Django's test client is
enough, and each case checks that neither an action nor an audit event was written.
"""

import json

import pytest

from ledger.models import Action, AuditEvent
from tests.factories import booking_body, make_agent_on, message_body, post_action_in_process, refund_body

KEY = "refund:ORD-8841:full:dec-77"


def without(body, field):
    return {k: v for k, v in body.items() if k != field}


def with_params(**params):
    body = refund_body()
    body["params"] = params
    return body


def raw_json(text):
    return text.encode()


# (id, Idempotency-Key (None: not sent), body (dict: sent as JSON; bytes: sent as is), code, field in errors)
CASES = [
    ("missing key", None, refund_body(), "idempotency_key_missing", None),
    ("over-long key", "k" * 256, refund_body(), "invalid", "Idempotency-Key"),
    ("non-ASCII key", "refund:ORD-8841:clé", refund_body(), "invalid", "Idempotency-Key"),
    ("key with a control character", "refund:\tORD-8841", refund_body(), "invalid", "Idempotency-Key"),
    ("key with a NUL", "refund:\x00ORD-8841", refund_body(), "invalid", "Idempotency-Key"),
    ("empty key", "", refund_body(), "idempotency_key_missing", None),
    ("malformed JSON", KEY, raw_json('{"action_type": "refund",'), "invalid", "body"),
    ("JSON with NaN", KEY, raw_json('{"action_type": "refund", "x": NaN}'), "invalid", "body"),
    ("empty body", KEY, b"", "invalid", "action_type"),
    ("body not UTF-8", KEY, b'{"target": "\xff"}', "invalid", "body"),
    ("body over 64 KiB", KEY, {**refund_body(), "padding": "x" * (64 * 1024)}, "invalid", "body"),
    ("body a JSON list", KEY, [refund_body()], "invalid", "non_field_errors"),
    ("body JSON null", KEY, raw_json("null"), "invalid", "non_field_errors"),
    ("float amount", KEY, raw_json(json.dumps(refund_body()).replace('"25.00"', "25.0")), "invalid", "params.amount"),
    ("integer amount", KEY, refund_body(amount=25), "invalid", "params.amount"),
    ("negative amount", KEY, refund_body(amount="-25.00"), "invalid", "params.amount"),
    ("zero amount", KEY, refund_body(amount="0.00"), "invalid", "params.amount"),
    ("amount with 3 decimals", KEY, refund_body(amount="25.001"), "invalid", "params.amount"),
    ("amount in exponent form", KEY, refund_body(amount="2.5e1"), "invalid", "params.amount"),
    ("amount with non-ASCII digits", KEY, refund_body(amount="２５.００"), "invalid", "params.amount"),
    ("amount too large", KEY, refund_body(amount="1000000000.00"), "invalid", "params.amount"),
    ("currency EURO", KEY, refund_body(currency="EURO"), "invalid", "params.currency"),
    ("currency XXZ", KEY, refund_body(currency="XXZ"), "invalid", "params.currency"),
    # ISO 4217 codes that are no currency one pays in: none, tests, metals, SDR, bond units, funds, historic.
    *[(f"currency {code}", KEY, refund_body(amount="9000.00", currency=code), "invalid", "params.currency")
      for code in ("XXX", "xxx", "XTS", "XAU", "XAG", "XPT", "XPD", "XDR", "XBA", "XBB", "XBC", "XBD", "XSU", "XUA",
                   "BOV", "USN", "DEM", "HRK")],
    ("missing currency", KEY, with_params(amount="25.00"), "invalid", "params.currency"),
    ("unknown action type", KEY, {**refund_body(), "action_type": "teleport"}, "invalid", "action_type"),
    ("params a list", KEY, {**refund_body(), "params": ["25.00", "EUR"]}, "invalid", "params"),
    ("params a string", KEY, {**refund_body(), "params": "25.00 EUR"}, "invalid", "params"),
    ("missing params", KEY, without(refund_body(), "params"), "invalid", "params"),
    ("missing target", KEY, without(refund_body(), "target"), "invalid", "target"),
    ("empty target", KEY, {**refund_body(), "target": ""}, "invalid", "target"),
    ("unknown field in params", KEY, refund_body(note="hello"), "invalid", "params.note"),
    ("unknown top-level field", KEY, {**refund_body(), "priority": "high"}, "invalid", "priority"),
    ("a task id (only workflow steps join a task)", KEY, {**refund_body(), "task_id": "refund-8841"}, "invalid",
     "task_id"),
    ("send_message with a bad e-mail", KEY, message_body(target="not-an-email"), "invalid", "target"),
    ("send_message by sms to an e-mail", KEY, message_body(channel="sms"), "invalid", "target"),
    ("send_message by sms with non-ASCII digits", KEY,
     message_body(target="+4930١٢٣٤٥٦٧", channel="sms"), "invalid", "target"),
    ("send_message to an address longer than a target once its domain is in lower case", KEY,
     message_body(target="a@" + ".".join(["\u0130" * 50] * 4) + ".com"), "invalid", "target"),
    ("send_message on an unknown channel", KEY, message_body(channel="pigeon"), "invalid", "params.channel"),
    ("booking end before start", KEY,
     booking_body(start="2026-09-10T11:00:00Z", end="2026-09-10T10:00:00Z"), "invalid", "params.end"),
    ("booking end equal to start", KEY,
     booking_body(start="2026-09-10T11:00:00Z", end="2026-09-10T11:00:00Z"), "invalid", "params.end"),
    ("booking start not a time", KEY, booking_body(start="tomorrow"), "invalid", "params.start"),
    ("booking without customer", KEY, booking_body(customer=None), "invalid", "customer"),
    ("JSON nested 5,000 levels deep", KEY, raw_json("[" * 5000 + "]" * 5000), "invalid", "body"),
    # A lone surrogate is no character: an answer naming it (an unknown field, a choice) could
    # not be encoded, so the body is refused whole.
    ("unknown field named by a lone surrogate", KEY, raw_json('{"action_type": "refund", "\\ud800": 1}'), "invalid",
     "body"),
    ("unknown param named by a lone surrogate", KEY,
     raw_json(json.dumps(refund_body())[:-2] + ', "\\udc00x": 1}}'), "invalid", "body"),
    ("action type a lone surrogate", KEY, raw_json(json.dumps({**refund_body(), "action_type": "\ud800"})),
     "invalid", "body"),
    ("booking with an empty customer", KEY, booking_body(customer=""), "invalid", "customer"),
]


@pytest.fixture
def agent_client(client, db):
    make_agent_on(client)
    return client


@pytest.mark.parametrize(("case", "key", "body", "code", "field"), CASES, ids=[c[0] for c in CASES])
def test_it_refuses_bad_input_with_a_problem_and_writes_nothing(agent_client, case, key, body, code, field):
    audit_events_before = AuditEvent.objects.count()

    response = post_action_in_process(agent_client, key, body)

    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert {"type", "title", "status", "detail", "code"} <= set(problem)
    assert problem["status"] == 400
    assert problem["code"] == code
    assert problem["type"].endswith("/" + code)
    if field is not None:
        assert field in problem["errors"], problem
        assert all(isinstance(m, str) for messages in problem["errors"].values() for m in messages)
    assert not Action.objects.exists()
    assert AuditEvent.objects.count() == audit_events_before


def test_it_accepts_the_same_bodies_when_they_are_valid(agent_client):
    """The table above is not refusing everything: its valid neighbours are accepted."""
    valid = [
        ("refund:ORD-1:full:dec-1", refund_body("ORD-1", customer="CUST-1", amount="25.01")),
        ("refund:ORD-2:full:dec-1", refund_body("ORD-2", customer="CUST-2", currency="eur")),
        # Real currencies whose codes start with X, as ISO's non-payment codes do.
        ("refund:ORD-3:full:dec-1", refund_body("ORD-3", customer="CUST-3", currency="XCD")),
        ("refund:ORD-4:full:dec-1", refund_body("ORD-4", customer="CUST-4", amount="2500", currency="XOF")),
        ("msg:ada@example.com:receipt:dec-1", message_body()),
        ("msg:+4930123456:receipt:dec-1", message_body(target="+4930123456", channel="sms")),
        # Sent as JSON escapes a surrogate pair ("\\ud83d\\ude00"), which is one character.
        ("msg:ada@example.com:thanks:dec-1", message_body(message_type="thanks", body="Thanks \U0001f600")),
        ("booking:ROOM-1:CUST-17:dec-1", booking_body()),
    ]
    for key, body in valid:
        response = post_action_in_process(agent_client, key, body)
        assert response.status_code == 201, (key, response.content)
    assert Action.objects.count() == len(valid)
    assert Action.objects.get(operation_key="refund:ORD-2:full:dec-1").params["currency"] == "EUR"
