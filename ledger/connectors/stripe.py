"""Stripe's refunds, through the official `stripe` SDK.

1. The action's target is the Stripe charge (`ch_…`) or payment intent (`pi_…`) to refund.
   It is read first: Stripe refunds in the payment's currency and refuses a `currency`
   parameter, so an action in another currency is refused before anything is written.
2. The refund is created with the operation key as Stripe's own `Idempotency-Key` and in
   `metadata[operation_key]`, and the amount in Stripe's units of the currency, by Stripe's
   own rules (ledger.connectors.stripe_amounts: HUF 5000 is 500000, not CLDR's 5000); an
   amount Stripe cannot take (1.255 KWD) is refused at intake already (`amount_problem`).
   A refund Stripe answers `pending` counts as made; one `failed` or `canceled`, as refused.
   Stripe answers a key it has seen with its saved first answer: then the refund's status as
   it is now decides (`_refund_now`), since it may have failed since.
3. Verification lists the target's refunds and looks for the operation key in their metadata:
   Stripe lists refunds by charge or payment intent only, and its search API neither covers
   refunds nor sees a write at once.

Stripe's errors become the ledger's three kinds (ledger.connectors.http), so the executor
treats this connector like any other. The SDK retries nothing: the ledger owns retries. Its
requests go through the SDK's own extension point, a custom `http_client` (`_LedgerHTTP`),
to `http.exchange`: the write's two requests (the read and the refund) and a look-up's pages are
held to one deadline (ledger.connectors.base), and no byte of them is sent after it. The SDK's
own HTTP clients time out per connect, write and read, and kept a slow Stripe's call going far
past CONNECTOR_TIMEOUT, and past the lease.
Stripe's webhooks are read here too (`read_webhook`), verified by the SDK itself.
"""

import json
import os
from datetime import UTC, datetime

import stripe

from ..json_input import storable
from ..models import ActionType, named_operation_key
from . import http, stripe_amounts
from .base import Connector, Effect, Lookup, Record
from .events import WebhookRefused

# Stripe's refund events, by the refund's status, as the webhook view settles them.
_EVENT_TYPES = {"refund.created", "refund.updated", "refund.failed", "charge.refund.updated"}
_SETTLED_AS = {"succeeded": "refund.succeeded", "failed": "refund.failed", "canceled": "refund.failed"}
_FAILED = {"failed", "canceled"}


class StripeConnector(Connector):
    name = "stripe"
    base_option = "api_base"

    def __init__(self, *, api_key="", api_base=stripe.DEFAULT_API_BASE, webhook_secret="", **options):
        super().__init__(api_key=api_key, api_base=api_base or stripe.DEFAULT_API_BASE,
                         webhook_secret=webhook_secret, **options)
        self._clients = {}

    def check(self):
        key, base = self.options["api_key"], self.options["api_base"]
        problems = []
        if not key:
            problems.append("no API key (set STRIPE_API_KEY)")
        elif not key.startswith(("sk_", "rk_")):
            problems.append("STRIPE_API_KEY is not a Stripe secret or restricted key (sk_… or rk_…)")
        if not base.startswith(("https://", "http://")):
            problems.append(f"STRIPE_API_BASE {base!r} is not an http(s) address")
        return problems

    def to_provider_units(self, amount, currency):
        return stripe_amounts.to_units(amount, currency)

    def from_provider_units(self, units, currency):
        return stripe_amounts.from_units(units, currency)

    def _client(self):
        # One per process: a worker may be forked after the registry built the connector, and
        # must not share its parent's connections.
        pid = os.getpid()
        if pid not in self._clients:
            self._clients = {pid: stripe.StripeClient(
                self.options["api_key"],
                base_addresses={"api": self.options["api_base"]},
                http_client=_LedgerHTTP(),
                max_network_retries=0,
            )}
        return self._clients[pid]

    def _payment(self, target):
        """The charge or payment intent `target` names."""
        return getattr(self._client().v1, f"{_kind(target)}s").retrieve(target).to_dict(for_json=True)

    def _send(self, action):
        if action.action_type != ActionType.REFUND:
            raise http.Rejected(f"the Stripe connector makes refunds, not {action.action_type}",
                                code="unsupported_action_type")
        params = action.params
        try:
            amount = self.to_provider_units(params["amount"], params["currency"])
        except ValueError as exc:  # refused at intake; an action recorded before the rule was not
            raise http.Rejected(str(exc), code="amount_not_in_minor_units") from exc
        try:
            currency = self._payment(action.target).get("currency")
        except stripe.StripeError as exc:
            failure = provider_error(exc, f"reading {action.target}")
            # Only a read: whatever became of it, nothing was written.
            raise failure if not isinstance(failure, http.OutcomeUnknown) else http.NotSent(
                str(failure), code=failure.code, status=failure.status) from exc
        if not isinstance(currency, str):
            raise http.NotSent(f"reading {action.target}: the answer names no currency", code="bad_answer")
        if currency.upper() != params["currency"]:
            raise http.Rejected(f"{action.target} was paid in {currency.upper()}, the refund asks for "
                                f"{params['currency']}", code="currency_mismatch")
        metadata = {"operation_key": action.operation_key}
        if params.get("reason"):
            metadata["reason"] = params["reason"]
        try:
            refund = self._client().v1.refunds.create(
                params={_kind(action.target): action.target, "amount": amount, "metadata": metadata},
                options={"idempotency_key": action.operation_key},
            )
        except stripe.StripeError as exc:
            raise provider_error(exc, "creating the refund") from exc
        result = refund.to_dict(for_json=True)
        if result.get("object") != "refund" or not isinstance(result.get("id"), str):
            raise http.OutcomeUnknown(f"creating the refund: the answer is not a refund: {result}",
                                      code="not_a_refund")
        if refund.last_response is not None and refund.last_response.headers.get("Idempotent-Replayed") == "true":
            result = self._refund_now(action, result)
        if result.get("status") in _FAILED:
            raise http.Rejected(f"Stripe refund {result['id']} {result['status']}: "
                                f"{http.said(result.get('failure_reason') or 'no reason given')}",
                                code=f"refund_{result['status']}", status=200)
        return Effect(external_ref=result["id"], result=result)

    def _refund_now(self, action, saved):
        """The refund Stripe's replayed answer names, as Stripe holds it now. Stripe answers a key
        it has seen with its saved first answer, the refund as it was made (`pending`): one that
        failed since, which verification found not made (so the action was tried again under its
        key), would read as made. Unread, the outcome is unknown, and verification decides."""
        try:
            now = [refund for refund in self._refunds_under_key(action) if refund.get("id") == saved["id"]]
        except stripe.StripeError as exc:
            raise http.OutcomeUnknown(f"Stripe replayed refund {saved['id']}; reading it as it is now: "
                                      f"{provider_error(exc, 'listing refunds')}",
                                      code="replayed_refund_unread") from exc
        if not now:
            raise http.OutcomeUnknown(f"Stripe replayed refund {saved['id']}, which the target's refunds do not list",
                                      code="replayed_refund_unread")
        return now[0]

    def _refunds_under_key(self, action):
        """The refunds of the action's target that carry its operation key, as Stripe lists them now."""
        refunds = self._client().v1.refunds.list(params={_kind(action.target): action.target, "limit": 100})
        return [refund for refund in (item.to_dict(for_json=True) for item in refunds.auto_paging_iter())
                if (refund.get("metadata") or {}).get("operation_key") == action.operation_key]

    def replay_target(self, amount, currency):
        """Test mode only (the replay set, ledger.replay): a new charge to refund, paid with
        Stripe's test card token; at a Stripe-compatible test server that takes only Stripe's
        test payment methods (localstripe answers `tok_visa` 400), with the same card's
        `pm_card_visa`; at the sandbox's Stripe wire format, a new order."""
        params = {
            "amount": self.to_provider_units(amount, currency), "currency": currency.lower(), "source": "tok_visa"}
        try:
            return self._client().v1.charges.create(params=params).id
        except stripe.InvalidRequestError as refused:
            # localstripe names no param in its refusal, so the card is tried again whatever was
            # refused; if that fails too, the first refusal is the one to show (a bad amount, say).
            try:
                return self._client().v1.charges.create(params={**params, "source": "pm_card_visa"}).id
            except stripe.InvalidRequestError:
                raise refused from None

    def find_effect(self, action):
        kind = _kind(action.target)
        try:
            matches = self._refunds_under_key(action)
        except stripe.StripeError as exc:
            return Lookup(found=None, evidence={"lookup": provider_error(exc, "listing refunds").evidence()})
        evidence = {"lookup": f"refunds of {kind} {action.target} by metadata.operation_key",
                    "matches": [(refund.get("id"), refund.get("status")) for refund in matches]}
        made = [refund for refund in matches if refund.get("status") not in _FAILED]
        if not made:
            return Lookup(found=False, evidence=evidence)
        return Lookup(found=True, external_ref=made[0]["id"], result=made[0], evidence=evidence)

    def find_order(self, order_id):
        """The charge or payment intent a refund names."""
        try:
            payment = self._payment(order_id)
        except stripe.StripeError as exc:
            raise provider_error(exc, f"reading {order_id}") from exc
        units, currency = payment.get("amount"), payment.get("currency")
        amount = self.from_provider_units(units, currency) if isinstance(units, int) and isinstance(currency, str) else None
        return {"order_id": payment.get("id") or order_id, "customer": payment.get("customer") or "",
                "amount": None if amount is None else str(amount)}

    def records(self, since, until):
        """Every refund created in [since, until), as Stripe lists them (newest first, paged).
        Stripe's `created` has whole seconds: both ends are cut to the second, so that
        adjacent windows share no refund."""
        try:
            refunds = self._client().v1.refunds.list(params={
                "created": {"gte": int(since.timestamp()), "lt": int(until.timestamp())}, "limit": 100})
            for item in refunds.auto_paging_iter():
                refund = item.to_dict(for_json=True)
                yield Record(
                    operation_key=(refund.get("metadata") or {}).get("operation_key", ""), external_ref=refund["id"],
                    amount=self.from_provider_units(refund["amount"], refund["currency"]), units=int(refund["amount"]),
                    currency=refund["currency"].upper(), created_at=datetime.fromtimestamp(refund["created"], UTC),
                    action_type=ActionType.REFUND, raw=refund, made=refund.get("status") not in _FAILED,
                )
        except stripe.StripeError as exc:
            raise provider_error(exc, "listing refunds") from exc

    def test_mode_event(self, raw):
        """Whether `raw`, read before its signature is checked, is an event of Stripe's test mode
        (`"livemode": false`) sent to this connector in live mode (its key a live one): Stripe signs
        it with the test endpoint's secret, so the webhook view reads it with the test mode's
        (ledger.webhooks), never with this one's. Where this connector's own key is a test key (a
        staging deployment), such events are its own."""
        if not self.options["api_key"].startswith(("sk_live_", "rk_live_")):
            return False
        try:
            return json.loads(raw).get("livemode") is False
        except (ValueError, AttributeError, RecursionError):  # no JSON object: the reader says so
            return False

    def read_webhook(self, raw, headers):
        """A Stripe event in the webhook view's terms: {"id", "type", "data"}, where "type" is
        `refund.succeeded` or `refund.failed` for a refund that settled, and "data" the refund;
        for an event about no refund, its own type and no data (it settles nothing).

        The event is kept as near to what came as the columns allow: a NUL or a lone surrogate
        (JSON's escapes name them) by U+FFFD, a number that is not finite by its text, as a
        provider's answers are (json_input.storable): refused, a correctly signed event would only
        come again, unchanged, for days. A refund event whose refund id, status or operation key had
        to be mended settles nothing (mended, they might name another refund or action): it is read
        as about no refund, and says why in "unreadable".

        Raises WebhookRefused, saying why, for a body whose `Stripe-Signature` the SDK refuses
        (bad, missing, or older than its tolerance): the signature is checked over the bytes that
        came, before anything is mended.
        """
        if not self.options["webhook_secret"]:
            raise WebhookRefused("no webhook secret is configured (STRIPE_WEBHOOK_SECRET)")
        signature = headers.get("Stripe-Signature")
        if signature is not None and not signature.isascii():
            # The SDK's comparison raises TypeError on it, which would read as a body that is no event.
            raise WebhookRefused("bad Stripe-Signature: characters past ASCII")
        try:
            stripe.Webhook.construct_event(raw, signature, self.options["webhook_secret"])
        except stripe.SignatureVerificationError as exc:
            raise WebhookRefused(f"bad, missing or stale Stripe-Signature: {exc.user_message}") from None
        except (AttributeError, TypeError, RecursionError) as exc:  # signed, but no JSON object (or nested too deep)
            raise ValueError("not an event") from exc
        came = json.loads(raw)  # a JSON object: the SDK has read it
        event = storable(came)
        data = event["data"].get("object") if isinstance(event.get("data"), dict) else None
        if not isinstance(data, dict):
            raise ValueError("the event carries no object")
        if not isinstance(event.get("type"), str):
            raise ValueError("the event's type is not text")
        if event["type"] not in _EVENT_TYPES or data.get("object") != "refund":
            # Verified, but about no refund (a charge's own event, or any type the endpoint was
            # subscribed to): stored and answered 200, settling nothing. Refused, Stripe would
            # send it again for days and then turn the endpoint off.
            return {"id": event.get("id"), "type": event["type"], "data": {}, "stripe_event": event}
        refund = came["data"]["object"]
        mended = [name for name, value in (("id", refund.get("id")), ("status", refund.get("status")),
                                           ("operation key", named_operation_key(refund)))
                  if storable(value) != value]
        if mended:
            # Mended, `refund:\x00` would read as `refund:\ufffd`, which may be another action's key.
            return {"id": event.get("id"), "type": event["type"], "data": {}, "stripe_event": event,
                    "unreadable": f"the refund's {' and '.join(mended)} held a NUL, a lone surrogate or a number "
                                  "that is not finite: kept mended, it settles nothing"}
        settled_as = _SETTLED_AS.get(data.get("status"), f"refund.{data.get('status')}")
        return {"id": event.get("id"), "type": settled_as, "data": data, "stripe_event": event}


class _LedgerHTTP(stripe.HTTPClient):
    """The SDK's HTTP client, as the SDK lets one be given: each request through `http.exchange`,
    held to the deadline of the connector's write or look-up it is part of. A request that gets
    no whole answer by then fails as the SDK's own clients fail (`APIConnectionError`), caused by
    the ledger's `NotSent` or `OutcomeUnknown`, which `provider_error` passes on."""

    name = "surety"

    def request(self, method, url, headers, post_data=None):
        try:
            response = http.exchange(method.upper(), url, headers=headers, content=post_data)
        except (http.NotSent, http.OutcomeUnknown) as exc:
            raise stripe.APIConnectionError(str(exc), should_retry=False) from exc
        return response.content, response.status_code, response.headers

    def request_stream(self, method, url, headers, post_data=None):
        content, status, response_headers = self.request(method, url, headers, post_data)
        return iter((content,)), status, response_headers

    def close(self):
        pass  # the connections are http's, pooled per process


def _kind(target):
    """What a target names at Stripe: a payment intent (`pi_…`) or a charge."""
    return "payment_intent" if target.startswith("pi_") else "charge"


def provider_error(exc, doing):
    """The ledger's kind of failure for one of the SDK's errors, as Stripe documents them."""
    status = exc.http_status
    message = f"Stripe, {doing}: {http.said(exc.user_message or str(exc))}"
    if isinstance(exc, stripe.APIConnectionError):
        cause = exc.__cause__  # what http.exchange raised (`_LedgerHTTP`)
        if isinstance(cause, http.ProviderError):
            return type(cause)(f"Stripe, {doing}: {cause}", code=cause.code, status=cause.status)
        return http.OutcomeUnknown(message, code="connection_lost")
    if isinstance(exc, stripe.IdempotencyError) or status == 409:
        # Stripe ran nothing for this request: the key is in use by a request still running
        # (409), or was first used with other parameters (400). That request's effect is what
        # counts, and only looking it up can tell.
        return http.OutcomeUnknown(message, code="idempotency_conflict", status=status)
    if isinstance(exc, stripe.RateLimitError):
        return http.NotSent(message, code="rate_limited", status=status, retry_after=http.retry_after(exc.headers))
    if isinstance(exc, (stripe.AuthenticationError, stripe.PermissionError)):
        # Refused before anything ran: a wrong or revoked key, which an operator must fix.
        return http.NotSent(message, code="not_authorized", status=status)
    if isinstance(exc, (stripe.CardError, stripe.InvalidRequestError)) and status and status < 500:
        return http.Rejected(message, code=exc.code or f"http_{status}", status=status)
    # A 5xx, or an answer that is not Stripe's JSON (an HTML error page, a cut-off body):
    # the request may have been acted on. The body is kept as evidence, as much of it as a
    # failure's message holds (http.ProviderError).
    body = exc.http_body if isinstance(exc.http_body, str) else repr(exc.http_body)
    return http.OutcomeUnknown(f"{message}; body: {body}", code=f"http_{status}" if status else "bad_answer",
                               status=status)
