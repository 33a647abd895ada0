"""The one entry point for audit events, and the hash chain that makes tampering visible.

Each event stores a digest of its own content when it is written, in the transaction whose
change it describes, and from then on the database refuses to change or delete it (see
migrations 0002 and 0010). The sealer (`AuditEvent.objects.seal`, run by every sweeper
pass) then gives the events committed since its last pass their place in one chain:
`hash = sha256(prev_hash + content_hash + seq)`. Sealing there rather than at each commit
keeps the chain's one lock off the requests: writers never queue behind each other for it.

Checkpoints bound the daily work. Every AUDIT_CHECKPOINT_EVERY-th seq, the seal that reaches it
writes, in the same transaction, the chain's hash there, signed under this deployment's secret
key (`ChainCheckpoint`). A checkpoint whose signature holds and whose seq still carries its
hash vouches for every link before it, so the daily check walks from the last one, not from
seq 1; the whole chain is walked by a background job, a stretch per sweeper pass, its progress
in a row (`ChainWalk`) so that a crash costs one stretch, never the walk.

Every check knows where checkpoints must be. A sealed chain that reaches past the seq by which the
next checkpoint is due is broken: checkpoints were removed (`checkpoint_due`). Each checkpoint a walk
passes is checked as its event goes by: its signature, its hash, and (from migration 0046 on) its
link to the checkpoint before it, a second signature of the interval it was written under and of the
checkpoint the seal found before it, so that one removed between two is seen too.

An event's content hash is of its fields as `content_fields` gives them, under its `hash_version`:
version 2 (every event written since migration 0046) includes its object_label, which after an
archive is the only readable name of what it was about; version 1 (the events before) does not.
"""

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import groupby

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.db import IntegrityError, connection, models, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from .compiled import insert
from .locks import AUDIT_SEAL, take_turns
from .middleware import current_decision_link, current_request_id, current_step_up
from .partitions import AUDIT


ACTOR_MAX = 150  # AuditEvent.actor; ReviewItem.decided_by_label and DeadLetter.decided_by hold the same labels
ACTOR_HASH_CHARS = 16


def actor_label(actor):
    """`agent:NAME`, `user:USERNAME` or `system:WHAT` — one vocabulary for every event, and for
    every column that names who decided (a review item's `decided_by_label`, a dead letter's
    `decided_by`, ...). Every label fits ACTOR_MAX (`fitted`)."""
    return fitted(_label(actor))


def _label(actor):
    label = getattr(actor, "audit_actor", None)  # an agent
    if label:
        return label
    if isinstance(actor, get_user_model()):
        agent = getattr(actor, "agent", None)  # the user of an agent (Agent.user's reverse side)
        return agent.audit_actor if agent else f"user:{actor.get_username()}"
    if isinstance(actor, str) and ":" in actor:
        return actor
    raise ValueError(f"not an actor: {actor!r}")


def fitted(label):
    """`label` itself if it fits ACTOR_MAX characters (every label of a name that fits is what it
    always was); otherwise its start, `~` and the first ACTOR_HASH_CHARS hex digits of the SHA-256
    of the whole label, ACTOR_MAX in all. Django allows 150-character usernames, and `user:` plus
    one does not fit the columns: every audited move of that person failed, signing in included.
    Deterministic, so a person's events share one label; two long names that start alike still
    differ in the hash. Idempotent: a fitted label fits."""
    if len(label) <= ACTOR_MAX:
        return label
    digest = hashlib.sha256(label.encode()).hexdigest()[:ACTOR_HASH_CHARS]
    return f"{label[:ACTOR_MAX - ACTOR_HASH_CHARS - 1]}~{digest}"


def ledger_signer(purpose):
    """The one signer of what this ledger vouches for: an HMAC-SHA256 under SECRET_KEY, salted
    by `purpose` (the evidence record, the chain's checkpoints). Made at each use, so it signs
    with the key the settings hold now."""
    return signing.Signer(salt=f"ledger.{purpose}", algorithm="sha256")


def ledger_signed(purpose, value, signature):
    """Whether `signature` is this ledger's for `value`: made under SECRET_KEY or under one of
    SECRET_KEY_FALLBACKS, as Django's own `Signer.unsign` checks. What the ledger signed is kept
    for good (checkpoints are append-only, evidence records leave the building), so a rotated
    key must still vouch for it while it is a fallback; new signatures use SECRET_KEY alone."""
    signer = ledger_signer(purpose)
    return any(constant_time_compare(signature if isinstance(signature, str) else "", signer.signature(value, key))
               for key in [signer.key, *signer.fallback_keys])


def checkpoint_signature(seq, hash):
    return ledger_signer("audit.checkpoint").signature(f"{seq}:{hash}")


def checkpoint_signed(seq, hash, signature):
    return ledger_signed("audit.checkpoint", f"{seq}:{hash}", signature)


def checkpoint_link(seq, hash, every, prev_seq, prev_hash):
    """What a checkpoint's second signature (`ChainCheckpoint.link_signature`) is of: the interval
    it was written under and the checkpoint before it as the seal found it (0 and "": none)."""
    return f"{seq}:{hash}:{every}:{prev_seq}:{prev_hash}"


def checkpoint_link_signature(seq, hash, every, prev_seq, prev_hash):
    return ledger_signer("audit.checkpoint.link").signature(checkpoint_link(seq, hash, every, prev_seq, prev_hash))


def checkpoint_due(checkpoint, every):
    """The seq by which the seal writes the checkpoint after `checkpoint` (None: the chain's first)
    while it seals under an interval of `every`: the first multiple of `every` at least one interval
    past it, the interval it signed it was written under (`ChainCheckpoint.interval`), or `every`
    if it signed none. The seal writes a checkpoint at each multiple of the interval in force, so
    under one interval that is the next multiple. Changed after it, the seqs sealed before the
    change held no multiple of its own interval past it, and the first multiple of the new one
    after the change is at most this: a changed setting is never read as checkpoints missing
    (unless it changed twice between two checkpoints, or after one signed no interval)."""
    start = every if checkpoint is None else checkpoint.seq + (checkpoint.interval() or every)
    return -(-start // every) * every


def jsonb_number(literal):
    """A JSON number with a fraction or an exponent (as Python writes a float) as PostgreSQL's jsonb
    gives it back: a numeric, which keeps the digits but not the text. It has no negative zero, and
    prints no exponent, so `-0.0` comes back `0.0` and `1e+16` (`1.5e+300`) as an integer of 17 (301)
    digits, where the content hash of the text Python wrote would no longer be the event's. `1e-07`
    comes back `0.0000001`, the same float. SQLite keeps the text, so holds this form as it is given."""
    number = Decimal(literal)
    if number.as_tuple().exponent >= 0:
        return int(number)
    return float(number) or 0.0


# The content hash's versions (`AuditEvent.hash_version`): 1 is of CONTENT_FIELDS, 2 of them and the
# event's object_label. The events written before migration 0046 have 1 (the column's default in the
# database, so an event the code before writes during the upgrade has it too); `record` writes 2.
CONTENT_FIELDS = ("occurred_at", "actor", "verb", "object_type", "object_id", "before", "after", "reason", "request_id")
CONTENT_VERSION = 2
LABEL_HASHED = 2  # the first version whose content hash covers the object_label


def content_hashes(fields):
    """The content hash under each version of an event given as a dict of its fields (as an evidence
    record carries it, object_label included). Its fields are what its content hash was computed
    from if that is one of them: either may be, since the chain vouches for the content hash, and
    no change of the fields makes the other version's hash equal to it (that would take a SHA-256
    preimage). A version 2 event's label changed in a record is then seen; a version 1 event's, as
    before, is not."""
    fields_1 = {name: fields.get(name) for name in CONTENT_FIELDS}
    return {content_hash(fields_1), content_hash({**fields_1, "object_label": fields.get("object_label")})}


def content_hash(fields):
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def chain_hash(prev_hash, content, seq):
    return hashlib.sha256(f"{prev_hash}{content}{seq}".encode()).hexdigest()


@dataclass(frozen=True)
class ChainReport:
    broken_at: int | None  # the seq of the first broken link
    why: str
    through_seq: int  # the last seq that holds
    events: int  # how many were checked
    last_hash: str = ""  # the hash at through_seq, where a walk resumes

    def __str__(self):
        if self.broken_at is None:
            return f"chain intact through seq {self.through_seq} ({self.events} events checked)"
        return f"chain broken at seq {self.broken_at}: {self.why} (intact through seq {self.through_seq})"


class AuditEventManager(models.Manager):
    def record(self, *, actor, verb, obj, before=None, after=None, reason=""):
        """Append one event; must run inside the transaction whose change it describes. A decision
        taken after a step-up records the factor given in `after["step_up"]`, one taken through an
        e-mail's decision link the link in `after["decision_link"]`."""
        return insert(self.event(actor=actor, verb=verb, obj=obj, before=before, after=after, reason=reason))

    def event(self, *, actor, verb, obj, before=None, after=None, reason=""):
        """The event `record` appends, not yet written: a move writes it in the statement of its
        UPDATE (ledger.statemachine, compiled.update's `and_insert`)."""
        if not transaction.get_connection().in_atomic_block:
            raise RuntimeError("audit events are written inside the transaction they describe")
        how = {name: given for name, given in (("step_up", current_step_up.get()),
                                               ("decision_link", current_decision_link.get())) if given is not None}
        if how and (after is None or isinstance(after, dict)):
            after = {**(after or {}), **how}
        event = self.model(
            occurred_at=timezone.now(),
            actor=actor_label(actor),
            verb=verb,
            object_type=obj._meta.label_lower,
            object_id=str(obj.pk),
            object_label=str(obj)[:255],
            before=before,
            after=after,
            reason=reason or "",
            request_id=current_request_id.get(),
        )
        # Through JSON and back, its numbers as jsonb gives them back, so the digest is of exactly what
        # the database will hold.
        event.before, event.after = json.loads(json.dumps([before, after], default=str), parse_float=jsonb_number)
        event.content_hash = content_hash(event.content_fields())
        return event

    def seal(self, batch=1000):
        """Chain the events committed since the last seal, oldest id first; return how many.

        Safe to run in several processes at once: they take turns on one lock (SQLite
        serialises writers anyway). An event whose transaction commits after a pass, even
        with a lower id, is chained by the next one: the chain is in the order of sealing.
        """
        sealed = 0
        while True:
            with transaction.atomic():
                take_turns(AUDIT_SEAL)
                pending = list(self.filter(seq__isnull=True).order_by("id").only("content_hash")[:batch])
                if not pending:
                    return sealed
                seq, prev_hash = self.filter(seq__isnull=False).order_by("-seq").values_list("seq", "hash").first() \
                    or (0, "")
                seals = []
                for event in pending:
                    seq += 1
                    seals.append((seq, prev_hash, chain_hash(prev_hash, event.content_hash, seq), event.pk))
                    prev_hash = seals[-1][2]
                # One statement, many rows (psycopg pipelines them): bulk_update's CASE per
                # row cost more than half a millisecond of Python per event. Each run of rows
                # goes to the partition that holds them (ledger.partitions), in seq order: through
                # the parent, PostgreSQL planned every row's update over every partition, and a
                # seal took twice as long (decision 52).
                table = AUDIT.table_of()
                with connection.cursor() as cursor:
                    for name, rows in groupby(seals, key=lambda row: table(row[-1])):
                        cursor.executemany(f"UPDATE {name} SET seq = %s, prev_hash = %s, hash = %s WHERE id = %s",
                                           list(rows))
                every = settings.AUDIT_CHECKPOINT_EVERY
                reached = [(seq, hash) for seq, _, hash, _ in seals if seq % every == 0]
                if reached:
                    # Each linked to the one before it, the newest there is (the seal's turn: no other
                    # seal writes one meanwhile). One look per batch that reaches a boundary.
                    before = ChainCheckpoint.objects.order_by("-seq").values_list("seq", "hash").first() or (0, "")
                    checkpoints = []
                    for seq, hash in reached:
                        checkpoints.append(ChainCheckpoint.signed(seq, hash, every, *before))
                        before = (seq, hash)
                    ChainCheckpoint.objects.bulk_create(checkpoints)
            sealed += len(pending)

    def unsealed_for(self, seconds):
        """How many events have waited longer than `seconds` for the sealer (a stopped sweeper:
        until sealed they are append-only, but outside the chain `verify_chain` checks)."""
        return self.filter(seq__isnull=True, occurred_at__lt=timezone.now() - timedelta(seconds=seconds)).count()

    def history(self, obj):
        """Every event about `obj`, oldest first."""
        return self.filter(object_type=obj._meta.label_lower, object_id=str(obj.pk)).order_by("id")

    def verify_chain(self):
        """Return the seq of the first sealed event that was altered or does not follow, or None:
        from seq 1, or from the checkpoint an archive left (`report_from`)."""
        return self.report_from(1).broken_at

    def report_from(self, from_seq):
        """The chain from `from_seq` to its end (`chain_report`), or from the checkpoint an archive
        left where the archive took the events before it (`chain_start`): that checkpoint is checked
        first, and vouches for the links before it. Checked again from the newer start if an
        archive run moves it on meanwhile (`from_chain_start`)."""
        def report(origin):
            if origin is None or from_seq > origin.seq:
                return self.chain_report(from_seq)
            if why := origin.problem():
                return ChainReport(origin.seq, why, origin.seq - 1, 0)
            return self.chain_report(origin.seq + 1)

        return from_chain_start(report)[1]

    def chain_report(self, from_seq=1, through=None, *, at_end=None):
        """Walk the sealed chain from `from_seq` (trusting the link before it, which an earlier
        walk checked) to its end or to `through`: the first broken link and why, or how far it
        holds. Each checkpoint it passes is checked as its event goes by (`ChainCheckpoint.fault`),
        and at the chain's end (`at_end`: by default when walking to the end) a chain that reaches
        the seq by which the next checkpoint is due is broken: checkpoints were removed."""
        at_end = through is None if at_end is None else at_end
        prev_hash, expected = "", max(from_seq, 1)
        if expected > 1:
            prev_hash = self.filter(seq=expected - 1).values_list("hash", flat=True).first()
            if prev_hash is None:
                return ChainReport(expected - 1, f"event #{expected - 1} is missing", expected - 2, 0)
        # The end, read before the checkpoints: each is committed with the seal that reached it, so
        # every one up to the end is read, and none a seal adds meanwhile is expected.
        end = through if through is not None else self.aggregate(top=models.Max("seq"))["top"] or 0
        passed = ChainCheckpoint.objects.filter(seq__lt=expected).order_by("-seq").first()
        if passed is not None and not checkpoint_signed(passed.seq, passed.hash, passed.signature):
            return ChainReport(passed.seq, f"the checkpoint at seq {passed.seq} is not signed by this ledger",
                               passed.seq - 1, 0)
        ahead = iter(ChainCheckpoint.objects.filter(seq__range=(expected, end)).order_by("seq"))
        checkpoint = next(ahead, None)
        events = 0
        for event in self.filter(seq__range=(expected, end)).order_by("seq").iterator(chunk_size=2000):
            why = ""
            if event.seq != expected:
                why = f"events #{expected} to #{event.seq - 1} are missing"
            elif event.prev_hash != prev_hash:
                why = "it does not follow the event before it"
            elif event.content_hash != content_hash(event.content_fields()):
                why = "its content was altered after it was written"
            elif event.hash != chain_hash(prev_hash, event.content_hash, event.seq):
                why = "its hash is not the chain's"
            if why:
                return ChainReport(event.seq, why, expected - 1, events, prev_hash)
            if checkpoint is not None and checkpoint.seq == event.seq:
                if fault := checkpoint.fault(event=event, previous=passed):
                    return ChainReport(fault[0], fault[1], min(fault[0], event.seq) - 1, events, "")
                passed, checkpoint = checkpoint, next(ahead, None)
            prev_hash, expected, events = event.hash, expected + 1, events + 1
        if expected <= end:
            return ChainReport(expected, f"events #{expected} to #{end} are missing", expected - 1, events,
                               prev_hash)
        every = settings.AUDIT_CHECKPOINT_EVERY
        if at_end and expected - 1 >= (due := checkpoint_due(passed, every)):
            after = f"after seq {passed.seq}" if passed else "at all"
            return ChainReport(due, f"checkpoints are missing: the chain reaches seq {expected - 1}, and none is "
                                    f"signed {after}, though one is due by seq {due}", due - 1, events, "")
        return ChainReport(None, "", expected - 1, events, prev_hash)


class AuditEvent(models.Model):
    """Append-only and hash-chained; write it only through `AuditEvent.objects.record`.

    `seq`, `prev_hash` and `hash` are empty until the sealer chains the event (see audit.py).
    """

    seq = models.BigIntegerField(null=True, blank=True)
    occurred_at = models.DateTimeField()
    actor = models.CharField(max_length=ACTOR_MAX)
    verb = models.CharField(max_length=50)
    object_type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=255)
    object_label = models.CharField(max_length=255, blank=True, default="")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    request_id = models.CharField(max_length=64, blank=True, default="")
    content_hash = models.CharField(max_length=64)
    prev_hash = models.CharField(max_length=64, blank=True, default="")
    hash = models.CharField(max_length=64, blank=True, default="")
    # Which fields its content hash is of (`content_fields`): 2 for every event written now, 1 in the
    # database (the events before migration 0046, and those the code before writes during the upgrade).
    hash_version = models.SmallIntegerField(default=CONTENT_VERSION, db_default=1)

    objects = AuditEventManager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["object_type", "object_id", "id"], name="audit_object_idx"),
            models.Index(fields=["actor", "-id"], name="audit_actor_idx"),
            models.Index(fields=["verb", "-id"], name="audit_verb_idx"),
            models.Index(fields=["-occurred_at"], name="audit_time_idx"),
            # What the sealer looks for: a handful of rows, however long the trail.
            models.Index(fields=["id"], condition=Q(seq__isnull=True), name="audit_unsealed_idx"),
            # Sealed events only: a new event costs no entry here until the sealer chains it. Not
            # unique: the table is partitioned by id (ledger.partitions), and the seal's rule
            # refuses a seq already held (ledger.dbrules.AUDIT_APPEND_ONLY).
            models.Index(fields=["seq"], condition=Q(seq__isnull=False), name="audit_seq_idx"),
        ]

    def __str__(self):
        return f"{self.actor} {self.verb} {self.object_type}:{self.object_id}"

    def content_fields(self):
        """What its content hash is of: CONTENT_FIELDS, and from version 2 on its object_label."""
        fields = {
            "occurred_at": self.occurred_at.isoformat(),
            "actor": self.actor,
            "verb": self.verb,
            "object_type": self.object_type,
            "object_id": self.object_id,
            "before": self.before,
            "after": self.after,
            "reason": self.reason,
            "request_id": self.request_id,
        }
        if self.hash_version >= LABEL_HASHED:
            fields["object_label"] = self.object_label
        return fields


_LOOKED_UP = object()  # `fault`'s event and previous checkpoint, when its caller has none at hand


class ChainCheckpoint(models.Model):
    """The chain's hash at a seq, signed: written by the seal that reaches the seq (see the
    module's docstring), never changed."""

    seq = models.BigIntegerField(unique=True)
    hash = models.CharField(max_length=64)
    signature = models.CharField(max_length=100)  # of `seq:hash` alone, as evidence records carry it
    written_at = models.DateTimeField(default=timezone.now)
    # Its link to the checkpoint before it (from migration 0046 on): the interval it was written under
    # and the checkpoint the seal found before it (0 and "": none), under a second signature. Null for
    # the checkpoints written before, which verify as they always did.
    every = models.BigIntegerField(null=True, blank=True)
    prev_seq = models.BigIntegerField(null=True, blank=True)
    prev_hash = models.CharField(max_length=64, null=True, blank=True)
    link_signature = models.CharField(max_length=100, null=True, blank=True)

    class Meta:
        ordering = ["-seq"]

    def __str__(self):
        return f"checkpoint at seq {self.seq}"

    @classmethod
    def signed(cls, seq, hash, every, prev_seq, prev_hash):
        """The checkpoint the seal writes at `seq`, after the one at `prev_seq` (0: none)."""
        return cls(seq=seq, hash=hash, signature=checkpoint_signature(seq, hash), every=every, prev_seq=prev_seq,
                   prev_hash=prev_hash,
                   link_signature=checkpoint_link_signature(seq, hash, every, prev_seq, prev_hash))

    def link_signed(self):
        return bool(self.link_signature) and ledger_signed(
            "audit.checkpoint.link", checkpoint_link(self.seq, self.hash, self.every, self.prev_seq, self.prev_hash),
            self.link_signature)

    def interval(self):
        """The interval it was written under, if it signed one (None: written before they were)."""
        return self.every if self.link_signed() else None

    def previous(self):
        return ChainCheckpoint.objects.filter(seq__lt=self.seq).order_by("-seq").first()

    def problem(self):
        """Why this checkpoint cannot vouch for the chain before it ("" if it can): see `fault`."""
        fault = self.fault()
        return fault[1] if fault else ""

    def fault(self, *, event=_LOOKED_UP, previous=_LOOKED_UP):
        """(the seq where the chain breaks, why) if this checkpoint cannot vouch for the chain
        before it, else None: a signature that is not this ledger's (under SECRET_KEY or a fallback
        key: `ledger_signed`), a checkpoint before it removed or out of place (`link_fault`), or a
        chain whose hash at its seq is no longer its own. `event` is the chain's at its seq and
        `previous` the checkpoint before it, looked up unless given."""
        if not checkpoint_signed(self.seq, self.hash, self.signature):
            return self.seq, f"the checkpoint at seq {self.seq} is not signed by this ledger"
        if fault := self.link_fault(self.previous() if previous is _LOOKED_UP else previous):
            return fault
        if event is _LOOKED_UP:
            event = AuditEvent.objects.filter(seq=self.seq).first()
        if event is None:
            return self.seq, f"event #{self.seq}, which the checkpoint vouches for, is missing"
        if event.hash != self.hash:
            return self.seq, f"the chain's hash at seq {self.seq} is not the checkpoint's"
        # The walks after it start at the next event and check this one's hash alone: its
        # content is checked here, against the hash the checkpoint signed.
        if event.content_hash != content_hash(event.content_fields()) or event.hash != chain_hash(
                event.prev_hash, event.content_hash, event.seq):
            return self.seq, f"event #{self.seq}, which the checkpoint vouches for, was altered after it was sealed"
        return None

    def link_fault(self, previous):
        """Why this checkpoint does not follow `previous` (the checkpoint before it now, or None)
        as the seal linked it, as (seq, why), or None: its link not signed by this ledger, the
        checkpoint it follows missing or another, or one missing between them, where the interval
        each was written under says one must be (`checkpoint_due`). None for a checkpoint written
        before checkpoints were linked; after one of them, only the checkpoint it follows is checked
        (its interval is unknown)."""
        if not self.link_signature:
            return None
        if not self.link_signed():
            return self.seq, f"the checkpoint at seq {self.seq} is not linked by this ledger to the one before it"
        found = (previous.seq, previous.hash) if previous else (0, "")
        if (self.prev_seq, self.prev_hash) != found:
            if self.prev_seq > found[0]:
                return self.prev_seq, (f"the checkpoint at seq {self.prev_seq}, which the one at seq {self.seq} "
                                       "follows, is missing")
            return self.seq, f"the checkpoint at seq {self.seq} does not follow the one at seq {found[0]} before it"
        if previous is not None and previous.interval() and self.seq > (due := checkpoint_due(previous, self.every)):
            return due, (f"no checkpoint at seq {due}, where one must be between those at seq {previous.seq} and "
                         f"{self.seq}: checkpoints were removed")
        return None


class ChainCheck(models.Model):
    """One verification of the audit chain (`audit_verify`, and the sweeper: the newest
    stretch every pass, from the last checkpoint daily, the whole chain by `ChainWalk`), so the
    audit page shows a real result. No database rule holds them (decision 37): an archive run
    takes those nothing reads any more (`checks_read`; dlq.archive)."""

    class Scope(models.TextChoices):
        NEWEST = "newest"
        CHECKPOINT = "checkpoint"  # from the last checkpoint, which was checked first
        WHOLE = "whole"

    scope = models.CharField(max_length=10, choices=Scope.choices)
    from_seq = models.BigIntegerField()
    through_seq = models.BigIntegerField()
    # The chain's hash at through_seq, which the next check compares with the database's: events
    # removed from the end and their seqs sealed again leave a chain as long as before, and one that
    # links. Null for the checks recorded before it was kept.
    through_hash = models.CharField(max_length=64, null=True, blank=True)
    broken_at = models.BigIntegerField(null=True, blank=True)
    why = models.CharField(max_length=255, blank=True, default="")
    events = models.BigIntegerField()
    checked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # Where each sweeper pass's newest check starts (furthest_intact_check): the first entry
            # read from its end, however many checks are kept. Intact ones only: a broken check is
            # never its answer.
            models.Index(fields=["through_seq", "id"], condition=Q(broken_at__isnull=True),
                         name="chaincheck_intact_idx"),
        ]

    def __str__(self):
        return str(ChainReport(self.broken_at, self.why, self.through_seq, self.events))


WALK_RUNNING = datetime(2000, 1, 1, tzinfo=UTC)  # what an unfinished walk's row indexes as its end


class ChainWalk(models.Model):
    """A whole-chain check in progress or done: walked a stretch at a time (`audit_walk`), up
    to the chain's end when it started; `seq_reached` and `hash_reached` are where the next
    stretch resumes. Done, it writes its `ChainCheck`."""

    target_seq = models.BigIntegerField()
    seq_reached = models.BigIntegerField(default=0)
    hash_reached = models.CharField(max_length=64, blank=True, default="")
    events = models.BigIntegerField(default=0)
    broken_at = models.BigIntegerField(null=True, blank=True)
    why = models.CharField(max_length=255, blank=True, default="")
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            # One walk in progress at a time (two sweepers, or `audit_verify --whole` beside one,
            # would otherwise each start one and walk the whole chain twice): every unfinished
            # row indexes the same value.
            models.UniqueConstraint(models.functions.Coalesce("finished_at", models.Value(WALK_RUNNING)),
                                    condition=Q(finished_at__isnull=True), name="chain_walk_one_running"),
        ]

    def __str__(self):
        return f"whole-chain check {self.outcome}: through seq {self.seq_reached} of {self.target_seq}"

    @property
    def outcome(self):
        if self.finished_at is None:
            return "running"
        return "intact" if self.broken_at is None else "broken"

    @property
    def percent(self):
        return 100 if not self.target_seq else int(100 * self.seq_reached / self.target_seq)


WHOLE_CHAIN_EVERY = timedelta(days=1)


def chain_start():
    """The checkpoint the chain starts from once an archive removed the events before it
    (ledger.retention.Archive), or None: it starts at seq 1. Only an archive this ledger signed
    counts: from one written behind its back, the walk starts earlier and finds the events it
    let go missing."""
    for checkpoint in ChainCheckpoint.objects.filter(archive__isnull=False).select_related("archive").order_by("-seq"):
        if checkpoint.archive.vouched():
            return checkpoint
    return None


def from_chain_start(check):
    """(origin, report): `check(origin)`'s report from the chain's start (`chain_start`), and again
    from a newer start while an archive run moved it on as `check` read. Such a run commits between
    a check's reads and takes the events from the old start to its checkpoint, into its file: the
    check finds them missing, or the hash it had passed gone, where nothing was broken. A broken
    report stands once the start is the one it was read from; until then the check starts again
    from the newer one, as a check begun after the run would."""
    origin = chain_start()
    while True:
        report = check(origin)
        if report.broken_at is None or (newer := chain_start()) == origin:
            return origin, report
        origin = newer


def changed_since(check, top):
    """Why the chain no longer ends as `check` (an intact one) found it at its through_seq, with
    `top` the chain's last seq now; None if it does. Shorter: events at its end were removed.
    Another hash there, or no event: they were removed and the sealer gave their seqs to new
    events, which link to what was left (an event an archive run took is not missing)."""
    if top < check.through_seq:
        return ChainReport(top + 1, f"events #{top + 1} to #{check.through_seq} were removed", top, 0)
    if not check.through_hash:  # none kept (an older check), or the empty chain's
        return None
    held = AuditEvent.objects.filter(seq=check.through_seq).values_list("hash", flat=True).first()
    if held == check.through_hash:
        return None
    if held is None:
        origin = chain_start()
        if origin is not None and check.through_seq < origin.seq:
            return None
        why = f"event #{check.through_seq}, where a check ended, is missing"
    else:
        why = "its hash changed after a check passed it"
    return ChainReport(check.through_seq, why, check.through_seq - 1, 0)


def furthest_intact_check():
    """The intact check that reached furthest, where the next newest check starts and whose hash
    it compares first (`changed_since`): a whole-chain walk ends after newer checks did, at the
    chain's end when it started."""
    return ChainCheck.objects.filter(broken_at__isnull=True).order_by("-through_seq", "-id").first()


def last_daily_check():
    """The newest check from the last checkpoint or of the whole chain: the next daily one is due a
    day after it (`audit_verify_due`)."""
    return ChainCheck.objects.exclude(scope=ChainCheck.Scope.NEWEST).order_by("-id").first()


def checks_read():
    """The ids of the checks something reads, which no archive run takes (dlq.archive): the newest
    (the audit page, an evidence record's `last_chain_check`), `last_daily_check` and
    `furthest_intact_check`."""
    read = (ChainCheck.objects.order_by("-id").first(), last_daily_check(), furthest_intact_check())
    return {check.pk for check in read if check is not None}


def audit_verify(*, since_checkpoint=False):
    """Verify the chain and record the result: from the end of the last intact check (the
    newest stretch), or from the last checkpoint (`since_checkpoint`, or when nothing was
    checked yet; its signature and hash first), from the first event while there is none. A
    chain that no longer ends as a check once found it is broken too (`changed_since`).
    The whole chain is walked by `audit_walk`, in stretches."""
    last = furthest_intact_check()
    daily = since_checkpoint or last is None
    checkpoint = ChainCheckpoint.objects.first() if daily else None
    if checkpoint is not None:
        from_seq, scope = checkpoint.seq + 1, ChainCheck.Scope.CHECKPOINT
    elif daily:
        from_seq, scope = 1, ChainCheck.Scope.WHOLE
    else:
        from_seq, scope = last.through_seq + 1, ChainCheck.Scope.NEWEST
    top = AuditEvent.objects.aggregate(top=models.Max("seq"))["top"] or 0
    if checkpoint is not None and (why := checkpoint.problem()):
        report = ChainReport(checkpoint.seq, why, 0, 0)  # it vouches for nothing: nothing is known to hold
    elif last is not None and (changed := changed_since(last, top)):
        report = changed
    else:
        report = AuditEvent.objects.chain_report(from_seq)
    if report.events or report.broken_at is not None or scope != ChainCheck.Scope.NEWEST:  # nothing new: no row
        ChainCheck.objects.create(scope=scope, from_seq=from_seq, through_seq=report.through_seq,
                                  through_hash=report.last_hash, broken_at=report.broken_at, why=report.why[:255],
                                  events=report.events)
    return report


def audit_verify_due():
    """The sweeper's step: the newest stretch on every pass, from the last checkpoint once a day."""
    last_daily = last_daily_check()
    daily = last_daily is None or last_daily.checked_at < timezone.now() - WHOLE_CHAIN_EVERY
    return audit_verify(since_checkpoint=daily).events


def audit_walk(batch=None, start=False):
    """The whole-chain check's next stretch (a sweeper step); how many events it checked.

    1. The walk in progress, or a new one up to the chain's end now if the last one finished
       WHOLE_CHAIN_EVERY ago (or at once with `start`).
    2. Its next `batch` (AUDIT_WALK_BATCH) events, from the seq it reached, after checking that
       the chain's hash there is still the one it passed; from the chain's start if that is
       further, read again if an archive run moves it on meanwhile (`from_chain_start`).
    3. Its progress stored only if no other run stored some meanwhile (a sweeper whose lease
       lapsed mid-stretch: the same stretch twice costs work, never a skipped one); at its
       target or at a broken link, the walk is done and its result is a `ChainCheck`.
    """
    walk = ChainWalk.objects.filter(finished_at__isnull=True).order_by("-id").first()
    if walk is None:
        last = ChainWalk.objects.order_by("-id").first()
        top = AuditEvent.objects.aggregate(top=models.Max("seq"))["top"] or 0
        if not top or not (start or last is None or last.finished_at < timezone.now() - WHOLE_CHAIN_EVERY):
            return 0
        try:
            with transaction.atomic():
                walk = ChainWalk.objects.create(target_seq=top)
        except IntegrityError:  # another sweeper (or the command) started one meanwhile: that one
            walk = ChainWalk.objects.get(finished_at__isnull=True)

    def stretch(origin):
        # A walk starts at the archive's checkpoint, and one that an archive overtook moves on to
        # it: the checkpoint's signature vouches for the links before it, which are in the archive's
        # file.
        reached, hash_reached = walk.seq_reached, walk.hash_reached
        if origin is not None and reached <= origin.seq:
            reached, hash_reached = origin.seq, origin.hash
        through = min(reached + (batch or settings.AUDIT_WALK_BATCH), walk.target_seq)
        if origin is not None and reached == origin.seq and (why := origin.problem()):
            return ChainReport(origin.seq, why, origin.seq - 1, 0)
        if reached and AuditEvent.objects.filter(seq=reached).values_list("hash", flat=True).first() != hash_reached:
            return ChainReport(reached, "its hash changed after the walk passed it", reached - 1, 0)
        return AuditEvent.objects.chain_report(reached + 1, through=through, at_end=through >= walk.target_seq)

    origin, report = from_chain_start(stretch)
    done = report.broken_at is not None or report.through_seq >= walk.target_seq
    with transaction.atomic():
        moved = ChainWalk.objects.filter(pk=walk.pk, seq_reached=walk.seq_reached, finished_at__isnull=True).update(
            seq_reached=report.through_seq, hash_reached=report.last_hash, events=walk.events + report.events,
            broken_at=report.broken_at, why=report.why[:255], finished_at=timezone.now() if done else None)
        if moved and done:
            ChainCheck.objects.create(scope=ChainCheck.Scope.WHOLE, from_seq=origin.seq + 1 if origin else 1,
                                      through_seq=report.through_seq, through_hash=report.last_hash,
                                      broken_at=report.broken_at, why=report.why[:255],
                                      events=walk.events + report.events)
    return report.events
