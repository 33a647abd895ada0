"""Inbound provider events: verified first, stored once by event id, then acted on.

A redelivered event finds its id taken and does nothing. An event that names an operation
key settles that action, if the connector it came to serves it, and if its outcome is still open (`unknown` or `needs_review`), the
event kept in its evidence; above its limit, an `unknown` one goes to a person instead. A
failure of the very effect a succeeded action names opens an incident (decision 60), whichever
of the two events came first; so does one stored before a success left to a person, and before
any move of the action to succeeded with that effect, whoever makes it: this webhook, the worker's
call or a verifier's look answered while the failure came, a person (`failure_told_when_succeeded`,
a reaction to every move; the audit trail names the move's actor as the one who told). An event
type the ledger does not settle is stored and answered "ignored" (Stripe's reader refuses one it
does not know), and every refusal is logged.
"""

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import IntegrityError, transaction
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from . import hooks
from .api.problems import problem_response
from .connectors import NoConnector, connector_for
from .connectors.events import WebhookRefused
from .connectors.test_mode import NoTestMode, connector_for_action, is_replay_action, test_connector_for
from .json_input import loads_storable, storable
from .models import EFFECT_FAILED, Action, ActionStatus, ActionType, WebhookClaim, WebhookEvent, named_operation_key
from .signing import sign_webhook, signature_valid  # noqa: F401 (sign_webhook is imported from here too)

logger = logging.getLogger("surety.webhooks")
# What each event is about, and says: the type of action it may settle (a message's delivery naming
# a refund's key says nothing of the refund), and whether the effect was made.
SETTLING = {
    "refund.succeeded": (ActionType.REFUND, True), "message.sent": (ActionType.SEND_MESSAGE, True),
    "message.delivered": (ActionType.SEND_MESSAGE, True), "booking.confirmed": (ActionType.CREATE_BOOKING, True),
    **{event_type: (about, False) for event_type, about in EFFECT_FAILED.items()},
}
OPEN = {ActionStatus.UNKNOWN, ActionStatus.NEEDS_REVIEW}


def _sandbox_event(raw, headers):
    if not signature_valid(headers.get("Sandbox-Signature", ""), raw, settings.SANDBOX_WEBHOOK_SECRET):
        raise WebhookRefused("bad, missing or stale signature")
    # Kept to DEPTH_KEPT levels, as a provider's answers are: deeper, what stores it (json.dumps)
    # ran out of stack, and the delivery answered 500 for ever.
    event = storable(loads_storable(raw))
    # A type SETTLING does not know is stored and answered 200 "ignored" (_settle): refused, the
    # provider would send it again for days. Not an object, or no text for a type: "not an event".
    if not isinstance(event["type"], str):
        raise ValueError("the event's type is not text")
    return event


def _readers():
    """Per connector name, what verifies a raw body and its headers and returns the event
    ({"id", "type", "data"}), raising WebhookRefused: the sandbox's, and any configured
    connector's own `read_webhook` (Stripe's)."""
    readers = {"sandbox": _sandbox_event} if settings.SANDBOX_ENABLED else {}
    for action_type in settings.SURETY_CONNECTORS:
        try:
            connector = connector_for(action_type)
        except (ImportError, TypeError, ValueError):
            continue  # the system check reports it; an event is no place for a 500
        if hasattr(connector, "read_webhook"):
            readers[connector.name] = _with_test_mode(connector, action_type)
    return readers


def _with_test_mode(connector, action_type):
    """The connector's reader, and its test mode's where that has a webhook secret of its own.
    Stripe signs test-mode events with another endpoint secret than live ones, and the replay
    set's webhook case signs as the test mode does: an event only the test secret verifies is
    marked `test_mode`, and may settle a replay run's action, never a live one. An event that says
    it is of the test mode (the connector's `test_mode_event`) is read with the test secret alone,
    never with the live one; where the test mode has none (there is no test mode, or
    STRIPE_TEST_WEBHOOK_SECRET is unset, its default), it is refused, saying so."""
    try:
        test = test_connector_for(action_type)[0]
    except (NoTestMode, NoConnector, ImportError, TypeError, ValueError):
        test = None
    secret = (test.options.get("webhook_secret") if test else "") or ""
    says_test_mode = getattr(connector, "test_mode_event", None)

    def read(raw, headers):
        if says_test_mode is not None and says_test_mode(raw):
            if not secret:
                raise WebhookRefused(f"a test-mode event, and no webhook secret is configured for the {connector.name} "
                                     "connector's test mode (STRIPE_TEST_WEBHOOK_SECRET): the live secret never "
                                     "verifies a test-mode event")
            return {**test.read_webhook(raw, headers), "test_mode": True}
        if secret in ("", connector.options.get("webhook_secret")):
            return connector.read_webhook(raw, headers)
        try:
            return connector.read_webhook(raw, headers)
        except WebhookRefused as refused:
            try:
                event = test.read_webhook(raw, headers)
            except WebhookRefused:
                raise refused from None  # the live reader's reason is the one to log
        return {**event, "test_mode": True}

    return read


def _problem(status, code, title, detail):
    logger.warning("webhook refused (%s): %s", status, detail)
    return problem_response(status, code, title, detail)


def _not_an_event():
    return _problem(400, "invalid", "Not an event", "the body is not an event")


@csrf_exempt
def webhook_receive(request, connector):
    reader = _readers().get(connector)
    if reader is None:
        return _problem(404, "not_found", "Not found", "unknown connector")
    if request.method != "POST":
        refused = _problem(405, "method_not_allowed", "Method not allowed", f"{request.method} is not allowed here")
        refused["Allow"] = "POST"
        return refused
    try:
        raw = request.body
    except RequestDataTooBig:  # Django's HTML "Bad Request (400)" otherwise
        # 413, not 400: the size is the refusal, not the event (the code stays the contract's `invalid`).
        return _problem(413, "invalid", "Body too large",
                        f"the body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")
    try:
        event = reader(raw, request.headers)
        given_id, event_type, data = event["id"], str(event["type"]), event.get("data") or {}
    except WebhookRefused as exc:
        return _problem(400, "webhook_refused", "Webhook refused", str(exc))
    except (ValueError, KeyError, TypeError):
        return _not_an_event()
    if isinstance(given_id, bool) or not isinstance(given_id, str | int):
        # Only text or a whole number names an event: `null` would be stored as "None", one event, ever.
        return _not_an_event()
    event_id = str(given_id)
    effect_id = data.get("id") if isinstance(data, dict) else None
    if not event_id or len(event_id) > 255 or len(event_type) > 100 or len(str(effect_id or "")) > 255:
        return _not_an_event()  # would not fit its columns
    with transaction.atomic():
        try:
            # Only the claim's own conflict is a redelivery: an integrity error while settling must
            # fail the delivery (the provider sends it again), not be answered "duplicate" and lost.
            with transaction.atomic():
                WebhookClaim.objects.create(connector=connector, event_id=event_id)
        except IntegrityError:
            return JsonResponse({"duplicate": True})
        stored = WebhookEvent.objects.create(
            connector=connector, event_id=event_id, event_type=event_type, payload=event,
            operation_key=named_operation_key(data)[:255],
        )
        # A reader that had to mend what names the effect or its key says so: stored, settling nothing.
        unreadable = event.get("unreadable")
        outcome = f"stored, cannot be read: {unreadable}" if unreadable else _settle(
            connector, event_type, data, event_id, test_mode=event.get("test_mode"))
        stored.outcome = outcome[:255]  # an outcome names the operation key, itself up to 255 characters
        stored.save(update_fields=["outcome"])
    return JsonResponse({"received": True, "outcome": stored.outcome})


def _serves(connector, action):
    """Whether `connector`, whose reader verified the event, serves `action`: one connector's
    secret (the sandbox's has a development default) must never settle another's effects."""
    return _serving(action) == connector


def _serving(action):
    """The name of the connector that serves `action`, or None if none can now."""
    try:
        return connector_for_action(action).name
    except (NoConnector, NoTestMode, ImportError, TypeError, ValueError):
        return None


def _settle(connector, event_type, data, event_id, *, test_mode=False):
    if event_type not in SETTLING or not isinstance(data, dict):
        return "ignored"
    key = named_operation_key(data)
    if not key:
        return "nothing to settle"
    action = Action.objects.select_for_update().filter(operation_key=key).first()
    if action is not None and not _serves(connector, action):
        logger.warning("a %s event names %s, which another connector serves: not applied", connector, key)
        return f"not applied: {key} is not served by {connector}"
    if test_mode and action is not None and not is_replay_action(action):
        return f"a test-mode event: not applied to {key}, which is not a replay run's"
    about, made = SETTLING[event_type]
    if action is not None and about != action.action_type:
        logger.warning("a %s event names %s, a %s: not applied", event_type, key, action.action_type)
        return f"not applied: {key} is a {action.action_type}, not what a {event_type} is about"
    effect = str(data.get("id") or "")
    actor = f"system:webhook:{connector}"
    if action is not None and action.status == ActionStatus.SUCCEEDED and not made:
        if effect == action.external_ref:
            _tell_effect_failed(action, connector, effect, event_type=event_type, event_id=event_id, data=data,
                                at=timezone.now(), actor=actor)
            return f"{event_type} of {action.external_ref}, which {key} succeeded with: a person is told"
        # Providers deliver out of order: a failure of an earlier attempt may come after the
        # success. This stored event is its record; the success stands.
        logger.warning("%s %s arrived after %s succeeded: not applied", connector, event_type, key)
        return f"late {event_type} after success: recorded, not applied ({key})"
    if action is None:
        return "nothing to settle"
    if action.status not in OPEN:
        # Said with the status, as the stored outcome is the event's record: an action pending
        # (its call still out, whose answer settles it) is neither settled nor unknown here.
        still_out = ", its call still out" if action.status == ActionStatus.PENDING else ""
        return f"nothing to settle: {key} is {action.status}{still_out}"
    evidence = {"at": timezone.now().isoformat(), "webhook": event_type, "event_id": event_id, "found": True,
                "data": data}
    if made:
        # docs/design.md: above its limit a person reviews an unknown outcome even when the answer
        # is conclusive, as the executor's verification does.
        over_limit = hooks.policy().needs_person_after_verification(action)
        if over_limit:
            # The person deciding reads the action's evidence: the success, and the failure of that
            # very effect stored before it, which is told as when the action is settled.
            failed = _failure_stored(connector, action, effect)
            if action.status == ActionStatus.UNKNOWN:
                action.mark_needs_review(actor=actor, reason=over_limit, evidence={
                    **evidence, **({"failed": _named(failed)} if failed is not None else {})})
            if failed is None:
                return f"left to a person: {over_limit}"
            _tell_stored(action, connector, effect, failed, actor=actor)
            return f"left to a person: {over_limit}; {failed.event_type} of {effect} came first: a person is told"
        action.mark_succeeded(actor=actor, external_ref=effect or key, result=data, reason=f"{event_type} received",
                              evidence=evidence)
        # The move told a person of a failure of this effect stored before it (its reaction,
        # failure_told_when_succeeded): the outcome names the same event, asked the same way.
        failed = _failure_before_success(action)
        if failed is not None:
            return (f"settled {action.operation_key} as {action.status}; {failed.event_type} of {action.external_ref} "
                    "came first: a person is told")
        return f"settled {action.operation_key} as {action.status}"
    # A failure event names the key, not the attempt: a late one for an earlier attempt
    # must not override a later success (or start another call). It only sends the action
    # back to verification, whose answer decides; a success event settling it later finds
    # this one stored (_failure_stored).
    if action.status == ActionStatus.NEEDS_REVIEW:
        action.verify_again(actor=actor, reason=f"{event_type} received")
    return f"{event_type} noted; {action.operation_key} is verified at the provider"


def _tell_effect_failed(action, connector, effect, *, event_type, event_id, data, at, actor):
    """The provider failed `effect`, the very effect `action` succeeded with (Stripe fails a refund
    days after it succeeded when the card was closed) or that its success left to a person names, as
    the event received `at` says: the ledger's success stays the record of what was asked and
    answered, and a person is told (dlq: an incident, once while open; decision 60), as by `actor`:
    whoever made the change that brought the two together (the failure's webhook, the success's,
    or the move to succeeded: the worker, a verifier, a person)."""
    hooks.effect_failed(action, connector=connector, external_ref=effect, actor=actor,
                        evidence={"at": at.isoformat(), "webhook": event_type, "event_id": event_id, "data": data})


def _tell_stored(action, connector, effect, failed, *, actor):
    _tell_effect_failed(action, connector, effect, event_type=failed.event_type, event_id=failed.event_id,
                        data=failed.payload["data"], at=failed.received_at, actor=actor)


def _named(event):
    """A stored event as an action's evidence entry names it."""
    return {"webhook": event.event_type, "event_id": event.event_id, "received_at": event.received_at.isoformat()}


def failure_told_when_succeeded(action, previous, actor, reason):
    """After every move of an action: once it succeeds, a person is told if the provider failed the
    very effect it succeeded with before the move, as if the failure came after (decision 60). Every
    move to succeeded is one: a success event settling it, the worker's call or a verifier's look
    answered while the failure's event came (the action pending or unknown, which the event could
    not settle), a person marking it succeeded with that effect's reference. The telling is the
    move's `actor`'s in the audit trail: their move revealed the conflict (the failure's webhook
    only stored it). Only this reaction tells of a failure stored before the move; a success event's
    settle names the event in its outcome, asking `_failure_before_success` as this does. A failure
    committed after the move's UPDATE has the row waits for its lock, finds the action succeeded
    and tells a person itself (`_settle`)."""
    failed = _failure_before_success(action)
    if failed is not None:
        _tell_stored(action, failed.connector, action.external_ref, failed, actor=actor)


def _failure_before_success(action):
    """The stored event in which the provider failed the effect `action`, just moved to succeeded,
    names, or None. The move's UPDATE read back whether such a failure may be stored
    (models.FAILURE_STORED): only then is it looked for, in the move's transaction, under the
    action's lock, so no statement of its own on nearly every success."""
    if action.status != ActionStatus.SUCCEEDED or not action.failure_stored:
        return None
    connector = _serving(action)
    return None if connector is None else _failure_stored(connector, action, action.external_ref)


def _failure_stored(connector, action, effect):
    """The stored event, if any, in which `connector`'s provider failed `effect`, the effect `action`
    was settled with, or that a success left to a person names. Stripe retries a delivery for days: its
    `refund.created` (the refund succeeded as of when that event was made) may come after its
    `refund.failed`, which, while the outcome was open, only sent the action to be verified. A failure
    of another effect under the key (an earlier attempt's) is not this one's; a test-mode event never
    acts on a live action. Read under the action's lock: a failure settling meanwhile waits for it,
    then finds the action succeeded and tells a person itself."""
    failures = [event_type for event_type, about in EFFECT_FAILED.items() if about == action.action_type]
    events = WebhookEvent.objects.filter(connector=connector, operation_key=action.operation_key,
                                         event_type__in=failures, payload__data__id=effect)
    if not is_replay_action(action):
        events = events.exclude(payload__has_key="test_mode")  # only ever marked True (_with_test_mode)
    return events.order_by("received_at", "pk").first()
