"""The sandbox provider's connector: refunds, messages and bookings over real HTTP, at
`base_url` (SANDBOX_BASE_URL unless a replay run points it at its fault proxy)."""

import json
from decimal import Decimal

from django.conf import settings
from django.utils.dateparse import parse_datetime

from ..key_paths import key_segment
from ..models import ActionType
from . import http
from .base import Connector, Effect, Lookup, Record

_RESOURCES = {
    ActionType.REFUND: "refunds",
    ActionType.SEND_MESSAGE: "messages",
    ActionType.CREATE_BOOKING: "bookings",
}

# Effects per listing request: the sandbox's largest page.
RECORDS_PAGE = 1000
# How much of an answer that cannot be read is kept as evidence.
_EVIDENCE_CHARS = 500


class SandboxConnector(Connector):
    name = "sandbox"
    base_option = "base_url"

    def __init__(self, *, base_url=""):
        super().__init__(base_url=base_url)

    @property
    def base_url(self):
        # Read when called, not when built: SANDBOX_BASE_URL is the default, the option wins.
        return self.options["base_url"] or settings.SANDBOX_BASE_URL

    def _url(self, path):
        return f"{self.base_url.rstrip('/')}/{path}"

    def _headers(self, **extra):
        return {"Authorization": f"Bearer {settings.SANDBOX_API_KEY}", **extra}

    def _send(self, action):
        params = action.params
        metadata = {"operation_key": action.operation_key}
        if action.action_type == ActionType.REFUND:
            body = {"order_id": action.target, "amount": params["amount"], "currency": params["currency"]}
        elif action.action_type == ActionType.SEND_MESSAGE:
            body = {"recipient": action.target, **{k: params[k] for k in ("channel", "message_type", "body")}}
        else:
            body = {"resource": action.target, "customer": action.customer,
                    **{k: params[k] for k in ("service", "start", "end")}}
        try:
            answer = http.call(
                "POST", self._url(_RESOURCES[action.action_type]), json={**body, "metadata": metadata},
                # The provider's own idempotency, where it has it, is a second line of defence.
                headers=self._headers(**{"Idempotency-Key": action.operation_key}),
            )
        except http.Rejected as exc:
            http.raise_if_no_refusal(exc, sure=("slot_taken",))  # its 409 for a slot booked is a sure no
            raise
        return Effect(external_ref=answer["id"], result=answer)

    def find_effect(self, action):
        try:
            answer = http.call(
                "GET", self._url(_RESOURCES[action.action_type]),
                params={"operation_key": action.operation_key}, headers=self._headers(),
            )
        except http.ProviderError as exc:
            return Lookup(found=None, evidence={"lookup": exc.evidence()})
        found = _listing(answer)
        if found is None:
            # A 2xx without the listing (a proxy's maintenance page, JSON of another shape) says
            # nothing of the effect: read as "none", it would send the effect a second time.
            return Lookup(found=None, evidence={"lookup": "by operation key",
                                                "unreadable_answer": json.dumps(answer)[:_EVIDENCE_CHARS]})
        evidence = {"lookup": "by operation key", "matches": [item["id"] for item in found]}
        mine = [item for item in found if item.get("operation_key") == action.operation_key]
        if found and not mine:
            # Effects, none under this key: the filter was not applied (a proxy that drops the
            # query), so the answer says nothing of this one; read as found, another effect's id
            # would be recorded as this one's.
            return Lookup(found=None, evidence={**evidence, "none_under_this_key": True})
        found = mine
        if not found:
            return Lookup(found=False, evidence=evidence)
        return Lookup(found=True, external_ref=found[0]["id"], result=found[0], evidence=evidence)

    def find_order(self, order_id):
        order = http.call("GET", self._url(f"orders/{key_segment(order_id)}"), headers=self._headers())
        return {"order_id": order["order_id"], "customer": order.get("customer", ""), "amount": order.get("amount")}

    def records(self, since, until):
        """Every refund, message and booking created in [since, until), a page of
        RECORDS_PAGE at a time (`GET /sandbox/v1/<kind>?since=…&until=…&starting_after=…`)."""
        for action_type, resource in _RESOURCES.items():
            params = {"since": since.isoformat(), "until": until.isoformat(), "limit": RECORDS_PAGE}
            while True:
                answer = http.call("GET", self._url(resource), params=params, headers=self._headers())
                items = _listing(answer)
                if items is None:
                    raise _unreadable(resource, answer)
                yield from (_record(item, action_type, resource) for item in items)
                if not answer.get("has_more") or not items:
                    break
                params["starting_after"] = items[-1]["id"]


def _record(item, action_type, resource):
    """One listed effect. One that cannot be read fails the whole listing: read wrong (no
    amount, no time), it would be a finding that is not one, or hide one that is."""
    try:
        created = parse_datetime(item["created"])
        if created is None:
            raise ValueError("not a time")
        amount = Decimal(item["amount"]) if "amount" in item else None
    except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
        raise _unreadable(resource, item) from exc
    return Record(operation_key=item.get("operation_key") or "", external_ref=item["id"], amount=amount,
                  currency=item.get("currency", ""), created_at=created, action_type=action_type, raw=item)


def _unreadable(resource, answer):
    return http.ProviderError(f"the sandbox's {resource} listing cannot be read: "
                              f"{json.dumps(answer, default=str)[:_EVIDENCE_CHARS]}", code="unreadable_answer")


def _listing(answer):
    """The effects a listing answered (`{"data": [{"id": ...}, ...]}`), or None if it is no listing."""
    items = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(items, list) or not all(isinstance(item, dict) and "id" in item for item in items):
        return None
    return items
