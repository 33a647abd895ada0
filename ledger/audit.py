"""The one entry point for audit events, and the hash chain that makes tampering visible.

Each event stores a digest of its own content when it is written, in the transaction whose
change it describes, and from then on the database refuses to change or delete it (see
migrations 0002 and 0010). The sealer (`AuditEvent.objects.seal`, run by every sweeper
pass) then gives the events committed since its last pass their place in one chain:
`hash = sha256(prev_hash + content_hash + seq)`. Sealing there rather than at each commit
keeps the chain's one lock off the requests: writers never queue behind each other for it.
"""

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone

from .compiled import insert
from .locks import AUDIT_SEAL, take_turns
from .middleware import current_request_id


def actor_label(actor):
    """`agent:NAME`, `user:USERNAME` or `system:WHAT` — one vocabulary for every event."""
    label = getattr(actor, "audit_actor", None)  # an agent
    if label:
        return label
    if isinstance(actor, get_user_model()):
        agent = getattr(actor, "agent", None)  # the user of an agent (Agent.user's reverse side)
        return agent.audit_actor if agent else f"user:{actor.get_username()}"
    if isinstance(actor, str) and ":" in actor:
        return actor
    raise ValueError(f"not an actor: {actor!r}")


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

    def __str__(self):
        if self.broken_at is None:
            return f"chain intact through seq {self.through_seq} ({self.events} events checked)"
        return f"chain broken at seq {self.broken_at}: {self.why} (intact through seq {self.through_seq})"


class AuditEventManager(models.Manager):
    def record(self, *, actor, verb, obj, before=None, after=None, reason=""):
        """Append one event; must run inside the transaction whose change it describes."""
        if not transaction.get_connection().in_atomic_block:
            raise RuntimeError("audit events are written inside the transaction they describe")
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
        # Through JSON and back, so the digest is of exactly what the database will hold.
        event.before, event.after = json.loads(json.dumps([before, after], default=str))
        event.content_hash = content_hash(event.content_fields())
        return insert(event)

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
                # row cost more than half a millisecond of Python per event.
                with connection.cursor() as cursor:
                    cursor.executemany(f"UPDATE {self.model._meta.db_table} SET seq = %s, prev_hash = %s, hash = %s "
                                       "WHERE id = %s", seals)
            sealed += len(pending)

    def unsealed_for(self, seconds):
        """How many events have waited longer than `seconds` for the sealer (a stopped sweeper:
        until sealed they are append-only, but outside the chain `verify_chain` checks)."""
        return self.filter(seq__isnull=True, occurred_at__lt=timezone.now() - timedelta(seconds=seconds)).count()

    def history(self, obj):
        """Every event about `obj`, oldest first."""
        return self.filter(object_type=obj._meta.label_lower, object_id=str(obj.pk)).order_by("id")

    def verify_chain(self):
        """Return the seq of the first sealed event that was altered or does not follow, or None."""
        return self.chain_report().broken_at

    def chain_report(self, from_seq=1):
        """Walk the sealed chain from `from_seq` (trusting the link before it, which an earlier
        walk checked): the first broken link and why, or how far it holds."""
        prev_hash, expected = "", max(from_seq, 1)
        if expected > 1:
            prev_hash = self.filter(seq=expected - 1).values_list("hash", flat=True).first()
            if prev_hash is None:
                return ChainReport(expected - 1, f"event #{expected - 1} is missing", expected - 2, 0)
        events = 0
        for event in self.filter(seq__gte=expected).order_by("seq").iterator(chunk_size=2000):
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
                return ChainReport(event.seq, why, expected - 1, events)
            prev_hash, expected, events = event.hash, expected + 1, events + 1
        return ChainReport(None, "", expected - 1, events)


class AuditEvent(models.Model):
    """Append-only and hash-chained; write it only through `AuditEvent.objects.record`.

    `seq`, `prev_hash` and `hash` are empty until the sealer chains the event (see audit.py).
    """

    seq = models.BigIntegerField(null=True, blank=True)
    occurred_at = models.DateTimeField()
    actor = models.CharField(max_length=150)
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
        ]
        constraints = [
            # Sealed events only: a new event costs no entry here until the sealer chains it.
            models.UniqueConstraint(fields=["seq"], condition=Q(seq__isnull=False), name="audit_seq_unique"),
        ]

    def __str__(self):
        return f"{self.actor} {self.verb} {self.object_type}:{self.object_id}"

    def content_fields(self):
        return {
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


class ChainCheck(models.Model):
    """One verification of the audit chain (`audit_verify`, and the sweeper: the newest
    stretch every pass, the whole chain daily), so the audit page shows a real result."""

    class Scope(models.TextChoices):
        NEWEST = "newest"
        WHOLE = "whole"

    scope = models.CharField(max_length=10, choices=Scope.choices)
    from_seq = models.BigIntegerField()
    through_seq = models.BigIntegerField()
    broken_at = models.BigIntegerField(null=True, blank=True)
    why = models.CharField(max_length=255, blank=True, default="")
    events = models.BigIntegerField()
    checked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]

    def __str__(self):
        return str(ChainReport(self.broken_at, self.why, self.through_seq, self.events))


WHOLE_CHAIN_EVERY = timedelta(days=1)


def audit_verify(*, whole=False):
    """Verify the chain and record the result: from the end of the last intact check (the
    newest stretch), or all of it. A chain shorter than a check once found it is broken
    too: events at its end were removed."""
    last = ChainCheck.objects.filter(broken_at__isnull=True).order_by("-id").first()
    from_seq = 1 if whole or last is None else last.through_seq + 1
    top = AuditEvent.objects.aggregate(top=models.Max("seq"))["top"] or 0
    if last is not None and top < last.through_seq:
        report = ChainReport(top + 1, f"events #{top + 1} to #{last.through_seq} were removed", top, 0)
    else:
        report = AuditEvent.objects.chain_report(from_seq)
    if report.events or report.broken_at is not None or from_seq == 1:  # a pass with nothing new leaves no row
        ChainCheck.objects.create(scope=ChainCheck.Scope.WHOLE if from_seq == 1 else ChainCheck.Scope.NEWEST,
                                  from_seq=from_seq, through_seq=report.through_seq, broken_at=report.broken_at,
                                  why=report.why[:255], events=report.events)
    return report


def audit_verify_due():
    """The sweeper's step: the newest stretch on every pass, the whole chain once a day."""
    last_whole = ChainCheck.objects.filter(scope=ChainCheck.Scope.WHOLE).order_by("-id").first()
    whole = last_whole is None or last_whole.checked_at < timezone.now() - WHOLE_CHAIN_EVERY
    return audit_verify(whole=whole).events
