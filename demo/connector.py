"""The demo's provider: an in-process connector that commits into the sandbox's own tables.

`seed_demo` runs before the web app, and so before the sandbox's HTTP API, is up. While it
seeds, `demo_provider` has every action type served by a `DemoConnector`: the guarded
executor calls it as it calls any connector, and it saves effects with the sandbox's own
`effect_save`, under the operation key as Idempotency-Key, so the provider's side of the
demo is what the sandbox would have committed. A `Script` names what goes wrong for a target
(an order id, a recipient, a resource); the connector then raises the errors of
`ledger.connectors.http`, as a connector over HTTP would.
"""

import contextlib
import dataclasses
from collections import defaultdict

from django.conf import settings
from django.core.signals import setting_changed

from ledger.connectors import http
from ledger.connectors.base import Connector, Effect, Lookup
from ledger.models import ActionType
from ledger.workflows import WORKFLOWS, StepFailed, read
from sandbox import forms
from sandbox.models import (SandboxBooking, SandboxMessage, SandboxOrder, SandboxRefund, SandboxSettings, SlotTaken,
                            effect_save)
from sandbox.views import _booking_body, _message_body, _order_body, _refund_body

# Faults a script can name, each for the calls it applies to.
DECLINE = "decline"  # the provider refuses the write: Rejected, not retryable
NOT_SENT = "not_sent"  # the write never reaches the provider: NotSent, retried after a backoff
TIMEOUT_AFTER_COMMIT = "timeout_after_commit"  # committed, but no answer: OutcomeUnknown
TIMEOUT_BEFORE_COMMIT = "timeout_before_commit"  # nothing committed, no answer: OutcomeUnknown
CANNOT_TELL = "cannot_tell"  # a look-up by operation key fails: Lookup(found=None)
ORDER_UNREACHABLE = "order_unreachable"  # the refund workflow's order look-up cannot connect
ORDER_UNAVAILABLE = "order_unavailable"  # the order look-up gets an HTTP 503

WRITE_FAULTS = {DECLINE, NOT_SENT, TIMEOUT_AFTER_COMMIT, TIMEOUT_BEFORE_COMMIT}


class Script:
    """What goes wrong, per target: faults armed in order, each used up by the first calls
    it applies to. A call with nothing armed for its target succeeds."""

    def __init__(self):
        self._armed = defaultdict(list)  # target -> [[fault, calls left (None: every call)], ...]
        self._unanswered = []  # the saves of effects committed by calls that never answered

    def unanswered(self, save):
        """A call the provider committed but never answered: `save` commits its effect later."""
        self._unanswered.append(save)

    def unanswered_saved(self):
        """Save the effects the provider committed for calls that timed out after the commit
        (TIMEOUT_AFTER_COMMIT): once the call is over, as `DemoConnector._send` says why."""
        while self._unanswered:
            self._unanswered.pop(0)()

    def arm(self, target, fault, *, times=1):
        self._armed[target].append([fault, times])

    def take(self, target, kinds):
        """Use up the first fault of `kinds` armed for `target`; None if there is none."""
        armed = self._armed[target]
        for i, (fault, left) in enumerate(armed):
            if fault in kinds:
                if left is not None:
                    armed[i][1] -= 1
                    if armed[i][1] == 0:
                        del armed[i]
                return fault
        return None


# Per action type: the sandbox's form for the write (it turns a call's body into the model's
# fields), its model, how the sandbox answers with an effect, and the body of the call (what
# the sandbox connector sends).
_KINDS = {
    ActionType.REFUND: (forms.RefundForm, SandboxRefund, _refund_body, lambda action: {
        "order_id": action.target, "amount": action.params["amount"], "currency": action.params["currency"]}),
    ActionType.SEND_MESSAGE: (forms.MessageForm, SandboxMessage, _message_body, lambda action: {
        "recipient": action.target, **{k: action.params[k] for k in ("channel", "message_type", "body")}}),
    ActionType.CREATE_BOOKING: (forms.BookingForm, SandboxBooking, _booking_body, lambda action: {
        "resource": action.target, "customer": action.customer,
        **{k: action.params[k] for k in ("service", "start", "end")}}),
}


class DemoConnector(Connector):
    """Every action type, committed in this process into the sandbox's tables; faults from
    the `script` option (without one, every call succeeds)."""

    name = "demo"

    def __init__(self, *, script=None):
        super().__init__(script=script)
        self.script = script or Script()

    def _where(self, action):
        return f"demo provider, {action.action_type} for {action.target}"

    def _send(self, action):
        fault = self.script.take(action.target, WRITE_FAULTS)
        if fault == NOT_SENT:
            raise http.NotSent(f"{self._where(action)}: could not connect", code="connect_failed")
        if fault == DECLINE:
            raise http.Rejected(f"{self._where(action)}: the provider declined the request", code="declined",
                                status=402)
        if fault == TIMEOUT_BEFORE_COMMIT:
            raise self._no_answer(action)
        if fault == TIMEOUT_AFTER_COMMIT:
            # A provider's commit is its own, but this one would be made in the caller's
            # transaction, which may roll back the block it called in on the error (a caller
            # calling within a transaction of its own). So it is saved once the call is over:
            # after the demo's worker move (demo.seed.execute), before any look-up, at the end.
            self.script.unanswered(lambda: self._commit(action))
            raise self._no_answer(action)
        return self._commit(action)

    def _no_answer(self, action):
        return http.OutcomeUnknown(f"{self._where(action)}: no answer within {settings.CONNECTOR_TIMEOUT}s",
                                   code="timeout")

    def _commit(self, action):
        """Save the effect as the sandbox's write endpoint does: its form, its `effect_save`."""
        form_class, model, body, call_body = _KINDS[action.action_type]
        form = form_class(data={**call_body(action), "metadata": {"operation_key": action.operation_key}})
        if not form.is_valid():
            raise http.Rejected(f"{self._where(action)}: invalid: {form.errors.as_json()}", code="invalid", status=400)
        effect = model(**form.cleaned_data, idempotency_key=action.operation_key)
        check = effect.ensure_slot_free if model is SandboxBooking else None
        try:
            effect, _ = effect_save(effect, idempotency=SandboxSettings.load().idempotency, check=check)
        except SlotTaken as exc:
            raise http.Rejected(f"{self._where(action)}: already booked ({exc.booking.booking_id})",
                                code="slot_taken", status=409) from None
        answer = body(effect)
        return Effect(external_ref=answer["id"], result=answer)

    def find_effect(self, action):
        self.script.unanswered_saved()
        if self.script.take(action.target, {CANNOT_TELL}):
            error = http.OutcomeUnknown(f"{self._where(action)}: look-up by operation key: HTTP 503",
                                        code="http_503", status=503)
            return Lookup(found=None, evidence={"lookup": error.evidence()})
        _, model, body, _ = _KINDS[action.action_type]
        found = [body(effect) for effect in model.objects.filter(operation_key=action.operation_key)]
        evidence = {"lookup": "by operation key", "matches": [item["id"] for item in found]}
        if not found:
            return Lookup(found=False, evidence=evidence)
        return Lookup(found=True, external_ref=found[0]["id"], result=found[0], evidence=evidence)


def _order_lookup(script):
    """The refund workflow's `lookup_order` step, answered from the sandbox's orders. The
    workflow asks the provider's HTTP API itself rather than through a connector, so the
    registry cannot send it here; `demo_provider` puts this step in its place."""

    def lookup_order(ctx):
        order_id = ctx.input["order_id"]
        where = f"demo provider, order {order_id}"
        fault = script.take(order_id, {ORDER_UNREACHABLE, ORDER_UNAVAILABLE})
        if fault == ORDER_UNREACHABLE:
            raise StepFailed(f"{where}: could not connect", retryable=True, code="connect_failed")
        if fault == ORDER_UNAVAILABLE:
            raise StepFailed(f"{where}: HTTP 503", retryable=True, code="http_503")
        order = SandboxOrder.objects.filter(order_id=order_id).first()
        if order is None:
            raise StepFailed(f"order {order_id} is unknown", retryable=False, code="unknown_order")
        answer = _order_body(order, refunds=[])
        return {"order_id": answer["order_id"], "customer": answer["customer"], "amount": answer["amount"]}

    return lookup_order


@contextlib.contextmanager
def demo_provider():
    """For the duration, the demo's provider serves everything a worker would ask the sandbox:
    every action type goes to a `DemoConnector`, and the refund workflow's order look-up to
    the sandbox's orders. Yields the `Script` both follow. Not for use while other threads
    run: the registry and the workflows are the process's own."""
    script = Script()
    connectors, refund = settings.SURETY_CONNECTORS, WORKFLOWS["refund"]
    demo = {"class": f"{DemoConnector.__module__}.{DemoConnector.__name__}", "options": {"script": script}}
    _connectors_set({action_type: demo for action_type in ActionType.values}, enter=True)
    WORKFLOWS["refund"] = dataclasses.replace(refund, steps=[
        read(step.name, _order_lookup(script)) if step.name == "lookup_order" else step for step in refund.steps])
    try:
        yield script
        script.unanswered_saved()
    finally:
        WORKFLOWS["refund"] = refund
        _connectors_set(connectors, enter=False)


def _connectors_set(value, *, enter):
    settings.SURETY_CONNECTORS = value
    # The signal the registry listens to: it forgets the connectors it built for the old value.
    setting_changed.send(sender=DemoConnector, setting="SURETY_CONNECTORS", value=value, enter=enter)
