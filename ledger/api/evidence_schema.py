"""The evidence record (ledger.evidence) as the API's document describes it.

The record is built as plain data (ledger/evidence.py); these serializers only describe it,
field for field. The sections that the apps add are described by their own serializers
(`EvidenceSection.schema`), given with the sections to `evidence_record_serializer`.
"""

from rest_framework import serializers

from ledger.models import ActionStatus, ActionType, StepStatus, TaskState

from .openapi import ErrorSerializer


class EvidenceRequestSerializer(serializers.Serializer):
    """What the agent asked, as the ledger recorded it before any call."""

    operation_key = serializers.CharField()
    action_type = serializers.ChoiceField(choices=ActionType.choices)
    target = serializers.CharField()
    customer = serializers.CharField(allow_blank=True)
    params = serializers.DictField()
    fingerprint = serializers.CharField(help_text="sha256 of the canonical action type, target and params.")
    decision_id = serializers.CharField(allow_blank=True)
    task_id = serializers.CharField(allow_null=True)
    requested_at = serializers.DateTimeField()
    supersedes = serializers.CharField(allow_null=True, help_text="The operation key this version replaces.")
    superseded_by = serializers.CharField(allow_null=True, help_text="The version a person edited it into.")


class EvidenceOutcomeSerializer(serializers.Serializer):
    """Where the action stands as the record is made."""

    status = serializers.ChoiceField(choices=ActionStatus.choices)
    attempts = serializers.IntegerField(min_value=0)
    external_ref = serializers.CharField(allow_null=True, help_text="The provider's reference.")
    approved_fingerprint = serializers.CharField(
        allow_null=True, help_text="The params' fingerprint a person's approval is bound to; the executor calls "
        "the provider only while the params have it.")
    result = serializers.JSONField(allow_null=True, help_text="What the provider answered.")
    error = ErrorSerializer(allow_null=True)
    updated_at = serializers.DateTimeField()


class EvidenceStepSerializer(serializers.Serializer):
    position = serializers.IntegerField(min_value=0)
    name = serializers.CharField()
    # Text: an enum here would collide with the checkpoint's step status, named by the same field.
    status = serializers.CharField(help_text="One of: " + ", ".join(StepStatus.values) + ".")
    idempotency_key = serializers.CharField(allow_blank=True)
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    updated_at = serializers.DateTimeField()


class EvidenceTaskSerializer(serializers.Serializer):
    """The task the action is a step of, every step row as it stands."""

    task_id = serializers.CharField()
    workflow = serializers.CharField()
    state = serializers.ChoiceField(choices=TaskState.choices)
    attempts = serializers.IntegerField(min_value=0)
    max_attempts = serializers.IntegerField(min_value=0)
    last_error = serializers.JSONField(allow_null=True)
    steps = EvidenceStepSerializer(many=True)


class EvidencePromotionSerializer(serializers.Serializer):
    """The promotion of the grant in force when the action was requested (its audit event)."""

    seq = serializers.IntegerField(allow_null=True)
    at = serializers.CharField()
    by = serializers.CharField()
    reason = serializers.CharField(allow_blank=True)
    live_until = serializers.CharField(allow_null=True)
    replay_run = serializers.IntegerField(allow_null=True, help_text="The replay run that let it be promoted.")


class EvidenceGrantSerializer(serializers.Serializer):
    capability = serializers.CharField()
    state_at_request = serializers.CharField(
        allow_null=True, help_text="`live` or `shadow` when the request was recorded; null if unrecorded.")
    promotion = EvidencePromotionSerializer(allow_null=True)
    state_now = serializers.CharField(allow_null=True, help_text="`live`, `shadow`, or null: no grant now.")


class EvidenceAgentSerializer(serializers.Serializer):
    name = serializers.CharField()
    owner = serializers.CharField(help_text="The person responsible for the agent.")
    grant = EvidenceGrantSerializer()


class EvidenceEntrySerializer(serializers.Serializer):
    """One entry the executor, the sweeper or a webhook added to the action's evidence."""

    kind = serializers.ChoiceField(choices=["call", "verification", "webhook", "lease_expired"])
    entry = serializers.JSONField()


class EvidenceWebhookSerializer(serializers.Serializer):
    connector = serializers.CharField()
    event_id = serializers.CharField()
    event_type = serializers.CharField()
    received_at = serializers.DateTimeField()
    outcome = serializers.CharField(allow_blank=True, help_text="What receiving it did.")
    payload = serializers.JSONField()


class EvidenceSectionsSerializer(serializers.Serializer):
    """What the apps built on the ledger add: one key per section."""

    described = ()  # the EvidenceSections, set by evidence_record_serializer

    def get_fields(self):
        return {section.name: section.schema() for section in self.described}


class EvidenceAuditEventSerializer(serializers.Serializer):
    """An audit event with the fields its content hash is of, exactly as hashed (but the values
    it names in `redacted`)."""

    id = serializers.IntegerField()
    seq = serializers.IntegerField(allow_null=True, help_text="Its place in the chain; null until sealed.")
    occurred_at = serializers.CharField()
    actor = serializers.CharField()
    verb = serializers.CharField()
    object_type = serializers.CharField()
    object_id = serializers.CharField()
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)
    reason = serializers.CharField(allow_blank=True)
    request_id = serializers.CharField(allow_blank=True)
    object_label = serializers.CharField(allow_blank=True)
    content_hash = serializers.CharField()
    prev_hash = serializers.CharField(allow_blank=True)
    hash = serializers.CharField(allow_blank=True)
    redacted = serializers.ListField(
        child=serializers.CharField(), required=False, help_text=(
            "Only on an event some of whose values are withheld from this copy (staff's e-mail addresses): their "
            "paths in it (\"after.first_tier\"), each shown as {\"withheld\": n}, how many addresses it held. Its "
            "content_hash, prev_hash and hash are the chain's: its links check from the file, its content only "
            "against the database (`evidence_verify`); a path not in its before or after, not ending in one of the "
            "record's withheld_keys, or not showing a count there fails the check."))


class EvidenceChainCheckSerializer(serializers.Serializer):
    checked_at = serializers.DateTimeField()
    scope = serializers.CharField()
    through_seq = serializers.IntegerField()
    broken_at = serializers.IntegerField(allow_null=True)
    why = serializers.CharField(allow_blank=True)


class EvidenceCheckpointSerializer(serializers.Serializer):
    """The chain's hash at a seq at or after every event cited, signed by this ledger."""

    seq = serializers.IntegerField()
    hash = serializers.CharField()
    signature = serializers.CharField(help_text="HMAC of `seq:hash` under this deployment's secret key.")
    written_at = serializers.DateTimeField()


class EvidenceArchiveFileSerializer(serializers.Serializer):
    file = serializers.CharField()
    sha256 = serializers.CharField()


class EvidenceArchivedSerializer(serializers.Serializer):
    """The action's events an archive run took out of the database may be in these files."""

    before_seq = serializers.IntegerField(
        help_text="The chain starts after this seq: the events before it were archived.")
    files = EvidenceArchiveFileSerializer(many=True, help_text="`archive_expired`'s files, as this ledger signed them.")


class EvidenceAuditSerializer(serializers.Serializer):
    events = EvidenceAuditEventSerializer(many=True)
    unsealed = serializers.IntegerField(min_value=0, help_text="Events not yet chained (the sweeper seals them).")
    checkpoint = EvidenceCheckpointSerializer(allow_null=True, help_text="Null: not yet checkpointed.")
    last_chain_check = EvidenceChainCheckSerializer(allow_null=True)
    archived = EvidenceArchivedSerializer(allow_null=True, help_text=(
        "Null: none of the action's events was archived. Else the action was recorded before the chain's start, "
        "and its events before it are not in `events`: they are in these files (`evidence_verify --archives`)."))


class EvidenceIntegritySerializer(serializers.Serializer):
    digest = serializers.CharField(help_text="sha256 of the record without `integrity`.")
    signature = serializers.CharField(help_text="HMAC of the digest under this deployment's secret key.")
    how_to_check = serializers.CharField()


class EvidenceRecordSerializer(serializers.Serializer):
    """Everything the ledger knows of one action, with the audit events that cover it."""

    format = serializers.CharField()
    generated_at = serializers.DateTimeField()
    request = EvidenceRequestSerializer()
    outcome = EvidenceOutcomeSerializer()
    agent = EvidenceAgentSerializer()
    task = EvidenceTaskSerializer(allow_null=True)
    provider_evidence = EvidenceEntrySerializer(many=True)
    webhooks = EvidenceWebhookSerializer(many=True)
    sections = EvidenceSectionsSerializer()
    withheld_keys = serializers.ListField(child=serializers.CharField(), help_text=(
        "The keys whose staff addresses this copy withholds (none in staff's): an event's `redacted` paths each lie "
        "in its before or after and end in one of them. Under the digest and the signature."))
    audit = EvidenceAuditSerializer()
    integrity = EvidenceIntegritySerializer()


def evidence_record_serializer(sections):
    """The record's serializer with `sections` (ledger.evidence.EvidenceSection) under
    "sections": the document names it EvidenceRecord whatever the sections are."""
    described = type(EvidenceSectionsSerializer.__name__, (EvidenceSectionsSerializer,), {
        "__doc__": EvidenceSectionsSerializer.__doc__, "__module__": __name__, "described": tuple(sections)})
    return type(EvidenceRecordSerializer.__name__, (EvidenceRecordSerializer,), {
        "__doc__": EvidenceRecordSerializer.__doc__, "__module__": __name__, "sections": described()})
