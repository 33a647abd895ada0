"""The sandbox refuses bad input with a 400 and writes nothing, never a 500."""

import json

import pytest

from sandbox.models import SandboxBooking, SandboxFault, SandboxRefund, SandboxSettings

pytestmark = pytest.mark.django_db

REFUND = {"order_id": "ORD-1", "amount": "25.00", "currency": "EUR"}
BOOKING = {"resource": "ROOM-1", "customer": "C", "service": "s", "start": "2026-09-10T10:00:00Z",
           "end": "2026-09-10T11:00:00Z"}


def raw(sandbox, path, body, method="post"):
    return getattr(sandbox.client, method)(f"/sandbox/v1/{path}", body, content_type="application/json",
                                           **sandbox._headers())


@pytest.mark.parametrize("body", [
    b"{", b"\xff", b"[]", b"null", b'"x"', b"[" * 100_000 + b"]" * 100_000,
    json.dumps({**REFUND, "amount": "1" + "0" * 30}).encode(), json.dumps({**REFUND, "amount": "1e400"}).encode(),
    json.dumps({**REFUND, "amount": "NaN"}).encode(), json.dumps({**REFUND, "amount": "-1"}).encode(),
    json.dumps({**REFUND, "amount": 1e308}).encode(), b'{"order_id": "ORD-1", "amount": NaN, "currency": "EUR"}',
    json.dumps({**REFUND, "currency": "eur"}).encode(), json.dumps({**REFUND, "order_id": "O\x00"}).encode(),
    json.dumps({**REFUND, "order_id": ["ORD-1"]}).encode(), json.dumps({**REFUND, "metadata": ["x"]}).encode(),
    json.dumps({**REFUND, "metadata": {"operation_key": 1}}).encode(),
    json.dumps({**REFUND, "metadata": {"note": "a\x00b"}}).encode(),
    b'{"order_id": "ORD-1", "amount": "25.00", "currency": "EUR", "metadata": {"x": NaN}}',
])
def test_refund_bad_bodies(sandbox, body):
    response = raw(sandbox, "refunds", body)
    assert response.status_code == 400, (response.status_code, response.content[:200])
    assert not SandboxRefund.objects.exists()


@pytest.mark.parametrize("times", [-1, 0, "x", 1e400, 2**40, 10**20, [1], 1.5])
def test_fault_bad_times(sandbox, times):
    body = json.dumps({"target": "ORD-1", "fault": "decline", "times": times}) if times != 1e400 else \
        '{"target": "ORD-1", "fault": "decline", "times": 1e400}'
    response = raw(sandbox, "faults", body)
    assert response.status_code == 400, (response.status_code, response.content[:200])
    assert not SandboxFault.objects.exists()


@pytest.mark.parametrize("body", [{"idempotency": "false"}, {"idempotency": 0}, {"idempotency": None}, {}, [], "x"])
def test_settings_non_bool(sandbox, body):
    before = SandboxSettings.load().idempotency
    response = raw(sandbox, "settings", json.dumps(body), method="put")
    assert response.status_code == 400
    assert SandboxSettings.load().idempotency == before


@pytest.mark.parametrize("change", [
    {"end": "2026-09-10T09:00:00Z"}, {"end": BOOKING["start"]}, {"start": "tomorrow"},
    {"start": "0001-01-01T00:00:00+01:00"}, {"end": "9999-12-31T23:59:59-01:00"},
    {"start": "2026-13-45T99:99"}, {"start": 12345},
])
def test_booking_bad_times(sandbox, change):
    response = raw(sandbox, "bookings", json.dumps({**BOOKING, **change}))
    assert response.status_code == 400, (response.status_code, response.content[:200])
    assert not SandboxBooking.objects.exists()


def test_lists_and_order_lookup_with_nul(sandbox):
    for path in ("refunds?order_id=a%00b", "messages?recipient=a%00b", "bookings?resource=a%00b", "orders/a%00b"):
        response = sandbox.client.get(f"/sandbox/v1/{path}", **sandbox._headers())
        assert response.status_code in (200, 400, 404), (path, response.status_code)
