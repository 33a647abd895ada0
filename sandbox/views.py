"""The sandbox provider's HTTP API: one function view per operation, JSON in and out.

Errors are `{"error": {"code", "message", …}}`, as a payments provider would answer.
"""

import functools
import hmac
import time
from datetime import UTC

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.http import JsonResponse
from django.utils.dateparse import parse_datetime
from django.views.decorators.csrf import csrf_exempt

from ledger import money
from ledger.json_input import loads_storable
from ledger.models import Agent

from . import forms, webhooks
from .models import (
    SandboxBooking,
    SandboxFault,
    SandboxIdempotencyKey,
    SandboxMessage,
    SandboxOrder,
    SandboxRefund,
    SandboxSettings,
    SandboxWebhook,
    SlotTaken,
    effect_save,
)


class InvalidInput(Exception):
    def __init__(self, errors):
        super().__init__(errors)
        self.errors = errors


def error_response(status, code, message, **details):
    return JsonResponse({"error": {"code": code, "message": message, **details}}, status=status)


def _authenticated(request):
    """The sandbox connector's key, or any active agent's token."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return False
    # Compared as bytes: compare_digest refuses non-ASCII str, which a header may carry.
    if hmac.compare_digest(token.encode(), settings.SANDBOX_API_KEY.encode()):
        return True
    return Agent.objects.for_token(token) is not None


def endpoint(**views_by_method):
    """One URL's view: authenticate, then hand the request to the view for its HTTP method.

    Never wrapped in a request-wide transaction, even with ATOMIC_REQUESTS on: a
    timeout_after_commit fault must have committed its effect before it stalls.
    """

    @csrf_exempt
    @transaction.non_atomic_requests
    def view(request, *args, **kwargs):
        if not _authenticated(request):
            return error_response(401, "unauthorized", "A valid bearer token is required.")
        handler = views_by_method.get(request.method)
        if handler is None:
            response = error_response(405, "method_not_allowed", f"{request.method} is not allowed here.")
            response["Allow"] = ", ".join(views_by_method)
            return response
        try:
            return handler(request, *args, **kwargs)
        except InvalidInput as exc:
            return error_response(400, "invalid", "The request is invalid.", fields=exc.errors)

    return view


@csrf_exempt
def not_found(request):
    return error_response(404, "not_found", f"No endpoint {request.path}.")


def _json_body(request):
    try:
        data = loads_storable(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput({"body": ["Must be JSON."]}) from None
    if not isinstance(data, dict):
        raise InvalidInput({"body": ["Must be a JSON object."]})
    return data


def _valid(form_class, request):
    form = form_class(data=_json_body(request))
    if not form.is_valid():
        raise InvalidInput({field: [str(error) for error in errors] for field, errors in form.errors.items()})
    return form.cleaned_data


def _idempotency_key(request):
    key = request.headers.get("Idempotency-Key") or None
    if key is not None and not (len(key) <= 255 and key.isascii() and key.isprintable()):
        raise InvalidInput({"Idempotency-Key": ["Must be 1 to 255 printable ASCII characters."]})
    return key


def _filters(request, *names):
    found = {name: request.GET[name] for name in names if name in request.GET}
    # PostgreSQL refuses NUL in a query (DataError, a 500).
    bad = {name: ["Must not contain NUL."] for name, value in found.items() if "\x00" in value}
    if bad:
        raise InvalidInput(bad)
    return found


def whole_number(value, low, high):
    """Whether `value`, a parameter as sent, is a whole number from `low` to `high` in ASCII digits.
    Its length is checked before int() reads it: int() refuses more than 4,300 digits (a ValueError)."""
    return (value.isascii() and value.isdigit() and len(value.lstrip("0")) <= len(str(high))
            and low <= int(value) <= high)


# A page of a listing: at most this many effects, and this many unless told otherwise.
PAGE_LIMIT_MAX = 1000
PAGE_LIMIT_DEFAULT = 100


def _moment(request, name):
    """An ISO 8601 time with its offset ("Z" or "+02:00"), as a provider's listing takes it."""
    try:
        moment = parse_datetime(request.GET[name])
        if moment is not None and moment.tzinfo is not None:
            return moment.astimezone(UTC)  # OverflowError at the edge of the calendar
    except (ValueError, OverflowError):
        pass
    raise InvalidInput({name: ["Must be an ISO 8601 time with its offset, e.g. 2026-09-10T03:14:02Z."]})


def _lookup_failed():
    """A look-up's answer while a lookup_error fault is armed for what it asks about."""
    return error_response(500, "internal_error", "Injected fault: the provider could not be asked.")


def _effect_list(request, model, body, *names):
    """The effects matching the filters `names`, oldest first.

    Asked with `since` (inclusive) or `until` (exclusive) on the creation time, `limit` or
    `starting_after`, the list is paged: at most `limit` effects (1 to 1000, default 100)
    after the effect whose id is `starting_after`, and `has_more` says whether more follow.
    Pages go by (creation time, row), so effects created meanwhile never shift a page.
    Otherwise every matching effect is listed at once, with no `has_more`, as before paging.
    """
    filters = _filters(request, *names)
    if any(SandboxFault.objects.consume(value, lookup=True) for value in filters.values()):
        return _lookup_failed()
    effects = model.objects.filter(**filters)
    if not {"since", "until", "limit", "starting_after"} & set(request.GET):
        return JsonResponse({"data": [body(effect) for effect in effects]})
    if "since" in request.GET:
        effects = effects.filter(created_at__gte=_moment(request, "since"))
    if "until" in request.GET:
        effects = effects.filter(created_at__lt=_moment(request, "until"))
    limit = request.GET.get("limit", str(PAGE_LIMIT_DEFAULT))
    if not whole_number(limit, 1, PAGE_LIMIT_MAX):
        raise InvalidInput({"limit": [f"Must be a whole number from 1 to {PAGE_LIMIT_MAX}."]})
    limit = int(limit)
    after = _filters(request, "starting_after").get("starting_after")
    if after is not None:
        last = model.objects.filter(**{model.ID_FIELD: after}).values("created_at", "pk").first()
        if last is None:
            raise InvalidInput({"starting_after": [f"No {model._meta.verbose_name} has this id."]})
        effects = effects.filter(Q(created_at__gt=last["created_at"]) | Q(created_at=last["created_at"], pk__gt=last["pk"]))
    page = list(effects.order_by("created_at", "pk")[: limit + 1])
    return JsonResponse({"data": [body(effect) for effect in page[:limit]], "has_more": len(page) > limit})


def _write(effect, *, target, body, check=None, error=error_response, events=False):
    """Create one refund, message or booking the way a flaky real provider would; `error`
    answers in the wire format of the caller (this API's, or Stripe's: see stripe_api.py).
    With `events` (this API's own calls) a new effect or a decline sends its webhook event.

    1. Use up a fault armed for the target, if any; it is spent even if the call writes nothing.
    2. error_500, decline and timeout_before_commit answer without writing anything.
    3. Otherwise save the effect, or find the one already saved under the same Idempotency-Key.
    4. timeout_after_commit stalls only after the commit, so the effect is visible to a lookup
       while the caller has given up waiting for the answer (and its event is on its way).
    5. failed_after_commit fails a new effect once it is committed (`_fail`); the answer is
       the effect as made.
    """
    switches = SandboxSettings.for_write(target)
    fault = SandboxFault.objects.consume(target) if switches.fault_armed else None
    if fault == SandboxFault.Kind.ERROR_500:
        return error(500, "internal_error", "Injected fault: the provider failed.")
    if fault == SandboxFault.Kind.DECLINE:
        if events:
            declined = {**body(effect), "status": "failed", "failure_code": "declined"}
            webhooks.webhook_emit(effect, declined, committed=False, switches=switches)
        return error(402, "declined", "Injected fault: the provider declined the request.")
    if fault == SandboxFault.Kind.TIMEOUT_BEFORE_COMMIT:
        time.sleep(settings.SANDBOX_TIMEOUT_SLEEP)
        return error(504, "timeout", "Injected fault: timed out before committing anything.")
    try:
        with transaction.atomic():  # an effect and its event commit together
            effect, created = effect_save(effect, idempotency=switches.idempotency, check=check)
            if events and created:
                webhooks.webhook_emit(effect, body(effect), committed=True, switches=switches)
    except SlotTaken as exc:
        return error(
            409, "slot_taken", "The resource is already booked for that time.", booking=exc.booking.booking_id
        )
    if fault == SandboxFault.Kind.FAILED_AFTER_COMMIT and created:
        _fail(effect, body, events=events, switches=switches)
    if fault == SandboxFault.Kind.TIMEOUT_AFTER_COMMIT:
        time.sleep(settings.SANDBOX_TIMEOUT_SLEEP)
    return JsonResponse(body(effect), status=201 if created else 200)


def _fail(effect, body, *, events, switches):
    """The provider fails the effect it has just made, as Stripe fails a refund to a card closed
    since the payment (decision 60): a refund is listed `failed` from now on (a message or a booking
    keeps its status), and with `events` the effect's failure event is recorded after its success
    event (each delivered on its own: they may arrive in either order). `effect` keeps the status it
    was made with: the call is answered that it was made."""
    with transaction.atomic():
        if isinstance(effect, SandboxRefund):
            SandboxRefund.objects.filter(pk=effect.pk).update(status="failed")
        if events:
            webhooks.webhook_emit(effect, {**body(effect), "status": "failed"}, committed=False, switches=switches)


# --- Refunds ----------------------------------------------------------------------------------


def _effect_create(request, form_class, model, *, target, body, check=None):
    """One effect from a write call: the form's cleaned fields are named as the model's."""
    effect = model(**_valid(form_class, request), idempotency_key=_idempotency_key(request))
    return _write(effect, target=getattr(effect, target), body=body, check=check and functools.partial(check, effect),
                  events=True)


def _refund_body(refund):
    return {
        "id": refund.refund_id,
        "object": "refund",
        "order_id": refund.order_id,
        "amount": str(money.quantized(refund.amount, refund.currency)),
        "currency": refund.currency,
        "metadata": refund.metadata,
        "operation_key": refund.operation_key,
        "status": "succeeded",
        "created": refund.created_at.isoformat(),
    }


def _refund_listed(refund):
    """A refund as the lists and its order show it: as it stands (one failed after it was made is
    `failed` from then on, as Stripe lists it). Its create's answer, and a replay of it, say what
    was made then (`_refund_body`)."""
    return {**_refund_body(refund), "status": refund.status}


def refund_create(request):
    return _effect_create(request, forms.RefundForm, SandboxRefund, target="order_id", body=_refund_body)


def refund_list(request):
    return _effect_list(request, SandboxRefund, _refund_listed, "order_id", "operation_key")


# --- Messages ---------------------------------------------------------------------------------


def _message_body(message):
    return {
        "id": message.message_id,
        "object": "message",
        "recipient": message.recipient,
        "channel": message.channel,
        "message_type": message.message_type,
        "body": message.body,
        "metadata": message.metadata,
        "operation_key": message.operation_key,
        "status": "sent",
        "created": message.created_at.isoformat(),
    }


def message_create(request):
    return _effect_create(request, forms.MessageForm, SandboxMessage, target="recipient", body=_message_body)


def message_list(request):
    return _effect_list(request, SandboxMessage, _message_body, "recipient", "operation_key")


# --- Bookings ---------------------------------------------------------------------------------


def _booking_body(booking):
    return {
        "id": booking.booking_id,
        "object": "booking",
        "resource": booking.resource,
        "customer": booking.customer,
        "service": booking.service,
        "start": booking.start.isoformat(),
        "end": booking.end.isoformat(),
        "metadata": booking.metadata,
        "operation_key": booking.operation_key,
        "status": "confirmed",
        "created": booking.created_at.isoformat(),
    }


def booking_create(request):
    return _effect_create(request, forms.BookingForm, SandboxBooking, target="resource", body=_booking_body,
                          check=SandboxBooking.ensure_slot_free)


def booking_list(request):
    return _effect_list(request, SandboxBooking, _booking_body, "resource", "operation_key")


# --- Orders -----------------------------------------------------------------------------------


def _order_body(order, refunds):
    return {
        "id": order.order_id,
        "object": "order",
        "order_id": order.order_id,
        "customer": order.customer,
        "amount": str(money.quantized(order.amount, order.currency)),
        "currency": order.currency,
        "created": order.created_at.isoformat(),
        "refunds": [_refund_listed(refund) for refund in refunds],
    }


def order_create(request):
    data = _valid(forms.OrderForm, request)
    order, created = SandboxOrder.objects.get_or_create(
        order_id=data["order_id"],
        defaults={"customer": data["customer"], "amount": data["amount"], "currency": data["currency"]},
    )
    if not created and (order.customer, order.amount, order.currency) != (
        data["customer"],
        data["amount"],
        data["currency"],
    ):
        return error_response(409, "order_exists", "An order with this id exists with other details.")
    refunds = SandboxRefund.objects.filter(order_id=order.order_id)
    return JsonResponse(_order_body(order, refunds), status=201 if created else 200)


def order_detail(request, order_id):
    # PostgreSQL text holds no NUL, so no order id (nor a fault's target) has one.
    storable = "\x00" not in order_id
    if storable and SandboxFault.objects.consume(order_id, lookup=True):
        return _lookup_failed()
    order = SandboxOrder.objects.filter(order_id=order_id).first() if storable else None
    if order is None:
        return error_response(404, "order_not_found", f"No order {order_id}.")
    refunds = SandboxRefund.objects.filter(order_id=order_id)
    return JsonResponse(_order_body(order, refunds))


# --- Faults, settings, reset ------------------------------------------------------------------


def _fault_body(fault):
    return {"id": fault.pk, "target": fault.target, "fault": fault.fault, "remaining": fault.remaining}


def fault_create(request):
    data = _valid(forms.FaultForm, request)
    fault = SandboxFault.objects.create(target=data["target"], fault=data["fault"], remaining=data["times"])
    return JsonResponse(_fault_body(fault), status=201)


def fault_list(request):
    return JsonResponse({"data": [_fault_body(fault) for fault in SandboxFault.objects.all()]})


def fault_clear(request):
    deleted, _ = SandboxFault.objects.all().delete()
    return JsonResponse({"deleted": deleted})


def settings_read(request):
    """`idempotency`, and each webhook knob in force: as set here, else its setting's value."""
    row = SandboxSettings.load()
    return JsonResponse({"idempotency": row.idempotency, **webhooks.webhook_settings(row)})


def settings_update(request):
    """Any of `idempotency` and the webhook knobs; the answer repeats what changed."""
    data = _json_body(request)
    given = {name: data[name] for name in ("idempotency", *webhooks.SETTINGS) if name in data}
    errors = webhooks.webhook_settings_errors({k: v for k, v in given.items() if k != "idempotency"})
    if not isinstance(given.get("idempotency", True), bool) or not given:
        errors["idempotency"] = ["Must be true or false."]
    if errors:
        raise InvalidInput(errors)
    SandboxSettings.objects.update_or_create(pk=1, defaults=given)
    return JsonResponse(given)


def sandbox_reset(request):
    with transaction.atomic():
        for model in (
            SandboxRefund,
            SandboxMessage,
            SandboxBooking,
            SandboxOrder,
            SandboxFault,
            SandboxIdempotencyKey,
            SandboxWebhook,
        ):
            model.objects.all().delete()
        SandboxSettings.objects.update_or_create(
            pk=1, defaults={"idempotency": True, **dict.fromkeys(webhooks.SETTINGS)})
    return JsonResponse({"reset": True})
