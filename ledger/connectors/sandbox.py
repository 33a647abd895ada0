"""The sandbox provider's connector: refunds, messages and bookings over real HTTP."""

from django.conf import settings

from ..models import ActionType
from . import http
from .base import Connector, Effect, Lookup

_RESOURCES = {
    ActionType.REFUND: "refunds",
    ActionType.SEND_MESSAGE: "messages",
    ActionType.CREATE_BOOKING: "bookings",
}


class SandboxConnector(Connector):
    name = "sandbox"

    def _url(self, path):
        return f"{settings.SANDBOX_BASE_URL.rstrip('/')}/{path}"

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
        answer = http.call(
            "POST", self._url(_RESOURCES[action.action_type]), json={**body, "metadata": metadata},
            # The provider's own idempotency, where it has it, is a second line of defence.
            headers=self._headers(**{"Idempotency-Key": action.operation_key}),
        )
        return Effect(external_ref=answer["id"], result=answer)

    def find_effect(self, action):
        try:
            answer = http.call(
                "GET", self._url(_RESOURCES[action.action_type]),
                params={"operation_key": action.operation_key}, headers=self._headers(),
            )
        except http.ProviderError as exc:
            return Lookup(found=None, evidence={"lookup": exc.evidence()})
        found = answer.get("data", [])
        evidence = {"lookup": "by operation key", "matches": [item.get("id") for item in found]}
        if not found:
            return Lookup(found=False, evidence=evidence)
        return Lookup(found=True, external_ref=found[0]["id"], result=found[0], evidence=evidence)
