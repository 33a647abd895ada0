"""A validly signed sandbox event of a type the ledger settles nothing by is a first delivery:
`200`, stored, outcome "ignored" (the contract gives `400` only for the signature). Refused, the
provider would send it again and again."""

import json

import pytest

from ledger.models import Action, ActionStatus, WebhookEvent
from tests.ledger.test_webhooks import KEY, deliver, event, unknown_action, webhook_secret  # noqa: F401 (fixtures)


@pytest.mark.parametrize("event_type", ["refund.created", "charge.dispute.created"])
def test_an_event_type_that_settles_nothing_is_stored_and_ignored(client, unknown_action, event_type):
    response = deliver(client, event(event_type=event_type))
    assert response.status_code == 200, response.content
    assert response.json() == {"received": True, "outcome": "ignored"}
    stored = WebhookEvent.objects.get()
    assert (stored.event_id, stored.event_type, stored.operation_key, stored.outcome) == (
        "evt_1", event_type, KEY, "ignored")
    assert Action.objects.get(pk=unknown_action.pk).status == ActionStatus.UNKNOWN
    assert deliver(client, event(event_type=event_type)).json() == {"duplicate": True}


@pytest.mark.parametrize("payload", [b'"refund.created"', b"[1, 2]", json.dumps({"id": "evt_1", "data": {}}).encode(),
                                     json.dumps({**event(), "type": {"refund": "created"}}).encode(),
                                     json.dumps({**event(), "type": 7}).encode()],
                         ids=["a string", "a list", "no type", "a type that is an object", "a type that is a number"])
def test_a_signed_body_that_is_no_event_object_is_still_refused(client, unknown_action, payload):
    response = deliver(client, payload)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid"
    assert not WebhookEvent.objects.exists()
