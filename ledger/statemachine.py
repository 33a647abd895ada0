"""The one way a status changes, shared by every status field: actions, tasks and their steps,
bookings, review items, dead-letter entries, incidents, bulk redrives and their items."""

import copy

from django.db import models, transaction
from django.utils import timezone

from . import clock, hooks
from .audit import AuditEvent
from .compiled import Compiled, register_cache, update


class InvalidTransition(Exception):
    """The row is not in a status from which the requested change is allowed."""


class StaleClaim(Exception):
    """A worker's claim (fencing token) was superseded; its late write is refused."""


def check_move(table, current, to, row):
    """Every status field's one rule: `to` must be in its transition table's entry for `current`."""
    if to not in table[current]:
        raise InvalidTransition(f"{row}: {current} -> {to} is not allowed")


# How a move makes sure that nobody moved the row since it was read (a model's LOCKING):
LOCK = "lock"  # it reads the row FOR UPDATE first (unless the caller just did: `locked=True`)
# it writes with UPDATE ... WHERE status = the status its copy was checked against, and is
# refused if that no longer matches: for rows written inside another row's lock (a step in its
# task's, a booking in its action's), or by a job that may have stalled with a stale copy
CONDITIONAL = "conditional"


class Machine:
    """A model whose status field moves only along `TRANSITIONS`, by the one `_move`.

    Subclasses name their status field, their transition table, how a move locks
    (`LOCKING`), the fields an audit event shows, and may add a guard (`_refuse`). What
    other parts do when a row moves is registered with `ledger.hooks.on_move` and runs inside
    the move's transaction. The models' named transitions call `_move`; nothing else does.
    """

    STATUS_FIELD = "status"
    TRANSITIONS: dict = {}
    LOCKING = LOCK
    # A LOCK machine whose claimed rows only the claim's holder writes while its fence stands
    # (every other writer moves the fence: a claim takes a new one, and so does any move made
    # without a claim): a move that carries the claim writes its own copy with UPDATE ... WHERE
    # fence = <claim> AND status = <its status>, without reading the row FOR UPDATE first (a
    # round trip fewer a settle, decision 53).
    FENCED = False
    AUDITED = ("attempts",)

    def _refuse(self, to):
        """Return why this row may not move to `to` beyond the table, or ""."""
        return ""

    def _read_back(self, to):
        """What the statement that moves this row to `to` reads back with it, as attributes of
        the row the reactions get: {name: SQL over the row's table} (compiled.update)."""
        return {}

    def _snapshot(self, changes=()):
        snap = {self.STATUS_FIELD: getattr(self, self.STATUS_FIELD)}
        snap.update({f: getattr(self, f) for f in self.AUDITED if hasattr(self, f)})
        snap.update({f: getattr(self, f) for f in ("external_ref", "error", "last_error") if f in changes})
        return snap

    def _move(self, to, *, actor=None, verb="", reason="", claim=None, locked=False, **changes):
        """Lock (as LOCKING says), check the transition (and the caller's claim), write, audit
        as `verb` by `actor` (no actor: not audited, as a step's move is audited with its
        task's), react; refreshes self.

        `claim` is the fencing token a worker got with its lease: a write after a provider
        call passes it, so a worker whose lease was taken over cannot overwrite the newer
        outcome. A change's value may be a function of the row. `locked`: the caller has just
        read this very row FOR UPDATE in the current transaction.

        A move that does not read the row itself runs in the caller's transaction, without a
        savepoint (two round trips on every claim): a refusal raises before anything is
        written and leaves that transaction as it was; an error once it writes aborts it.
        """
        if self.FENCED and claim is None:
            # A move no claim made (a webhook's, a person's) ends every claim on the row: a worker
            # that claimed before it must not write, even once the row is back in the status it
            # claimed (unknown -> needs_review -> unknown: a verifier's look from before would land).
            changes.setdefault("fence", next_fence)
        fenced = self.FENCED and claim is not None and not locked
        if self.LOCKING == CONDITIONAL or locked or fenced:
            row = copy.copy(self) if self.LOCKING == CONDITIONAL or fenced else self
            return self._moved(row, to, actor, verb, reason, claim, changes, fenced=fenced)
        with transaction.atomic():
            return self._moved(_locked_row(type(self), self.pk), to, actor, verb, reason, claim, changes)

    def _moved(self, row, to, actor, verb, reason, claim, changes, fenced=False):
        current = getattr(row, self.STATUS_FIELD)
        if claim is not None and row.fence != claim:
            raise StaleClaim(f"{row}: claim {claim} superseded by {row.fence}")
        check_move(self.TRANSITIONS, current, to, row)
        refusal = row._refuse(to)
        if refusal:
            raise InvalidTransition(f"{row}: {refusal}")
        before = row._snapshot()
        setattr(row, self.STATUS_FIELD, to)
        stamped = hasattr(type(row), "updated_at")  # a booking and a bulk redrive's item keep no stamp
        if stamped:
            row.updated_at = timezone.now()
        for field, value in changes.items():
            setattr(row, field, value(row) if callable(value) else value)
        fields = [self.STATUS_FIELD, *(["updated_at"] if stamped else []), *changes]
        where = {self.STATUS_FIELD: current} if self.LOCKING == CONDITIONAL or fenced else {}
        if fenced:
            where["fence"] = claim
        with transaction.atomic(savepoint=False):
            # The audit event is written with the UPDATE, in its statement, only if it writes.
            event = None if actor is None else AuditEvent.objects.event(
                actor=actor, verb=verb, obj=row, before=before, after=row._snapshot(changes), reason=reason)
            written = update(row, fields, and_insert=event, read_back=row._read_back(to), **where)
            if written:
                hooks.moved(row, current, actor, reason)
        if not written:  # CONDITIONAL or FENCED: moved or claimed meanwhile, and nothing was written
            now = type(row).objects.filter(pk=row.pk).values(self.STATUS_FIELD, *(["fence"] if fenced else [])).first()
            if fenced and now and now["fence"] != claim:
                raise StaleClaim(f"{row}: claim {claim} superseded by {now['fence']}")
            raise InvalidTransition(f"{row}: {current} -> {to} refused, it is {now and now[self.STATUS_FIELD]} now")
        self.__dict__.update({k: v for k, v in row.__dict__.items() if k != "_state"})
        return self


def next_fence(row):
    """Ends every claim on the row: a late worker's fenced writes find nothing to change."""
    return row.fence + 1


_locking_reads = {}
register_cache("ledger.statemachine._locking_reads", holds="each model's compiled locked read",
               stale_when="never (the statement itself is cached with the others)", clear=_locking_reads.clear)


def _locked_row(model, pk):
    """The row, read FOR UPDATE (every LOCK move starts so; compiled once per model):
    SELECT ... FROM <table> WHERE id = %s FOR UPDATE"""
    read = _locking_reads.get(model)
    if read is None:
        read = _locking_reads.setdefault(model, Compiled(lambda pk: model.objects.select_for_update().filter(pk=pk), int,
                                                         name=f"ledger.statemachine: a {model.__name__} locked"))
    row = read.first(pk)
    if row is None:
        raise model.DoesNotExist(f"{model.__name__} {pk} does not exist")
    return row


class StateMachine(Machine, models.Model):
    """A machine whose row is stamped with the time of its last move (`updated_at`)."""

    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


class LeasedWork(StateMachine):
    """Work a worker claims: attempts, when the next may start, and the claim itself —
    who holds it until when, and a fencing token that grows with every claim."""

    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=100, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    fence = models.PositiveIntegerField(default=0)

    class Meta:
        abstract = True

    def lease_left(self):
        """Seconds until the claim lapses (0 without one)."""
        return (self.lease_expires_at - clock.now()).total_seconds() if self.lease_expires_at else 0
