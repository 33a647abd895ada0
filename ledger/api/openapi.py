"""The OpenAPI document of the agents' API, as exact as the validation at the edge.

Every schema here is derived from the serializers that validate (their fields, PARAMS,
WORKFLOWS, the currencies' minor units), so the document cannot drift from what the API
accepts; a rule that only the code knows would make a fuzzer reading the document find the
API stricter than it says.
"""

import copy

from django.conf import settings
from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import get_doc
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from ledger import currencies, money
from ledger.models import ActionType, StepStatus, TaskState
from ledger.retention import KEY_EXPIRES_HEADER
from ledger.validation import MAX_AMOUNT, StrictSerializer
from ledger.workflows import WORKFLOWS

from .serializers import PARAMS, PHONE, ActionRequestSerializer, TaskRequestSerializer, task_id_room

PROBLEM_JSON = "application/problem+json"

# An operation key or task id (docs/contract.md): 1-255 printable ASCII characters.
KEY_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x20-\\x7e]+$"}

KEY_HEADER = OpenApiParameter(
    "Idempotency-Key", KEY_SCHEMA, OpenApiParameter.HEADER, required=True,
    description="The operation key: 1-255 printable ASCII characters, the same on every retry.",
)
TASK_ID_HEADER = OpenApiParameter(
    "Idempotency-Key", {**KEY_SCHEMA, "maxLength": min(task_id_room(name) for name in WORKFLOWS)},
    OpenApiParameter.HEADER, required=True,
    description="The task id, the same on every retry: printable ASCII characters, fewer than an operation "
    "key's 255 as each step's key adds its name to it (per workflow; this is the least of them).",
)
WAIT = OpenApiParameter(
    "wait", {"type": "number", "minimum": 0, "maximum": 30}, OpenApiParameter.QUERY,
    description="Hold the answer up to this many seconds (at most 30) until the status settles.",
)
REPLAYED = OpenApiParameter(
    "Idempotent-Replayed", {"type": "string", "enum": ["true"]}, OpenApiParameter.HEADER, response=[200],
    required=True, description="The request was answered before: nothing was executed again.",
)
RETRY_AFTER = OpenApiParameter(
    "Retry-After", {"type": "string", "pattern": "^[0-9]+$"}, OpenApiParameter.HEADER, response=[429, 503],
    required=True, description="Seconds to wait before sending the request again.",
)

KEY_EXPIRES = OpenApiParameter(
    KEY_EXPIRES_HEADER, {"type": "string", "format": "date-time"}, OpenApiParameter.HEADER, response=[200, 201],
    required=True, description="When the key stops naming this action or task (RFC 3339, UTC): when it was "
    "recorded plus the key's lifetime. Until then the same request is replayed; after it, any request under the "
    "key is answered `410 operation_key_expired`.",
)


def intake_description(what):
    """An intake's description, with the key's lifetime (ledger.retention) that it publishes."""
    return (f"{what} The key names its request for {settings.OPERATION_KEY_LIFETIME_DAYS} days after it was "
            f"first recorded (`{KEY_EXPIRES_HEADER}` on each answer says until when): within that lifetime the "
            "same request is replayed; after it, any request under the key is answered `410 "
            "operation_key_expired` and nothing is executed.")


KEY_EXPIRED = ("`operation_key_expired`: the key's lifetime has ended (its action may have been archived); nothing "
               "is executed or answered under it any more.")


def path_key(name, description):
    """A key in the URL path, percent-encoded (`/` included)."""
    return OpenApiParameter(name, KEY_SCHEMA, OpenApiParameter.PATH, description=description)


class ErrorSerializer(serializers.Serializer):
    """Why an action or task failed."""

    code = serializers.CharField()
    message = serializers.CharField()
    retryable = serializers.BooleanField(required=False)
    done_by_hand = serializers.BooleanField(required=False, help_text="A person made the effect by hand (its "
                                            "dead letter resolved): failed for good, and no retry may make it again.")
    given_up = serializers.BooleanField(required=False, help_text="A person gave the action up (its dead letter "
                                        "discarded): nothing was done, and nobody will retry it.")
    retry_after = serializers.FloatField(required=False, help_text="The seconds a rate-limited provider asked to "
                                         "be left alone for.")


class ProblemSerializer(serializers.Serializer):
    """An RFC 9457 problem: every 4xx of the API, and its 503s (busy, database_unavailable)."""

    type = serializers.URLField()
    title = serializers.CharField()
    status = serializers.IntegerField(min_value=400, max_value=599)
    detail = serializers.CharField(allow_blank=True)
    code = serializers.CharField(help_text="Stable: see the contract for the values and their meaning.")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()), required=False,
        help_text="Validation errors: field (dotted when nested) -> messages.",
    )
    recorded_under = serializers.CharField(
        required=False, help_text="`idempotency_key_reused` for a decision recorded under another key: that key, "
                                  "whose action stands (this agent's: readable at /actions/{key}).")


class StepSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=StepStatus.choices)
    idempotency_key = serializers.CharField(required=False)
    result = serializers.JSONField(required=False)
    error = ErrorSerializer(required=False)


class CheckpointSerializer(serializers.Serializer):
    """A task's checkpoint record; `steps` in execution order."""

    task_id = serializers.CharField()
    workflow = serializers.ChoiceField(choices=sorted(WORKFLOWS))
    state = serializers.ChoiceField(choices=TaskState.choices)
    attempts = serializers.IntegerField(min_value=0)
    max_attempts = serializers.IntegerField(min_value=0)
    next_attempt_at = serializers.DateTimeField(allow_null=True, help_text="When a queued task is tried again.")
    last_error = ErrorSerializer(allow_null=True)
    steps = serializers.DictField(child=StepSerializer())
    updated_at = serializers.DateTimeField()
    url = serializers.CharField()


def problem(description):
    return OpenApiResponse(ProblemSerializer, description=description)


def links_to(operation_id, parameter):
    """OpenAPI links from an intake's answers to the read of what it recorded."""
    link = {f"read_{parameter}": {
        "operationId": operation_id, "parameters": {parameter: f"$response.body#/{parameter}"},
        "description": f"Read the record again by its {parameter}.",
    }}
    return {"201": link, "200": link}


COMMON_PROBLEMS = {
    (401, PROBLEM_JSON): problem("`unauthenticated`: no token, or an unknown or revoked one."),
    (406, PROBLEM_JSON): problem("`not_acceptable`: the Accept header admits no JSON."),
    (429, PROBLEM_JSON): problem("`throttled`: too many requests from this agent (see Retry-After)."),
    (503, PROBLEM_JSON): problem("`database_unavailable`: the ledger's database could not be reached; nothing was "
                                 "half-written, send the same request again (see Retry-After)."),
}


def intake_responses(resource):
    """What both intakes answer (docs/contract.md), each problem with its media type."""
    return {
        201: OpenApiResponse(resource, description="Recorded."),
        200: OpenApiResponse(resource, description="The same key and request again: the record as it stands now."),
        (400, PROBLEM_JSON): problem(
            "`idempotency_key_missing`, or `invalid` with `errors` (a bad body, key or params; a body over 64 KiB)."),
        **COMMON_PROBLEMS,
        (403, PROBLEM_JSON): problem("`forbidden`: this agent is not granted the action type or workflow."),
        (415, PROBLEM_JSON): problem("`unsupported_media_type`: the body is not sent as application/json."),
        (409, PROBLEM_JSON): problem("`booking_conflict` (the slot is taken), `message_already_sent` "
                                     "(another agent's message to this recipient, type and decision) or "
                                     "`refund_already_recorded` (another agent's refund of this order for this "
                                     "decision)."),
        (410, PROBLEM_JSON): problem(KEY_EXPIRED),
        (422, PROBLEM_JSON): problem("`idempotency_key_reused`: the key names a different request, or the "
                                     "decision's refund or message is recorded under another key with other "
                                     "params; `currency_not_covered`: the action type has limits, none in this "
                                     "currency, and this deployment refuses such requests "
                                     "(LIMITS_UNCOVERED_CURRENCY=refuse); nothing was recorded."),
        (503, PROBLEM_JSON): problem("`busy`: the database stayed deadlocked on the same target or customer; "
                                     "`database_unavailable`: it could not be reached. Nothing was half-written: "
                                     "send the same request again, with the same key (see Retry-After)."),
    }


def read_responses(resource, what):
    return {
        200: OpenApiResponse(resource, description=f"The {what}."),
        (400, PROBLEM_JSON): problem("`invalid`: `wait` is not a number of seconds from 0 to 30."),
        **COMMON_PROBLEMS,
        (404, PROBLEM_JSON): problem(f"`not_found`: no such {what}, or another agent's."),
        # gunicorn's own answer, before the request reaches the API; a reverse proxy in front
        # may answer it first, in its own words.
        (414, "text/html"): OpenApiResponse(
            {"type": "string"}, description="The query string makes the request line longer than the web "
            "server takes (gunicorn: 4094 bytes)."),
    }


class ApiSchema(AutoSchema):
    """drf-spectacular's schema plus OpenAPI links from a view's `openapi_links`
    ({status: {name: link}}), which drf-spectacular has no decorator for."""

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for status, links in getattr(self.view, "openapi_links", {}).items():
            if status in responses:
                responses[status]["links"] = links
        return responses


# --- Request bodies: one variant per action type and per workflow -------------------------------


def _variant(base, name, discriminator, value, payload_field, payload, **fields):
    """`base` whose discriminator takes only `value`, whose payload is `payload`, and with
    `fields` as the serializer's cross-field rules have them for this value."""
    return type(name, (base,), {
        **fields,
        "__doc__": f"{base.__name__.removesuffix('Serializer')} with {discriminator} {value!r}.",
        discriminator: _only(discriminator, value),
        payload_field: payload(),
        **({"task_id": AlwaysNull()} if "task_id" in base._declared_fields else {}),
    })


@extend_schema_field({"type": "string", "nullable": True, "minLength": 1, "maxLength": 0,
                      "description": "null or left out: only a workflow's steps add actions to a task."})
class AlwaysNull(serializers.CharField):
    """No string is allowed (the serializer refuses any), which JSON Schema 3.0 can only
    say as a string no length fits."""

    def __init__(self):
        super().__init__(required=False, allow_null=True)


def _only(discriminator, value):
    """A choice of one, told apart from the same word as another discriminator's value (an
    action type and a workflow are both called "refund")."""

    @extend_schema_field({"type": "string", "enum": [value], "x-spec-enum-id": f"{discriminator}:{value}"})
    class Only(serializers.ChoiceField):
        pass

    return Only(choices=[value])


def _camel(name):
    return "".join(part.capitalize() for part in name.split("_"))


# What ActionRequestSerializer.validate requires of one action type beyond its params.
_ACTION_FIELDS = {
    ActionType.CREATE_BOOKING: {"customer": serializers.CharField(max_length=255, help_text="Who the booking is for.")},
}

ACTION_REQUESTS = {
    str(action_type): _variant(ActionRequestSerializer, f"{_camel(action_type)}ActionRequest",
                               "action_type", str(action_type), "params", params, **_ACTION_FIELDS.get(action_type, {}))
    for action_type, params in PARAMS.items()
}
ACTION_REQUEST = PolymorphicProxySerializer(
    component_name="ActionRequest", serializers=ACTION_REQUESTS, resource_type_field_name="action_type",
)
TASK_REQUEST = PolymorphicProxySerializer(
    component_name="TaskRequest",
    serializers={
        name: _variant(TaskRequestSerializer, f"{_camel(name)}TaskRequest", "workflow", name, "input",
                       workflow.input_serializer)
        for name, workflow in WORKFLOWS.items()
    },
    resource_type_field_name="workflow",
)


# --- What the serializers' own fields cannot say ----------------------------------------------


def _amount_pattern(digits):
    """A positive decimal string below MAX_AMOUNT with at most `digits` significant decimals
    (trailing zeros are free: "500.00" JPY is 500 yen)."""
    whole = f"[1-9][0-9]{{0,{len(str(int(MAX_AMOUNT))) - 2}}}"
    if digits == 0:
        return f"^{whole}(\\.0+)?$"
    fraction = f"[0-9]{{0,{digits - 1}}}[1-9]0*"
    return f"^({whole}(\\.[0-9]{{1,{digits}}}0*)?|0\\.{fraction})$"


def _currencies_by_digits():
    """The currencies the API takes (ledger.validation.CurrencyField), by minor digits."""
    groups = {}
    for code in currencies.payable():
        groups.setdefault(money.minor_digits(code), []).append(code)
    return groups


CURRENCIES_BY_DIGITS = _currencies_by_digits()


class AmountFieldSchema(OpenApiSerializerFieldExtension):
    target_class = "ledger.validation.AmountField"

    def map_serializer_field(self, auto_schema, direction):
        return {"type": "string", "pattern": _amount_pattern(money.LEDGER_PLACES),
                "description": 'A decimal string, e.g. "25.00".'}


class CurrencyFieldSchema(OpenApiSerializerFieldExtension):
    target_class = "ledger.validation.CurrencyField"

    def map_serializer_field(self, auto_schema, direction):
        return {"type": "string", "enum": sorted(c for codes in CURRENCIES_BY_DIGITS.values() for c in codes),
                "description": "An ISO 4217 currency code."}


# DRF's CharField trims the text and then refuses it blank or with a NUL character. It trims what
# Python's str.strip() strips, spelt out here: a pattern's \s is ECMAScript's, another set (it leaves
# U+001C-U+001F and U+0085 out, and takes U+FEFF in).
STRIPPED = ("\\t\\n\\u000b\\u000c\\r\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f"
            "\\u205f\\u3000")
NOT_BLANK = {"minLength": 1, "pattern": f"^[^\\u0000]*[^{STRIPPED}\\u0000][^\\u0000]*$"}
NO_NUL = {"pattern": "^[^\\u0000]*$"}


class StrictSerializerSchema(OpenApiSerializerExtension):
    """A strict serializer refuses fields it does not know; its own docstring is about speed."""

    target_class = "ledger.validation.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["additionalProperties"] = False
        for name, field in self.target.fields.items():
            if type(field) is serializers.CharField and "$ref" not in schema["properties"][name]:
                schema["properties"][name].update(NO_NUL if field.allow_blank else NOT_BLANK)
        if get_doc(type(self.target)) == get_doc(StrictSerializer):
            schema.pop("description", None)
        return schema


class ActionSchema(OpenApiSerializerExtension):
    """The action resource: every field always present; what the model's fields cannot say."""

    target_class = "ledger.api.serializers.ActionSerializer"

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        error = auto_schema.resolve_serializer(ErrorSerializer, direction).ref
        schema["properties"].update(
            params={"type": "object", "additionalProperties": True},
            external_ref={"type": "string", "nullable": True, "description": "The provider's reference."},
            result={"nullable": True, "description": "What the provider answered, as the connector keeps it."},
            error={"allOf": [error], "nullable": True},
        )
        schema["required"] = sorted(schema["properties"])
        return schema


class PayableAmountSchema(OpenApiSerializerExtension):
    """A refund's amount may have no more decimals than its currency's minor units, a refund
    action's params and a refund task's input alike: one schema per number of minor digits. The
    currencies are a pattern, not an enum: an enum would become a component per group, all named
    after the same field."""

    target_class = "ledger.validation.PayableAmount"
    match_subclasses = True
    priority = 1  # before StrictSerializerSchema, which it builds on

    def map_serializer(self, auto_schema, direction):
        schema = StrictSerializerSchema(self.target).map_serializer(auto_schema, direction)
        groups = []
        for digits, codes in sorted(CURRENCIES_BY_DIGITS.items()):
            group = copy.deepcopy(schema)
            group["properties"]["currency"] = {"type": "string", "pattern": f"^({'|'.join(codes)})$",
                                               "description": f"A currency with {digits} minor digits."}
            group["properties"]["amount"]["pattern"] = _amount_pattern(digits)
            groups.append(group)
        return {"oneOf": groups}


class MessageRequestSchema(OpenApiSerializerExtension):
    """A message's recipient (`target`) is an e-mail address for the email channel and an
    E.164 phone number for the others: one schema per kind of recipient. The channels are
    patterns, not enums, for the reason PayableAmountSchema gives."""

    target_class = ACTION_REQUESTS[ActionType.SEND_MESSAGE]
    priority = 1  # before StrictSerializerSchema, which it builds on

    def map_serializer(self, auto_schema, direction):
        schema = StrictSerializerSchema(self.target).map_serializer(auto_schema, direction)
        params = schema["properties"]["params"]
        phones = [c for c in PARAMS[ActionType.SEND_MESSAGE]().fields["channel"].choices if c != "email"]
        recipients = [  # as ActionRequestSerializer._recipient tells them apart
            (["email"], {"type": "string", "format": "email", "maxLength": 255, "description": "An e-mail address."}),
            (phones, {"type": "string", "pattern": f"^{PHONE.pattern}$",
                      "description": "A phone number in E.164 form (+4930123456)."}),
        ]
        kinds = []
        for channels, target in recipients:
            kind = copy.deepcopy(schema)
            kind.pop("description", None)
            kind["properties"]["target"] = target
            kind["properties"]["params"] = {"allOf": [params, {"type": "object", "properties": {
                "channel": {"type": "string", "pattern": f"^({'|'.join(channels)})$"}}}]}
            kinds.append(kind)
        return {"oneOf": kinds, "description": schema.get("description", "")}
