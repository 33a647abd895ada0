"""The sandbox provider in Stripe's wire format: the part of Stripe's API that refunds need.

The official `stripe` SDK reaches it when its API base is `<site>/sandbox/stripe`:

- `POST /v1/refunds`, form-encoded: `charge` or `payment_intent`, `amount` in Stripe's units of
  the currency (ledger.connectors.stripe_amounts: 500000 for 5000 HUF), `metadata[...]`. An `Idempotency-Key` is replayed as Stripe does: the same key
  with the same parameters answers the first refund again with `Idempotent-Replayed: true`;
  with other parameters it is a 400 `idempotency_error`.
- `GET /v1/refunds?charge=…|payment_intent=…&created[gte]=…&created[lt]=…&limit=…&starting_after=…`:
  newest first, in Stripe's list envelope.
- `GET /v1/charges/{id}`, `GET /v1/payment_intents/{id}`: the sandbox's orders as Stripe shows
  a payment (an order id starting `pi_` is a payment intent, any other a charge).
- `POST /v1/charges`, form-encoded: `amount` (Stripe's units), `currency` (one that some country
  pays in), a test `source` such as `tok_visa`: a new order whose id is the charge's `ch_…`, as
  Stripe's test mode makes one (the replay set's refunds need a charge to refund).

As Stripe does, a refund of more than is left of its payment is refused (`amount_too_large`;
`charge_already_refunded` once nothing is left), and so is a refund without `amount` of a payment
refunded in part (Stripe would refund what is left). A URL it does not serve is Stripe's 404. A refund lists with its own status: `succeeded` as made,
`failed` or `canceled` once the provider failed it later (staged in its table: Stripe's test card
4000000000005126 does the same, some time after the refund).

Errors are Stripe's `{"error": {"type", "code", "message", …}}`. A secret key of test mode
(`sk_test_…`) is accepted. It shares its store and its fault script with the sandbox's own API
(`views.py`): a refund made here is one of the order's refunds there, and a fault armed for an
order fires on either. As Stripe does, a key whose request answered a 500 answers every retry
with it. Unlike Stripe, a second request with a key still in use waits for the first and
replays its answer (Stripe answers 409).
"""

import functools
import secrets
from datetime import UTC, datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Sum
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from ledger import currencies
from ledger.connectors import stripe_amounts

from . import views
from .models import SandboxIdempotencyKey, SandboxOrder, SandboxRefund, SandboxSettings

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 402: "card_error", 404: "invalid_request_error"}
# The sandbox's own error codes, as Stripe names the same failures.
_CODES = {"declined": "card_declined", "internal_error": None, "timeout": None}
# A charge below this fits an order's amount column (12 digits, 3 of them decimals).
MAX_CHARGE = 10**9


class StripeError(Exception):
    def __init__(self, status, code, message, **details):
        super().__init__(message)
        self.response = stripe_error(status, code, message, **details)


def stripe_error(status, code, message, **details):
    """An error answer as Stripe gives it: a 5xx is an `api_error`, a 402 a `card_error`."""
    error = {"type": _TYPES.get(status, "api_error"), "message": message, **details}
    code = _CODES.get(code, code)
    if code:
        error["code"] = code
    if code == "card_declined":
        error["decline_code"] = "generic_decline"
    return JsonResponse({"error": error}, status=status)


def endpoint(**views_by_method):
    """One URL's view: a test-mode secret key, then the view for the HTTP method.

    Not in a request-wide transaction, as in views.endpoint: a timeout_after_commit fault
    must have committed its effect before it stalls."""

    @csrf_exempt
    @transaction.non_atomic_requests
    def view(request, *args, **kwargs):
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip().startswith("sk_test_"):
            return stripe_error(401, None, "Invalid API Key provided: use a test-mode secret key (sk_test_…).")
        handler = views_by_method.get(request.method)
        if handler is None:
            return stripe_error(405, None, f"Unrecognized request URL ({request.method}).")
        try:
            return handler(request, *args, **kwargs)
        except StripeError as exc:
            return exc.response

    return view


def _form(request, known):
    """The form-encoded parameters, with `metadata[key]` gathered into a dict."""
    params, metadata = {}, {}
    for name, value in request.POST.items():
        if name.startswith("metadata[") and name.endswith("]"):
            metadata[name[len("metadata["):-1]] = value
        elif name in known:
            params[name] = value
        else:
            raise StripeError(400, "parameter_unknown", f"Received unknown parameter: {name}", param=name)
        if "\x00" in name or "\x00" in value:
            raise StripeError(400, "parameter_invalid_string", "Parameters must not contain NUL.", param=name)
    if any(len(key) > 40 or len(value) > 500 for key, value in metadata.items()):
        raise StripeError(400, "metadata_key_length_exceeded", "Metadata keys are at most 40 characters and "
                          "values at most 500.", param="metadata")
    if len(metadata.get("operation_key", "")) > 255:
        raise StripeError(400, "parameter_invalid_string", "metadata[operation_key] is at most 255 characters "
                          "in this sandbox.", param="metadata")
    return params, metadata


def _order(order_id, param):
    order = SandboxOrder.objects.filter(order_id=order_id).first() if "\x00" not in order_id else None
    if order is None:
        raise StripeError(404, "resource_missing", f"No such {param}: '{order_id}'", param=param)
    return order


def _units(amount, currency):
    """A stored amount in Stripe's units of its currency. One made through the sandbox's own API
    that Stripe could not hold (1.2345 of a currency it has two decimals of) is shown cut to them."""
    return int(Decimal(amount).scaleb(stripe_amounts.digits(currency)))


def _refunded(order):
    """How much of `order` is refunded: its refunds in its currency (the sandbox's own API takes a
    refund of an order in any currency)."""
    # A refund failed or canceled gave nothing back, as at Stripe.
    refunds = SandboxRefund.objects.filter(order_id=order.order_id, currency=order.currency).exclude(
        status__in=("failed", "canceled"))
    return refunds.aggregate(total=Sum("amount"))["total"] or 0


def _payment(order):
    is_intent = order.order_id.startswith("pi_")
    return {
        "id": order.order_id,
        "object": "payment_intent" if is_intent else "charge",
        "amount": _units(order.amount, order.currency),
        "amount_refunded": _units(_refunded(order), order.currency),
        "currency": order.currency.lower(),
        "created": int(order.created_at.timestamp()),
        "metadata": {"customer": order.customer},
        "status": "succeeded",
    }


def _refund(refund):
    is_intent = refund.order_id.startswith("pi_")
    return {
        "id": refund.refund_id,
        "object": "refund",
        "amount": _units(refund.amount, refund.currency),
        "balance_transaction": None,
        "charge": None if is_intent else refund.order_id,
        "created": int(refund.created_at.timestamp()),
        "currency": refund.currency.lower(),
        "metadata": refund.metadata,
        "payment_intent": refund.order_id if is_intent else None,
        "reason": None,
        "status": refund.status,
    }


# Keys whose first request answered a 500: Stripe saves that answer and gives it to every
# retry with the key (for 24 hours), so the key can never make a refund.
_FAILED_SCOPE = "stripe-500:sandboxrefund"


def _idempotent(key):
    return bool(key) and SandboxSettings.load().idempotency


def _replay_conflict(key, refund):
    """Whether `key` already made a refund with other parameters (Stripe refuses to reuse it)."""
    if not _idempotent(key):
        return False
    claim = SandboxIdempotencyKey.objects.filter(scope="sandboxrefund", key=key).first()
    if claim is None:
        return False
    first = SandboxRefund.objects.get(refund_id=claim.effect_id)
    return (first.order_id, first.amount, first.metadata) != (refund.order_id, refund.amount, refund.metadata)


def _refundable(refund):
    """Refuse, as Stripe does, a refund of more than is left of its payment. Run where the refund is
    saved, after its key's replay: the payment's row is locked until then, so two refunds at once
    cannot both take what is left."""
    order = SandboxOrder.objects.select_for_update().get(order_id=refund.order_id)
    left = order.amount - _refunded(order)
    if left <= 0:
        raise StripeError(400, "charge_already_refunded", f"Charge {order.order_id} has already been refunded.")
    if refund.amount > left:
        shown = [stripe_amounts.from_units(_units(amount, order.currency), order.currency)
                 for amount in (refund.amount, left)]
        raise StripeError(400, "amount_too_large", f"Refund amount ({shown[0]} {order.currency}) is greater than "
                          f"unrefunded amount on charge ({shown[1]} {order.currency}).", param="amount")


def refund_create(request):
    params, metadata = _form(request, {"charge", "payment_intent", "amount"})
    if ("charge" in params) == ("payment_intent" in params):
        raise StripeError(400, "parameter_missing", "Provide exactly one of charge or payment_intent.")
    param = "charge" if "charge" in params else "payment_intent"
    order = _order(params[param], param)
    amount = params.get("amount")
    if amount is not None and not views.whole_number(amount, 1, 10**12 - 1):
        raise StripeError(400, "parameter_invalid_integer", "amount must be a positive integer.", param="amount")
    try:
        key = views._idempotency_key(request)
    except views.InvalidInput:
        raise StripeError(400, None, "Idempotency-Key must be 1 to 255 printable ASCII characters.") from None
    refund = SandboxRefund(
        order_id=order.order_id, currency=order.currency, metadata=metadata,
        operation_key=metadata.get("operation_key", ""), idempotency_key=key,
        amount=order.amount if amount is None else stripe_amounts.from_units(amount, order.currency),
    )
    if _replay_conflict(key, refund):
        raise StripeError(400, None, "Keys for idempotent requests can only be used with the same parameters "
                          f"they were first used with. Try using a key other than '{key}' if you meant to "
                          "execute a different request.", type="idempotency_error")
    if _idempotent(key) and SandboxIdempotencyKey.objects.filter(scope=_FAILED_SCOPE, key=key).exists():
        response = stripe_error(500, "internal_error", "Injected fault: the provider failed.")
        response["Idempotent-Replayed"] = "true"
        return response
    response = views._write(refund, target=order.order_id, body=_refund, error=stripe_error,
                            check=functools.partial(_refundable, refund))
    if response.status_code == 500 and _idempotent(key):
        SandboxIdempotencyKey.objects.get_or_create(scope=_FAILED_SCOPE, key=key)
    # The sandbox's own API answers 201 for a new effect and 200 for a replay; Stripe, 200 for
    # both and the header for a replay.
    if response.status_code == 200:
        response["Idempotent-Replayed"] = "true"
    elif response.status_code == 201:
        response.status_code = 200
    return response


def _created(request, bound):
    """`created[gte]` or `created[lt]`: a time in Unix seconds, as Stripe's lists take it."""
    value = request.GET[f"created[{bound}]"]
    if not views.whole_number(value, 0, 2**32 - 1):
        raise StripeError(400, "parameter_invalid_integer", f"created[{bound}] must be a Unix time in seconds.",
                          param=f"created[{bound}]")
    return datetime.fromtimestamp(int(value), UTC)


def refund_list(request):
    filters = {name: request.GET[name] for name in ("charge", "payment_intent") if name in request.GET}
    unknown = set(request.GET) - {"charge", "payment_intent", "limit", "starting_after", "created[gte]", "created[lt]"}
    if unknown:
        raise StripeError(400, "parameter_unknown", f"Received unknown parameter: {min(unknown)}")
    if any("\x00" in value for value in request.GET.values()):
        raise StripeError(400, "parameter_invalid_string", "Parameters must not contain NUL.")
    limit = request.GET.get("limit", "10")
    if not views.whole_number(limit, 1, 100):
        raise StripeError(400, "parameter_invalid_integer", "limit must be between 1 and 100.", param="limit")
    refunds = SandboxRefund.objects.order_by("-pk")
    if filters:
        refunds = refunds.filter(order_id__in=filters.values())
    if "created[gte]" in request.GET:
        refunds = refunds.filter(created_at__gte=_created(request, "gte"))
    if "created[lt]" in request.GET:
        refunds = refunds.filter(created_at__lt=_created(request, "lt"))
    if "starting_after" in request.GET:
        after = SandboxRefund.objects.filter(refund_id=request.GET["starting_after"]).first()
        if after is None:
            raise StripeError(404, "resource_missing", f"No such refund: '{request.GET['starting_after']}'",
                              param="starting_after")
        refunds = refunds.filter(pk__lt=after.pk)
    page = list(refunds[: int(limit) + 1])
    return JsonResponse({"object": "list", "url": "/v1/refunds", "has_more": len(page) > int(limit),
                         "data": [_refund(refund) for refund in page[: int(limit)]]})


def charge_create(request):
    params, metadata = _form(request, {"amount", "currency", "source", "description"})
    amount, currency = params.get("amount", ""), params.get("currency", "")
    if not views.whole_number(amount, 1, 10**12 - 1):
        raise StripeError(400, "parameter_invalid_integer", "amount must be a positive integer.", param="amount")
    if not (currency.isascii() and currencies.is_payable(currency.upper())):
        raise StripeError(400, "parameter_invalid_string", f"Invalid currency: {currency.lower()}. Give the "
                          "three-letter ISO code of a currency one may pay in.", param="currency")
    amount = stripe_amounts.from_units(amount, currency.upper())
    if amount >= MAX_CHARGE:
        raise StripeError(400, "amount_too_large", f"Amount must be below {MAX_CHARGE} {currency.upper()}.",
                          param="amount")
    customer = metadata.get("customer", "")
    if len(customer) > SandboxOrder._meta.get_field("customer").max_length:
        raise StripeError(400, "parameter_invalid_string", "metadata[customer] is at most 255 characters in this "
                          "sandbox.", param="metadata")
    order = SandboxOrder.objects.create(
        order_id=f"ch_{secrets.token_hex(12)}", customer=customer, currency=currency.upper(), amount=amount)
    return JsonResponse(_payment(order))


@csrf_exempt
def not_found(request):
    return stripe_error(404, None, f"Unrecognized request URL ({request.method}: {request.path}).")


def charge_detail(request, charge_id):
    return JsonResponse(_payment(_order(charge_id, "charge")))


def payment_intent_detail(request, payment_intent_id):
    return JsonResponse(_payment(_order(payment_intent_id, "payment_intent")))
