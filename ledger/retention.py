"""How long an operation key names its action, and the keys whose actions were archived.

A key names its action for OPERATION_KEY_LIFETIME_DAYS after the action was recorded (decision
42): within that lifetime the API replays it; after it a request under the key is answered
`410 operation_key_expired`, never executed. Its end is told by the database's clock (ledger.clock,
decision 57), not the host's: a host whose clock ran ahead would answer 410, or archive the action,
while the key still names it. `archive_expired` then moves the settled action out of the ledger
and leaves an `ArchivedKey` in its place (a finished task: an `ArchivedTask`), which
the database checks on every insert into the ledger (ledger.dbrules.ARCHIVED_KEY_REFUSED,
ARCHIVED_TASK_REFUSED): an archived key is never recorded again.
"""

from datetime import UTC, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from . import clock
from .audit import ledger_signed, ledger_signer

KEY_EXPIRES_HEADER = "Idempotency-Key-Expires"
# The message the database's rule raises (ledger.dbrules.ARCHIVED_KEY_REFUSED and its SQLite pair).
KEY_ARCHIVED = "operation_key_archived"


def key_lifetime():
    return timedelta(days=settings.OPERATION_KEY_LIFETIME_DAYS)


def key_expires_at(created_at):
    return created_at + key_lifetime()


def key_expired(created_at, now=None):
    return key_expires_at(created_at) <= (now or clock.now())


def rfc3339(moment):
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class KeyExpired(Exception):
    """A request under a key whose action (or task) was archived: `expires_at`, and `agent_id`,
    the agent whose key it was (to any other, the key stays another agent's: 422, decision 42)."""

    def __init__(self, key, expires_at, agent_id):
        super().__init__(key)
        self.key = key
        self.expires_at = expires_at
        self.agent_id = agent_id


def key_archived(key):
    return ArchivedKey.objects.filter(operation_key=key).exists()


def archived_key_expired(key):
    archived = ArchivedKey.objects.get(operation_key=key)
    return KeyExpired(key, archived.expires_at, archived.agent_id)


def archived_task_expired(task_id):
    archived = ArchivedTask.objects.get(task_id=task_id)
    return KeyExpired(task_id, archived.expires_at, archived.agent_id)


def refused_as_archived(exc):
    """Whether the database refused an insert because its key was archived: the rule's message
    starts with KEY_ARCHIVED. Not "contains": a unique violation quotes the value it refused,
    and a key or decision may hold those very words."""
    return str(exc).startswith(KEY_ARCHIVED)


class Archive(models.Model):
    """One run of `archive_expired` (dlq.archive): the file it wrote, its SHA-256, how many rows
    of each model it removed, and the checkpoint the audit chain starts from after it (null: it
    removed no audit events). The database lets audit events go only before the newest such
    checkpoint (ledger.dbrules.AUDIT_APPEND_ONLY), which vouches for every link before it.

    Append-only in the database (ledger.dbrules.ARCHIVE_APPEND_ONLY), and signed as it is
    written: the database's rule cannot check a signature, so a row inserted behind the ledger's
    back would let events go; the chain's checks start only from a checkpoint a signed archive
    names (`vouched`), and find those events missing."""

    file = models.CharField(max_length=500)
    sha256 = models.CharField(max_length=64)
    removed = models.JSONField(default=dict)
    checkpoint = models.OneToOneField("ledger.ChainCheckpoint", null=True, blank=True, on_delete=models.PROTECT,
                                      related_name="archive")
    archived_at = models.DateTimeField(default=timezone.now)
    # Null, not "": a column SQLite can add in place (a rebuild of the table fails while the
    # audit trail's delete rule names it). Every row has one (migration 0040 signed the older).
    signature = models.CharField(max_length=100, null=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self):
        return f"archive {self.file}"

    def save(self, *args, **kwargs):
        if self._state.adding:
            self.signature = archive_signature(self.file, self.sha256, self.checkpoint)
        super().save(*args, **kwargs)

    def vouched(self):
        """Whether this ledger wrote this row as it is."""
        return ledger_signed("archive", _archive_signed(self.file, self.sha256, self.checkpoint), self.signature)


def _archive_signed(file, sha256, checkpoint):
    """What an archive's signature binds: its file, the file's SHA-256 and its checkpoint."""
    return f"{file}:{sha256}:" + (f"{checkpoint.seq}:{checkpoint.hash}" if checkpoint else "-")


def archive_signature(file, sha256, checkpoint):
    return ledger_signer("archive").signature(_archive_signed(file, sha256, checkpoint))


class Archived(models.Model):
    """What an archive run leaves of a key it took (its action's or its task's): whose it was,
    when it was recorded (so when its lifetime ended), and the archive file (its SHA-256) that
    holds the row now. The database refuses a row under it again (ledger.dbrules)."""

    agent = models.ForeignKey("ledger.Agent", on_delete=models.PROTECT, related_name="+", db_index=False)
    created_at = models.DateTimeField()
    archived_at = models.DateTimeField(default=timezone.now)
    archive_sha256 = models.CharField(max_length=64)

    class Meta:
        abstract = True

    @property
    def expires_at(self):
        return key_expires_at(self.created_at)


class ArchivedKey(Archived):
    """An operation key whose settled action `archive_expired` moved out of the ledger."""

    operation_key = models.CharField(max_length=255, unique=True)

    def __str__(self):
        return self.operation_key


class ArchivedTask(Archived):
    """A task id whose finished task `archive_expired` moved out of the ledger, with its steps
    and its actions (whose keys are ArchivedKeys)."""

    task_id = models.CharField(max_length=255, unique=True)

    def __str__(self):
        return self.task_id
