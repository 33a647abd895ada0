"""An action's evidence record: one export an auditor can take away and check.

The record holds what the agent asked (the request and its fingerprint), who asked and under
which grant, what the provider answered (the evidence the executor kept, the outcome), the
webhooks that named the action, its task's checkpoint, the sections that the apps built on the
ledger add (`EvidenceSection`, listed by console.evidence: review items and the limit that
applied, dead-letter entries and their alerts), and every audit event that covers any of it, each with its place in the hash
chain (ledger/audit.py), and the chain's checkpoint that vouches for them all.

Building it costs the same number of queries however long the action's history is: one per
kind of row, never one per row.

The record is checked twice (`manage.py evidence_verify`, `record_problems`):

1. from the file alone: each event's content hash is recomputed from its fields, each sealed
   event's hash from the hash before it, consecutive events must link, and the digest must
   be the record's. (Anyone can recompute a digest: it shows damage, not intent.)
2. against the database: the signature, an HMAC of the digest under this deployment's
   secret key (or one of its SECRET_KEY_FALLBACKS, after a rotation), proves that this
   ledger wrote the record as it is; every event's hashes must be the ones the chain holds;
   and the checkpoint named must be the database's, signed, and still the chain's hash at
   its seq. An event an archive run took out of the database since (dlq.archive) is checked
   in the archive's file instead, given the directory of the archives (`archives`): a file
   whose SHA-256 is the one the database keeps for it, whose events link, each one's content
   hash recomputed from its fields, from the event the checkpoint before it vouches for to the
   one its own checkpoint's event follows, holding the event with the same hashes.

There are two readers. Staff (the dashboard's page and file) get the record whole. The agent (the
API's read, and whoever holds its token) never gets a staff e-mail address: the values the sections
name as addresses (`EvidenceSection.withheld`: a limit's alert tiers) are shown as `withheld(value)`,
how many there were, in the sections' data and in the detail of the audit events. Such an event keeps
its content hash and place in the chain as stored, so its links still check, and names the values it
withheld (`redacted`); its content hash cannot be recomputed from the file, only checked against the
database's row (or the archive's), with those values put back (decision 62). The record names the keys
it withholds (`withheld_keys`, under its digest and signature; none in staff's), and from the file alone
`redacted` holds only at those keys in an event's `before` or `after`, each showing a count: put on an
event anywhere else, it fails the check instead of sparing the event's content hash it.
"""

import functools
import hashlib
import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from django.db.models import Q
from django.utils import timezone

from .audit import chain_hash, chain_start, content_hash, content_hashes, ledger_signed, ledger_signer
from .connectors.test_mode import version_now
from .models import Action, ActionStatus, AuditEvent, Capability, ChainCheck, ChainCheckpoint, Grant, WebhookEvent
from .retention import Archive

FORMAT = "surety-evidence/1"
GRANT_VERBS = ("granted", "promoted", "revoked")
# What each entry of Action.evidence records, told by the key it carries (ledger/executor.py,
# ledger/webhooks.py); an entry with none of them is a provider call that failed.
EVIDENCE_KINDS = (("verification", "verification"), ("webhook", "webhook"), ("lease_expired", "lease_expired"))
HOW_TO_CHECK = (
    "content_hash = sha256 of the JSON of {occurred_at, actor, verb, object_type, object_id, before, after, reason, "
    "request_id}, or of them and object_label (the events written since the label is hashed), with sorted keys and "
    "separators (',', ':'); hash = sha256 of prev_hash + content_hash + seq "
    "(as text); an event's prev_hash is the hash of the event whose seq is one less. An event with `redacted` "
    "shows {\"withheld\": n} (n a whole number, 0 or more) in place of the staff addresses at those paths, each in "
    "its before or after and ending in one of withheld_keys: its content_hash is the chain's, checked against the "
    "database, not recomputed from the file; a path named anywhere else fails. audit.checkpoint (null: not "
    "yet checkpointed) is the chain's hash at a seq at or after every event here, signed by this ledger. digest = "
    "sha256 of this record's JSON without 'integrity', written the same way. `manage.py evidence_verify FILE` "
    "checks all of it and, against the database, the signatures and the chain."
)


@dataclass(frozen=True)
class EvidencePart:
    """An app's part of an action's evidence record: `data` (JSON-ready, as its schema says)
    and `audit`, a Q naming the audit events that cover it (the record carries them with
    their links in the hash chain)."""

    data: object
    audit: Q = Q(pk__in=[])


@dataclass(frozen=True)
class EvidenceSection:
    """The section `name` of every action's record, which an app built on the ledger adds."""

    name: str
    build: object  # build(action) -> EvidencePart, in a number of queries that does not grow with the history
    schema: type  # the DRF serializer describing `data`, for the OpenAPI document
    template: str  # what the printable page includes, with `data`
    # Keys whose values are staff's e-mail addresses, in this section's data and in the detail
    # (`before`, `after`) of any audit event the record carries: withheld from the agent's record.
    withheld: tuple = ()


def evidence_actions():
    """The actions to build records from, with what every record reads of them."""
    return Action.objects.select_related("agent__owner", "task", "supersedes", "superseded_by")


def evidence_record(action, sections, *, for_staff=False):
    """The evidence record of `action` (one of `evidence_actions()`), JSON-ready and signed,
    with `sections` (EvidenceSections) under "sections", in their order: the agent's, with the
    sections' staff addresses withheld, unless `for_staff` (the dashboard's, whole)."""
    parts = [(section.name, section.build(action)) for section in sections]
    audit_q = _covering(action) | _grant_events(action)
    for _, part in parts:
        audit_q |= part.audit
    events = list(AuditEvent.objects.filter(audit_q).order_by("id"))
    withheld_keys = [] if for_staff else sorted({key for section in sections for key in section.withheld})
    record = {
        "format": FORMAT,
        "generated_at": _utc(timezone.now()),
        "request": _request(action),
        "outcome": _outcome(action),
        "agent": _agent(action, events),
        "task": _task(action.task) if action.task_id else None,
        "provider_evidence": [{"kind": _kind(entry), "entry": entry} for entry in action.evidence or []],
        "webhooks": _webhooks(action),
        "sections": {name: part.data for name, part in parts},
        # Under the digest: the offline check accepts `redacted` at these keys only.
        "withheld_keys": withheld_keys,
        "audit": {**_audit(events), "archived": _archived_before(action)},
    }
    # Through JSON and back: the digest is of exactly what the file will hold.
    record = json.loads(json.dumps(record, default=str))
    _withhold_from_the_agent(record, set(withheld_keys))
    digest = record_digest(record)
    signature = ledger_signer("evidence").signature(digest)
    record["integrity"] = {"digest": digest, "signature": signature, "how_to_check": HOW_TO_CHECK}
    return record


def _covering(action):
    q = Q(object_type=Action._meta.label_lower, object_id=str(action.pk))
    if action.task_id:
        q |= Q(object_type=action.task._meta.label_lower, object_id=str(action.task_id))
    return q


def _capability_label(action):
    return str(Capability(kind=Capability.Kind.ACTION_TYPE, name=action.action_type))


def _grant_events(action):
    """The agent's grant, promotions and revokes for the action type, up to the request."""
    label = _capability_label(action)
    return Q(object_type=action.agent._meta.label_lower, object_id=str(action.agent_id), verb__in=GRANT_VERBS,
             occurred_at__lte=action.created_at) & (Q(after__capability=label) | Q(before__capability=label))


def _request(action):
    return {
        "operation_key": action.operation_key, "action_type": action.action_type, "target": action.target,
        "customer": action.customer, "params": action.params, "fingerprint": action.fingerprint,
        "decision_id": action.decision_id, "task_id": action.task.task_id if action.task_id else None,
        "requested_at": _utc(action.created_at),
        # A version a person edited an action down into names the one it replaces, and back.
        "supersedes": action.supersedes.operation_key if action.supersedes_id else None,
        "superseded_by": getattr(getattr(action, "superseded_by", None), "operation_key", None),
    }


def _outcome(action):
    return {
        "status": action.status, "attempts": action.attempts, "external_ref": action.external_ref or None,
        "approved_fingerprint": action.approved_fingerprint or None,
        "result": action.result, "error": action.error, "updated_at": _utc(action.updated_at),
    }


def _agent(action, events):
    """The agent, its owner, and the grant it acted under: shadow or live when the request
    was recorded, and the promotion in force then (from the audit events)."""
    agent = action.agent
    requested = next((e for e in events if e.object_type == Action._meta.label_lower and e.verb == "requested"), None)
    grant = Grant.objects.filter(agent=agent, capability__kind=Capability.Kind.ACTION_TYPE,
                                 capability__name=action.action_type).first()
    return {
        "name": agent.name, "owner": agent.owner.get_username(),
        "grant": {
            "capability": _capability_label(action),
            "state_at_request": None if requested is None else (
                ActionStatus.SHADOW if (requested.after or {}).get("status") == ActionStatus.SHADOW else "live"),
            "promotion": _promotion_in_force([e for e in events if e.object_type == agent._meta.label_lower]),
            "state_now": grant.state(version_now(action.action_type)) if grant else None,
        },
    }


def _promotion_in_force(grant_events):
    """The last promotion before the request, unless a revoke came after it (granting again
    leaves a live grant live)."""
    promoted = None
    for event in grant_events:
        if event.verb in ("promoted", "revoked"):
            promoted = event if event.verb == "promoted" else None
    if promoted is None:
        return None
    after = promoted.after or {}
    return {"seq": promoted.seq, "at": promoted.occurred_at.isoformat(), "by": promoted.actor,
            "reason": promoted.reason, "live_until": after.get("live_until"), "replay_run": after.get("replay_run")}


def _task(task):
    """The task the action is a step of, with every step row as it stands."""
    return {
        "task_id": task.task_id, "workflow": task.workflow, "state": task.state, "attempts": task.attempts,
        "max_attempts": task.max_attempts, "last_error": task.last_error,
        "steps": [{"position": s.position, "name": s.name, "status": s.status, "idempotency_key": s.idempotency_key,
                   "result": s.result, "error": s.error, "updated_at": _utc(s.updated_at)}
                  for s in task.steps.order_by("position")],
    }


def _kind(entry):
    return next((kind for key, kind in EVIDENCE_KINDS if key in entry), "call") if isinstance(entry, dict) else "call"


def _webhooks(action):
    """Every event a provider sent naming the action's operation key, settling or not (by
    the indexed column the key is stored in as the event is)."""
    events = WebhookEvent.objects.filter(operation_key=action.operation_key).order_by("id")
    return [{"connector": e.connector, "event_id": e.event_id, "event_type": e.event_type,
             "received_at": _utc(e.received_at), "outcome": e.outcome, "payload": e.payload} for e in events]


def _audit(events):
    latest = ChainCheck.objects.order_by("-id").first()
    return {
        "events": [audit_event(e) for e in events],
        "unsealed": sum(1 for e in events if e.seq is None),
        "checkpoint": _covering_checkpoint(events),
        "last_chain_check": None if latest is None else {
            "checked_at": _utc(latest.checked_at), "scope": latest.scope, "through_seq": latest.through_seq,
            "broken_at": latest.broken_at, "why": latest.why,
        },
    }


def _archived_before(action):
    """Where the events before the chain's start went, if an archive run took some: the checkpoint's
    seq the chain starts from, and the files (and their SHA-256) that hold the events before it.
    Named for every action, however recent: the record also reads the policies in force when it was
    requested (its limit's last change, its agent's grant), which may be older than any action, and
    found absent, they may be among them. None while no archive run took any."""
    origin = chain_start()
    if origin is None:
        return None
    archives = Archive.objects.filter(checkpoint__seq__lte=origin.seq).select_related("checkpoint").order_by("id")
    return {"before_seq": origin.seq,
            "files": [{"file": Path(a.file).name, "sha256": a.sha256} for a in archives if a.vouched()]}


def _covering_checkpoint(events):
    """The first checkpoint at or after every event cited, which vouches for all of them; None
    while one of them is unsealed or the chain has not reached the next checkpoint yet."""
    if not events or any(e.seq is None for e in events):
        return None
    checkpoint = ChainCheckpoint.objects.filter(seq__gte=max(e.seq for e in events)).order_by("seq").first()
    return None if checkpoint is None else {
        "seq": checkpoint.seq, "hash": checkpoint.hash, "signature": checkpoint.signature,
        "written_at": _utc(checkpoint.written_at)}


def audit_event(event):
    """An event as the record carries it: the fields its content hash is of, exactly as
    hashed, with its place in the chain (seq, prev_hash, hash: null/empty until sealed)."""
    return {"id": event.pk, "seq": event.seq, **event.content_fields(), "object_label": event.object_label,
            "content_hash": event.content_hash, "prev_hash": event.prev_hash, "hash": event.hash}


def _utc(moment):
    return moment.isoformat().replace("+00:00", "Z")


# --- what the agent's record withholds ------------------------------------------------------------


def withheld(value):
    """What the agent's record shows in place of staff's e-mail addresses: how many there were
    (kept as a list, or as text separated by commas, as a limit's tier is)."""
    addresses = value if isinstance(value, list) else [part for part in str(value).split(",") if part.strip()]
    return {"withheld": len(addresses)}


def _withhold(value, keys, path=()):
    """(`value` with the value of every key in `keys` withheld, wherever it is, [the paths of
    those withheld]). A key that names no address (blank) is left as it is."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return value, []
    shown, paths = {}, []
    for key, inner in items:
        if key in keys and not isinstance(inner, dict) and withheld(inner or "")["withheld"]:
            shown[key], found = withheld(inner), [(*path, key)]
        else:
            shown[key], found = _withhold(inner, keys, (*path, key))
        paths += found
    return (shown if isinstance(value, dict) else list(shown.values())), paths


def _withhold_from_the_agent(record, keys):
    """The record as the agent reads it: the sections' data and every audit event's detail without
    the values under `keys`. An event so shown names them in `redacted` ("after.first_tier"); its
    hashes stay the chain's."""
    if not keys:
        return
    record["sections"] = _withhold(record["sections"], keys)[0]
    for event in record["audit"]["events"]:
        paths = []
        for name in ("before", "after"):
            event[name], found = _withhold(event[name], keys, (name,))
            paths += found
        if paths:
            event["redacted"] = sorted(".".join(str(key) for key in path) for path in paths)


# --- checking a record --------------------------------------------------------------------------


def record_digest(record):
    body = {k: v for k, v in record.items() if k != "integrity"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# The events' ids looked up at most this many a statement: PostgreSQL binds at most 65,535 values
# in one, as the production settings bind them (server-side), and a file may cite any number.
IDS_A_STATEMENT = 10_000


def record_problems(record, *, database=True, archives=None):
    """Everything wrong with a record (an empty list: it holds). From the file alone, or also
    against the database (`database`), and the archive files in `archives` (a directory) for
    the events the database no longer holds: see the module's docstring."""
    try:
        events = record["audit"]["events"]
        integrity = record["integrity"]
    except (KeyError, TypeError):
        events = integrity = None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events) or not isinstance(integrity, dict):
        return ["not an evidence record (no audit events or no integrity block)"]
    if not all(_whole_or_none(e.get("id")) and _whole_or_none(e.get("seq")) for e in events):
        return ["not an evidence record (an audit event's id or seq is no whole number)"]
    if not all(_paths_or_absent(e.get("redacted", [])) for e in events):
        return ["not an evidence record (an audit event's redacted is no list of paths)"]
    # Absent (a record written before records named them): none, and no event of it may withhold.
    withheld_keys = record.get("withheld_keys", [])
    if not _paths_or_absent(withheld_keys):
        return ["not an evidence record (its withheld_keys is no list of keys)"]
    problems = []
    if record_digest(record) != integrity.get("digest"):
        problems.append("the digest is not the record's: the record was changed after it was written")
    problems += _chain_problems(events, withheld_keys)
    if database:
        if not ledger_signed("evidence", str(integrity.get("digest")), integrity.get("signature")):
            problems.append("the signature is not this ledger's for this digest")
        archived, held, problems_of_files = (archived_events(archives, *_cited(record)) if archives
                                             else ({}, False, []))
        problems += problems_of_files
        problems += _database_problems(events, archived, held)
        problems += _checkpoint_problems(record["audit"].get("checkpoint"), archived)
    return problems


def _cited(record):
    """The seqs and the ids of the audit events a record cites, and its checkpoint's seq: what it
    asks of the archive files."""
    events, checkpoint = record["audit"]["events"], record["audit"].get("checkpoint")
    seqs = {event["seq"] for event in events if isinstance(event.get("seq"), int)}
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("seq"), int):
        seqs.add(checkpoint["seq"])
    return seqs, {event["id"] for event in events if isinstance(event.get("id"), int)}


def _whole_or_none(value):
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _paths_or_absent(redacted):
    return isinstance(redacted, list) and all(isinstance(path, str) and path for path in redacted)


def archived_events(directory, seqs, ids):
    """({seq: (id, content_hash, prev_hash, hash, fields)} of the audit events with one of `seqs` or
    `ids` in the archive files in `directory`, whether those files hold any event, [problems]). Only a
    file whose SHA-256 is the one its Archive row keeps counts
    (a row this ledger signed), and only if its events link one to the next, each hash
    recomputed from the one before, and each content hash from the event's fields: the SHA-256
    vouches only for the file as the run wrote it, which holds an event altered in the database
    before the run as it found it. And only if both its ends are tied to a signed checkpoint: it
    starts at the event the checkpoint of the archive before it vouches for (`_start_problem`), and
    its last event is the one its own checkpoint's event follows (`_end_problem`). The links
    inside a file hold for a stretch rewritten behind the ledger's back, each content hash
    recomputed and each event linked to the one before, which breaks only there: a run refuses
    such a stretch now (dlq.archive), one of the code before took it. A file missing from the
    directory is passed over (the record's events it held are then "not in the database").

    A run's file may hold millions of rows, tens of GB read whole: each file is read once, a line
    at a time, and of its events only its ends and those asked for are kept (`_read_archive`)."""
    found, held, problems = {}, False, []
    files, previous = [], None  # (name, checkpoint, ArchiveFile) of the files read, in the chain's order
    for archive in Archive.objects.filter(checkpoint__isnull=False).select_related("checkpoint").order_by("id"):
        if not archive.vouched():
            problems.append(f"archive {Path(archive.file).name}: its row is not the one this ledger signed")
            continue
        before, previous = previous, archive.checkpoint
        path = Path(directory) / Path(archive.file).name
        try:
            read = _read_archive(path, archive.sha256, seqs, ids)
        except OSError:
            continue
        if read is None:
            problems.append(f"archive {path.name}: not the file the ledger wrote (its SHA-256 differs)")
            continue
        if why := read.unlinked or _start_problem(read.first, before):
            problems.append(f"archive {path.name}: {why}")
            continue
        files.append((path.name, archive.checkpoint, read))
    for (name, checkpoint, read), after in zip(files, files[1:] + [None]):
        if why := _end_problem(checkpoint, read.header, read.last, after and after[2].first):
            problems.append(f"archive {name}: {why}")
            continue
        found |= read.cited
        held = True
    return found, held, problems


@dataclass
class ArchiveFile:
    """What the checks keep of an archive file (`_read_archive`): its header, its first and last
    audit events' fields (in the chain's order, the file's), why its events do not link (None if
    they do), and {seq: (id, content_hash, prev_hash, hash, fields)} of the events asked for."""

    header: dict | None = None
    first: dict | None = None
    last: dict | None = None
    unlinked: str | None = None
    cited: dict = field(default_factory=dict)

    def walk(self, rows, seqs, ids):
        """Reads the file's rows (its header first), one at a time."""
        self.header = next(rows, None)
        for row in rows:
            if row.get("model") != AuditEvent._meta.label_lower:
                continue
            pk, event = row["pk"], row["fields"]
            if self.last is None:
                self.first = event
            elif why := _link_problem(self.last, event):
                self.unlinked = why
                return
            if event["seq"] in seqs or pk in ids:
                self.cited[event["seq"]] = (pk, event["content_hash"], event["prev_hash"], event["hash"], event)
            self.last = event
        if self.last is not None:
            self.unlinked = _link_problem(self.last, None)


def _read_archive(path, sha256, seqs, ids):
    """The archive file at `path` (an ArchiveFile), or None if it is not the one the ledger wrote:
    its SHA-256 is not `sha256`. Read once, a line at a time (a row each), each line hashed as it
    is read, so what is checked is what was hashed. A file changed behind the ledger's back may hold
    a line that is no row as the ledger writes them (not JSON, no fields): reading it stops there,
    the rest is still hashed, and the SHA-256 tells the file is not the ledger's. One of the ledger's
    own that cannot be read so is a fault of this code, and raises."""
    digest, read, failed = hashlib.sha256(), ArchiveFile(), None
    with path.open("rb") as file:
        lines = _hashed(file, digest)
        try:
            read.walk(map(json.loads, lines), seqs, ids)
        except OSError:  # the file's, not its rows': as when it cannot be opened
            raise
        except Exception as exc:  # whatever a changed line makes of its reading: the SHA-256 decides below
            failed = exc
        deque(lines, maxlen=0)  # the rest of the file, hashed
    if digest.hexdigest() != sha256:
        return None
    if failed is not None:
        raise failed
    return read


def _hashed(lines, digest):
    """The lines, each added to `digest` as it is read."""
    for line in lines:
        digest.update(line)
        yield line


def _link_problem(event, following):
    """Why a file's `event` does not link to the one `following` it in the chain's order (None: the
    last), its content hash recomputed from its fields and its hash from the one before; None if
    it does."""
    if event["content_hash"] not in content_hashes(event):  # either version (ledger.audit)
        return (f"event #{event['seq']} was altered after it was written (its fields are not what its content "
                "hash was computed from)")
    if chain_hash(event["prev_hash"], event["content_hash"], event["seq"]) != event["hash"] or (
            following is not None and (following["seq"], following["prev_hash"]) != (event["seq"] + 1,
                                                                                     event["hash"])):
        return f"its chain breaks at seq {event['seq']}"
    return None


def _start_problem(first, before):
    """Why a file's events (`first`: the first one's fields, None if it holds none) do not start
    where the archive before it left the chain (None if they do): at the event its checkpoint
    `before` vouches for (that seq, that hash), which stayed in the database as the chain's start;
    at the chain's first (seq 1, following "") for the first."""
    first = first or {}
    if before is None:
        return None if (first.get("seq"), first.get("prev_hash")) == (1, "") else \
            "it does not start at the chain's first event"
    if (first.get("seq"), first.get("hash")) != (before.seq, before.hash):
        return f"it does not start at event #{before.seq}, which the checkpoint before it vouches for"
    return None


def _end_problem(checkpoint, header, last, after):
    """Why a file's last event (`last`, its fields) is not the one its `checkpoint`'s event follows
    (None if it is), that event's prev_hash and content_hash hashing (with its seq) to the
    checkpoint's signed hash. The file's header names them (dlq.archive.write_file); a file written
    before headers did is checked against the event itself: first in the file after it (`after`,
    that file's first event), or in the database while the chain starts there."""
    named = header.get("checkpoint") or {}
    if "prev_hash" in named:
        event = named
    elif after and after["seq"] == checkpoint.seq:
        event = after
    else:
        event = AuditEvent.objects.filter(seq=checkpoint.seq).values("prev_hash", "content_hash").first()
    if event is None:
        return (f"its last event cannot be tied to the checkpoint's event at seq {checkpoint.seq}: neither the "
                "database nor the file after it holds that event")
    if chain_hash(event["prev_hash"], event["content_hash"], checkpoint.seq) != checkpoint.hash:
        return f"the event at seq {checkpoint.seq} it is checked against is not the one the checkpoint vouches for"
    if last["hash"] != event["prev_hash"]:
        return (f"its last event is not the one the checkpoint's event at seq {checkpoint.seq} follows: its events "
                "are not those the checkpoint vouches for")
    return None


def _chain_problems(events, withheld_keys):
    problems, previous = [], None
    # In the chain's order (the order of sealing, which may differ from the ids').
    for event in sorted(events, key=lambda e: (0, e["seq"]) if isinstance(e.get("seq"), int) else (1, 0)):
        name = f"event #{event.get('seq') or event.get('id')}"
        # Of its fields without its label or with it (ledger.audit.content_hashes): a label changed in
        # the file shows for an event whose content hash covers it. One with values withheld is
        # checked against the database's row, with them put back (_withholding_problem), once the
        # file shows that it withheld only what the record withholds.
        if event.get("redacted"):
            if why := _redaction_problem(event, withheld_keys):
                problems.append(f"{name}: {why}")
        elif event.get("content_hash") not in content_hashes(event):
            problems.append(f"{name}: its fields are not what its content hash was computed from")
        if isinstance(event.get("seq"), int):
            if chain_hash(event.get("prev_hash"), event.get("content_hash"), event["seq"]) != event.get("hash"):
                problems.append(f"{name}: its hash is not sha256(prev_hash + content_hash + seq)")
            if previous is not None and previous.get("seq") == event["seq"] - 1 \
                    and previous.get("hash") != event.get("prev_hash"):
                problems.append(f"{name}: it does not follow event #{previous['seq']}")
            previous = event
    return problems


def _redaction_problem(event, withheld_keys):
    """Why `event`'s `redacted` names something other than what the agent's record withholds; None if
    each path it names is in its `before` or `after`, ends in one of `withheld_keys`, and shows a count
    there, as `withheld` writes it. Only then may its content hash go unchecked from the file: a path
    named anywhere else, or a value shown whole, would spare any edited event the check."""
    for path in event["redacted"]:
        keys = path.split(".")
        if len(keys) < 2 or keys[0] not in ("before", "after") or keys[-1] not in withheld_keys:
            return (f"it says it withheld {path}, which is not under a key the record withholds "
                    f"({', '.join(withheld_keys) or 'none'})")
        try:
            shown = functools.reduce(_step, keys, event)
        except (KeyError, IndexError, TypeError, ValueError):
            return f"it says it withheld {path}, which it does not show"
        count = shown["withheld"] if isinstance(shown, dict) and shown.keys() == {"withheld"} else None
        if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
            return f"what it shows at {path} is not a value withheld ({{\"withheld\": n}})"
    return None


def _checkpoint_problems(named, archived):
    """The checkpoint the record names: this ledger's, as the record has it, still vouching (its
    own event in the database, or in an archive file: `archived`, by seq)."""
    if named is None:
        return []
    if not isinstance(named, dict) or not isinstance(named.get("seq"), int):
        return ["the checkpoint it names is not a checkpoint (no seq)"]
    checkpoint = ChainCheckpoint.objects.filter(seq=named["seq"]).first()
    if checkpoint is None:
        return [f"checkpoint at seq {named.get('seq')}: not in the database"]
    if (named.get("hash"), named.get("signature")) != (checkpoint.hash, checkpoint.signature):
        return [f"checkpoint at seq {checkpoint.seq}: not the database's"]
    if checkpoint.seq in archived and archived[checkpoint.seq][3] == checkpoint.hash:
        return []
    return [why] if (why := checkpoint.problem()) else []


def _database_problems(events, archived, held):
    """Each event against the database's row with the same id: the same content hash, and
    once sealed the same seq and hashes (an event the export saw unsealed may be sealed now);
    one the database no longer holds, against its archive file's (`archived`, by seq, or by id
    for an event the export saw unsealed: its id and content hash are all the record knows;
    `held`: whether the archive files given hold any event).
    An event with values withheld must be the row's (or the file's) fields with just those
    values withheld (`_withholding_problem`)."""
    ids = [e.get("id") for e in events if isinstance(e.get("id"), int)]
    rows = {}
    for start in range(0, len(ids), IDS_A_STATEMENT):
        rows |= AuditEvent.objects.in_bulk(ids[start:start + IDS_A_STATEMENT])
    archived_by_id = {entry[0]: entry for entry in archived.values()}
    problems = []
    for event in events:
        row = rows.get(event.get("id"))
        name = f"event #{event.get('seq') or event.get('id')}"
        kept = None  # the event's fields as the chain holds them, once its hashes are found to be the chain's
        if row is None and event.get("seq") is None and event.get("id") in archived_by_id:
            if archived_by_id[event["id"]][1] != event.get("content_hash"):
                problems.append(f"{name}: not as its archive file holds it")
            else:
                kept = archived_by_id[event["id"]][4]
        elif row is None and event.get("seq") in archived:
            if archived[event["seq"]][:4] != (event.get("id"), event.get("content_hash"), event.get("prev_hash"),
                                              event.get("hash")):
                problems.append(f"{name}: not as its archive file holds it")
            else:
                kept = archived[event["seq"]][4]
        elif row is None:
            problems.append(f"{name}: not in the database's audit trail" + (", nor in an archive given" if held
                                                                                else ""))
        elif row.content_hash != content_hash(row.content_fields()):
            problems.append(f"{name}: the database's row was altered after it was written")
        elif event.get("content_hash") != row.content_hash:
            problems.append(f"{name}: its content hash is not the database's")
        elif event.get("seq") is not None and (event["seq"], event.get("prev_hash"), event.get("hash")) != (
                row.seq, row.prev_hash, row.hash):
            problems.append(f"{name}: its place in the chain is not the database's")
        else:
            kept = row.content_fields()
        if kept is not None and event.get("redacted") and (why := _withholding_problem(event, kept)):
            problems.append(f"{name}: {why}")
    return problems


def _withholding_problem(event, kept):
    """Why `event`, as the agent's record shows it, is not `kept` (its fields as the chain holds
    them) with the values at its `redacted` paths withheld; None if it is: each value shown is
    `withheld(kept's)`, and with kept's put back its fields hash to its content hash."""
    restored = json.loads(json.dumps(event))
    for path in event["redacted"]:
        *parents, last = path.split(".")
        try:
            theirs, ours = kept, restored
            for key in parents:
                theirs, ours = _step(theirs, key), _step(ours, key)
            last = int(last) if isinstance(ours, list) else last
            if ours[last] != withheld(_step(theirs, last)):
                return f"what it shows at {path} is not the chain's value withheld"
            ours[last] = _step(theirs, last)
        except (KeyError, IndexError, TypeError, ValueError):
            return f"it withheld {path}, which its fields as the chain holds them do not have"
    if event.get("content_hash") not in content_hashes(restored):
        return "its fields, with the values it withheld put back, are not what its content hash was computed from"
    return None


def _step(value, key):
    return value[int(key)] if isinstance(value, list) else value[key]
