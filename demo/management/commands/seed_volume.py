"""`seed_volume`: synthetic volume data for performance measurement only (`make bench`).

It bulk-loads actions, tasks with their steps, dead-letter entries with their alerts and
review items with PostgreSQL COPY, and **bypasses the audit trail by design**: no audit
events are written for these rows, and no state-machine method runs. The rows are not
history and must never be mistaken for it; that is why the command refuses to run with
PRODUCTION on and is meant for a database of its own (e.g. `surety_volume`). The only rows
made through the product's functions are the handful of agents (`agent_create`, audited).

The data is shaped like real use, because the pages measured on it choose their query
plans by it: created_at spread over 90 days in id order (rows arrive in time order), mostly
succeeded, a realistic mix of action types, targets, customers (a few heavy ones) and
agents; the actions waiting for a person (and their open review items, a few thousand at
1M) are the recent ones; every refund above 500 that succeeded passed an approval item.
Each dead-letter entry gets its alert in the same transaction (the deferred trigger
`dlq_entry_needs_alert` refuses to commit an entry without one). After loading, the tables
are vacuumed and analysed, as autovacuum eventually would.
"""

import json
import random
import time
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from django.utils import timezone

from ledger.actions import fingerprint
from ledger.agents import agent_create
from ledger.models import Agent

ACTIONS = 1_000_000
DEADLETTERS = 100_000
DAYS = 90
# Actions younger than this may be in flight or waiting for a person; older ones are settled.
RECENT = timedelta(hours=12)
RECENT_STATUSES = {  # weights
    "succeeded": 40, "failed": 2, "rejected": 1, "cancelled": 1, "queued": 4, "pending": 1, "unknown": 1,
    "awaiting_approval": 25, "held": 8, "needs_review": 17,
}
SETTLED_STATUSES = {"succeeded": 93, "failed": 3.5, "rejected": 1.5, "cancelled": 2}
ACTION_TYPES = {"refund": 55, "send_message": 35, "create_booking": 10}
CURRENCIES = {"EUR": 70, "USD": 20, "GBP": 10}
AGENTS = {  # name -> action types it requests
    "vol-refunds-eu": ("refund",), "vol-refunds-us": ("refund",), "vol-refunds-uk": ("refund",),
    "vol-support-1": ("send_message",), "vol-support-2": ("send_message",), "vol-support-3": ("send_message",),
    "vol-bookings": ("create_booking",),
}
REVIEW_KIND = {"awaiting_approval": "approval", "held": "held", "needs_review": "unknown_outcome"}
MESSAGE_TYPES = ("refund_confirmation", "shipping_update", "appointment_reminder", "survey")
SERVICES = ("consultation", "haircut", "repair", "fitting")
DEADLETTER_STATUSES = {"open": 70, "discarded": 12, "redriven": 10, "resolved": 8}
TASK_STATES_FOR_ENTRY = {"open": "dead_lettered", "resolved": "dead_lettered", "redriven": "succeeded",
                         "discarded": "cancelled"}
EXTRA_TASK_STATES = {"succeeded": 90, "failed": 3, "cancelled": 2, "queued": 2, "waiting": 3}
REFUND_STEPS = ("lookup_order", "call_refund_api", "write_confirmation", "notify_customer")
ERRORS = (
    ("lookup_order", "http_503", "GET /sandbox/v1/orders/{order}: HTTP 503"),
    ("lookup_order", "connect_failed", "GET /sandbox/v1/orders/{order}: ConnectError('[Errno 111] Connection refused')"),
    ("call_refund_api", "rate_limited", "POST /sandbox/v1/refunds: rate limited"),
    ("write_confirmation", "crash", "OperationalError: could not obtain lock on row in relation \"ledger_confirmation\""),
    ("notify_customer", "crash", "TemplateDoesNotExist: emails/refund_confirmation.de.txt"),
)
APPROVERS = ("user:alice", "user:bob", "user:carla", "user:dmitri")
OPERATORS = ("user:olga", "user:oscar")


def _weighted(rng, weights):
    names, w = list(weights), list(weights.values())
    return lambda: rng.choices(names, w)[0]


def _j(value):
    return json.dumps(value, separators=(",", ":"))


class Command(BaseCommand):
    help = ("Bulk-load synthetic volume data for benchmarks (PostgreSQL COPY; bypasses the audit trail by design; "
            "refuses in production). Default: 1,000,000 actions and 100,000 dead-letter entries.")

    def add_arguments(self, parser):
        parser.add_argument("--actions", type=int, help=f"actions to load (default {ACTIONS:,} × scale)")
        parser.add_argument("--deadletters", type=int, help=f"dead-letter entries (default {DEADLETTERS:,} × scale)")
        parser.add_argument("--tasks", type=int,
                            help="tasks besides the dead-lettered ones (default: half the dead-letter entries)")
        parser.add_argument("--scale", type=float, default=1.0,
                            help="multiply the defaults, e.g. 0.001 for 1,000 actions and 100 entries")
        parser.add_argument("--batch", type=int, default=100_000, help="rows per COPY transaction (default 100,000)")
        parser.add_argument("--seed", type=int, default=None, help="random seed (reproducible data)")
        parser.add_argument("--no-vacuum", action="store_true", help="skip VACUUM ANALYZE at the end")

    def handle(self, **options):
        if settings.PRODUCTION:
            raise CommandError("seed_volume loads synthetic data that bypasses the audit trail: never in production")
        if connection.vendor != "postgresql":
            raise CommandError("seed_volume needs PostgreSQL (it loads with COPY)")
        scale = options["scale"]
        if scale <= 0:
            raise CommandError("--scale must be positive")
        n_actions = options["actions"] if options["actions"] is not None else round(ACTIONS * scale)
        n_dead = options["deadletters"] if options["deadletters"] is not None else round(DEADLETTERS * scale)
        n_tasks = options["tasks"] if options["tasks"] is not None else n_dead // 2
        if min(n_actions, n_dead, n_tasks) < 0 or options["batch"] < 1:
            raise CommandError("counts must not be negative, --batch must be positive")
        self.verbosity = options["verbosity"]
        self.batch = options["batch"]
        self.rng = random.Random(options["seed"])
        self.run_tag = f"{self.rng.getrandbits(24):06x}"
        self.now = timezone.now()
        started = time.monotonic()
        self.say(f"seed_volume: {n_actions:,} actions, {n_dead:,} dead-letter entries, {n_tasks:,} other tasks "
                 f"(run {self.run_tag}; synthetic, not audited)")

        self.agents = self._phase("agents", self.ensure_agents)
        counts = {}
        counts["actions"], counts["review_items"] = self._phase("actions + review items", self.load_actions, n_actions)
        counts["tasks"], counts["deadletters"] = self._phase("tasks + steps + dead letters + alerts",
                                                             self.load_tasks, n_dead, n_tasks)
        if not options["no_vacuum"]:
            self._phase("vacuum analyze", self.vacuum)
        total = time.monotonic() - started
        self.say(f"seed_volume: done in {total:.1f}s — " + ", ".join(f"{v:,} {k}" for k, v in counts.items()))
        return None

    # --- helpers -------------------------------------------------------------------------------

    def say(self, message):
        if self.verbosity >= 1:
            self.stdout.write(message)
            self.stdout.flush()

    def _phase(self, name, fn, *args):
        t0 = time.monotonic()
        result = fn(*args)
        self.say(f"  {name}: {time.monotonic() - t0:.1f}s")
        return result

    def reserve_ids(self, table, n):
        """n ids from the table's own sequence, so rows written later by the app never collide."""
        if n == 0:
            return []
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT nextval(pg_get_serial_sequence('{table}', 'id')) FROM generate_series(1, %s)", [n])
            return [row[0] for row in cursor.fetchall()]

    def copy(self, table, columns, rows):
        """COPY the rows (an iterable of tuples in `columns` order) into `table`, inside the
        caller's transaction."""
        raw = connection.cursor().cursor  # the psycopg 3 cursor under Django's wrapper
        written = 0
        with raw.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
                written += 1
        return written

    def times(self, n, *, days=DAYS):
        """n creation times over the last `days`, oldest first (ids grow with time, as in real use)."""
        span = days * 86400
        offsets = sorted((self.rng.random() * span for _ in range(n)), reverse=True)
        return [self.now - timedelta(seconds=s) for s in offsets]

    # --- agents --------------------------------------------------------------------------------

    def owner(self):
        """The volume agents' owner: a person of the seed's own, who decides nothing."""
        return get_user_model().objects.get_or_create(username="volume-owner", defaults={"is_active": False})[0]

    def ensure_agents(self):
        agents = {}
        for name, types in AGENTS.items():
            agent = Agent.objects.filter(name=name).first()
            if agent is None:
                with transaction.atomic():
                    agent, _ = agent_create(name, actor="system:seed_volume", grants=types, owner=self.owner())
            agents[name] = agent.pk
        by_type = {}
        for name, types in AGENTS.items():
            for t in types:
                by_type.setdefault(t, []).append(agents[name])
        return by_type

    # --- actions and review items ----------------------------------------------------------------

    def load_actions(self, n):
        rng = self.rng
        ids = self.reserve_ids("ledger_action", n)
        created = self.times(n)
        # At least the newest few hundred are recent, so that a small load also has full pages
        # of open review items to compare with the large one.
        recent_from = min(self.now - RECENT, created[-min(n, 400)]) if n else self.now
        recent_status, settled_status = _weighted(rng, RECENT_STATUSES), _weighted(rng, SETTLED_STATUSES)
        action_type, currency = _weighted(rng, ACTION_TYPES), _weighted(rng, CURRENCIES)
        customers = max(1000, n // 20)
        columns = ("id", "operation_key", "fingerprint", "action_type", "target", "customer", "params", "amount",
                   "currency", "decision_id", "task_id", "agent_id", "status", "attempts", "external_ref", "result",
                   "error", "evidence", "next_attempt_at", "lease_owner", "lease_expires_at", "fence", "created_at",
                   "updated_at", "approved_fingerprint")
        review_columns = ("kind", "action_id", "status", "why", "approvals_needed", "limit_snapshot", "deadline",
                          "created_at", "updated_at", "decided_by_label", "decided_at", "note", "overdue_alerted_at",
                          "decided_fingerprint")
        limit_snapshot = _j({"max_amount": "500.000", "dual_approval_above": "5000.000",
                             "daily_customer_total": "2000.000", "review_deadline_hours": 4})
        tag = self.run_tag
        reviews = []

        def rows(lo, hi):
            for i in range(lo, hi):
                at = created[i]
                status = recent_status() if at >= recent_from else settled_status()
                kind = "refund" if status in ("awaiting_approval", "rejected") else action_type()
                customer = f"CUST-{int(customers * rng.random() ** 2):06d}"
                agent_id = rng.choice(self.agents[kind])
                amount = cur = None
                if kind == "refund":
                    order = f"ORD-{rng.randrange(10**8, 10**9)}"
                    cur = currency()
                    if status == "awaiting_approval":
                        value = rng.uniform(500.01, 9000)
                    else:
                        value = min(rng.lognormvariate(4, 1), 4999)
                    amount = f"{value:.2f}"
                    target, key = order, f"refund:{order}:full:dec-{tag}{i}"
                    params = {"amount": amount, "currency": cur}
                    ref_prefix = "re_"
                elif kind == "send_message":
                    mtype = rng.choice(MESSAGE_TYPES)
                    target = f"{customer.lower()}@customers.surety.example"
                    key = f"message:{customer}:{mtype}:dec-{tag}{i}"
                    params = {"channel": "email", "message_type": mtype,
                              "body": f"Hello, an update about your {mtype.replace('_', ' ')} (ref {tag}{i})."}
                    ref_prefix = "msg_"
                else:
                    service = rng.choice(SERVICES)
                    start = (at + timedelta(days=rng.randint(1, 14))).replace(minute=0, second=0, microsecond=0)
                    target = f"room-{rng.randint(1, 40)}"
                    key = f"booking:{customer}:{service}:{start:%Y%m%dT%H}:{tag}{i}"
                    params = {"service": service, "start": start.isoformat(),
                              "end": (start + timedelta(hours=1)).isoformat()}
                    ref_prefix = "bk_"
                attempts = {"queued": 0, "awaiting_approval": 0, "held": 0, "rejected": 0, "cancelled": 0}.get(
                    status, 1 if rng.random() < 0.95 else 2)
                external_ref = result = error = next_at = lease_exp = None
                evidence, lease_owner = "[]", ""
                updated = at + timedelta(seconds=rng.uniform(0.2, 5))
                if status == "succeeded":
                    external_ref = f"{ref_prefix}{rng.getrandbits(96):024x}"
                    result = _j({"id": external_ref, "status": "succeeded"})
                elif status == "failed":
                    retryable = rng.random() < 0.3
                    error = _j({"code": "attempts_exhausted" if retryable else "declined",
                                "message": "no effect after 3 attempts" if retryable else "the provider declined",
                                "retryable": retryable})
                elif status == "queued":
                    next_at = at
                elif status == "pending":
                    lease_owner, lease_exp = "vol-worker:1", self.now + timedelta(seconds=30)
                elif status in ("unknown", "needs_review"):
                    evidence = _j([{"at": updated.isoformat(), "attempt": attempts, "error": "OutcomeUnknown",
                                    "code": "timeout", "status": None, "message": "no answer within 5s"}])
                    next_at = updated if status == "unknown" else None
                # A decision is bound to the print of the params the approver saw (these, unchanged).
                params_print = fingerprint(kind, target, params)
                approved = ""
                if status in REVIEW_KIND:
                    deadline = at + timedelta(hours=4)
                    reviews.append((REVIEW_KIND[status], ids[i], "open", "", 2 if amount and float(amount) > 5000 else 1,
                                    limit_snapshot if status == "awaiting_approval" else None, deadline, at, at,
                                    "", None, "", None, ""))
                elif status == "rejected" or (status == "succeeded" and amount and float(amount) > 500):
                    decided = at + timedelta(minutes=rng.uniform(3, 200))
                    who = rng.choice(APPROVERS)
                    rejected = status == "rejected"
                    reviews.append(("approval", ids[i], "rejected" if rejected else "approved", "", 1, limit_snapshot,
                                    at + timedelta(hours=4), at, decided, who, decided,
                                    "not covered by the refund policy" if rejected else "", None, params_print))
                    if not rejected:
                        updated = decided + timedelta(seconds=rng.uniform(0.2, 5))
                        approved = params_print
                fence = attempts
                yield (ids[i], key, params_print, kind, target, customer, _j(params), amount,
                       cur or "", f"dec-{tag}{i}", None, agent_id, status, attempts, external_ref or "", result,
                       error, evidence, next_at, lease_owner, lease_exp, fence, at, updated, approved)

        written = reviewed = 0
        for lo in range(0, n, self.batch):
            hi = min(n, lo + self.batch)
            with transaction.atomic(), connection.cursor() as cursor:
                # Seeded rows are history, not requests: the same-object rule (migration 0014)
                # would hold them, and its locks, one pair per row, would fill the lock table.
                # (The ALTER locks the table until this batch commits.)
                cursor.execute("ALTER TABLE ledger_action DISABLE TRIGGER ledger_action_same_subject")
                written += self.copy("ledger_action", columns, rows(lo, hi))
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no ALTER while foreign-key checks wait
                cursor.execute("ALTER TABLE ledger_action ENABLE TRIGGER ledger_action_same_subject")
                reviewed += self.copy("approvals_reviewitem", review_columns, reviews)
            reviews.clear()
            self.say(f"    actions {hi:,}/{n:,}")
        return written, reviewed

    # --- tasks, steps, dead letters, alerts ---------------------------------------------------------

    def load_tasks(self, n_dead, n_other):
        rng = self.rng
        n = n_dead + n_other
        task_ids = self.reserve_ids("ledger_task", n)
        dead_ids = self.reserve_ids("dlq_deadletter", n_dead)
        created = self.times(n)
        # Which of the tasks (in time order) were dead-lettered: a random n_dead of them.
        dead_positions = set(rng.sample(range(n), n_dead))
        entry_status, other_state = _weighted(rng, DEADLETTER_STATUSES), _weighted(rng, EXTRA_TASK_STATES)
        refund_agents = self.agents["refund"]
        customers = max(1000, n // 5)
        tag = self.run_tag
        task_cols = ("id", "task_id", "fingerprint", "workflow", "input", "agent_id", "state", "attempts",
                     "max_attempts", "next_attempt_at", "last_error", "lease_owner", "lease_expires_at", "fence",
                     "created_at", "updated_at")
        step_cols = ("task_id", "position", "name", "status", "idempotency_key", "result", "error", "updated_at")
        entry_cols = ("id", "task_id", "status", "snapshot", "last_error", "attempts", "created_at", "updated_at",
                      "decided_by", "decided_at", "note")
        alert_cols = ("kind", "dead_letter_id", "review_item_id", "subject", "body", "link", "created_at",
                      "delivered_at")
        tasks, steps, entries, alerts = [], [], [], []
        next_entry = iter(dead_ids)
        written_tasks = written_entries = 0

        def flush():
            nonlocal written_tasks, written_entries
            with transaction.atomic():
                written_tasks += self.copy("ledger_task", task_cols, tasks)
                self.copy("ledger_taskstep", step_cols, steps)
                written_entries += self.copy("dlq_deadletter", entry_cols, entries)
                self.copy("dlq_alert", alert_cols, alerts)  # the trigger checks each entry has one at commit
            for buffer in (tasks, steps, entries, alerts):
                buffer.clear()
            self.say(f"    tasks {written_tasks:,}/{n:,}")

        for i in range(n):
            at = created[i]
            pk = task_ids[i]
            order = f"ORD-{rng.randrange(10**8, 10**9)}"
            task_id = f"refund-{order.removeprefix('ORD-')}-{tag}{i}"
            customer = f"CUST-{int(customers * rng.random() ** 2):06d}"
            input_ = {"order_id": order, "amount": f"{min(rng.lognormvariate(4, 1), 500):.2f}",
                      "currency": rng.choice(("EUR", "EUR", "USD")), "customer": customer}
            updated = at + timedelta(seconds=rng.uniform(1, 60))
            dead = i in dead_positions
            snapshot_failed_at = None
            if dead:
                status = entry_status()
                state = TASK_STATES_FOR_ENTRY[status]
                step_name, code, message = rng.choice(ERRORS)
                snapshot_failed_at = REFUND_STEPS.index(step_name)
                last_error = {"code": code, "message": message.format(order=order), "retryable": True,
                              "step": step_name}
                # A redriven task got a fresh budget and went through; the others stay as they died.
                attempts = 1 if state == "succeeded" else 3
                failed_at = None if state == "succeeded" else snapshot_failed_at
            else:
                state = other_state()
                failed_at = {"succeeded": None, "failed": 0, "cancelled": 1, "queued": 0, "waiting": 1}[state]
                last_error = None
                if state == "failed":
                    last_error = {"code": "unknown_order", "message": f"order {order} is unknown", "retryable": False,
                                  "step": "lookup_order"}
                elif state == "queued":
                    last_error = {"code": "http_502", "message": f"GET /sandbox/v1/orders/{order}: HTTP 502",
                                  "retryable": True, "step": "lookup_order"}
                attempts = {"succeeded": 1, "failed": 1, "cancelled": 1, "queued": 1, "waiting": 0}[state]
            next_at = updated + timedelta(seconds=30) if state == "queued" else None
            tasks.append((pk, task_id, fingerprint("workflow:refund", task_id, input_), "refund", _j(input_),
                          rng.choice(refund_agents), state, attempts, 3, next_at,
                          _j(last_error) if last_error else None, "", None, attempts, at, updated))
            for position, (name, status_, key, result, error) in enumerate(
                    self.step_states(task_id, order, customer, input_, failed_at, last_error)):
                steps.append((pk, position, name, status_, key, _j(result) if result else None,
                              _j(error) if error else None, updated))
            if dead:
                entry_pk = next(next_entry)
                entry_at = updated
                view = {}
                for name, status_, key, result, error in self.step_states(
                        task_id, order, customer, input_, snapshot_failed_at, last_error):
                    view[name] = {"status": status_, **({"idempotency_key": key} if key else {}),
                                  **({"result": result} if result else {}), **({"error": error} if error else {})}
                snapshot = {"task_id": task_id, "workflow": "refund", "state": "dead_lettered", "attempts": 3,
                            "max_attempts": 3, "next_attempt_at": None, "last_error": last_error, "steps": view,
                            "updated_at": entry_at.isoformat().replace("+00:00", "Z"),
                            "url": f"/api/v1/tasks/{task_id}"}
                decided_at = decided_by = None
                note = ""
                if status != "open":
                    decided_at = entry_at + timedelta(minutes=rng.uniform(5, 600))
                    decided_by = rng.choice(OPERATORS)
                    note = {"redriven": "provider back up; redriven from the checkpoint",
                            "discarded": "refunded by hand in the provider's dashboard",
                            "resolved": "confirmation written by hand"}[status]
                entries.append((entry_pk, pk, status, _j(snapshot), _j(last_error), 3, entry_at,
                                decided_at or entry_at, decided_by or "", decided_at, note))
                alerts.append(("dead_letter", entry_pk, None,
                               f"Dead letter: task {task_id} (refund) failed 3×", last_error["message"],
                               f"/dlq/{entry_pk}/", entry_at,
                               entry_at + timedelta(seconds=rng.uniform(0.5, 5)) if rng.random() < 0.98 else None))
            if len(tasks) >= self.batch:
                flush()
        if tasks:
            flush()
        return written_tasks, written_entries

    def step_states(self, task_id, order, customer, input_, failed_at, error):
        """(name, status, key, result, error) per step: done before `failed_at`, failed there (if an
        error is given), pending after; all done if `failed_at` is None."""
        rng = self.rng
        for position, name in enumerate(REFUND_STEPS):
            key = "" if name == "lookup_order" else f"{task_id}:{name}:v1"
            if failed_at is None or position < failed_at:
                if position == 0:
                    result = {"order_id": order, "customer": customer, "amount": input_["amount"]}
                elif name == "write_confirmation":
                    result = {"confirmation": key, "external_ref": f"re_{rng.getrandbits(96):024x}"}
                else:
                    result = {"external_ref": f"re_{rng.getrandbits(96):024x}", "action_status": "succeeded"}
                yield name, "done", key, result, None
            elif position == failed_at and error:
                yield name, "failed", key, None, error
            else:
                yield name, "pending", key, None, None

    def vacuum(self):
        with connection.cursor() as cursor:
            for table in ("ledger_action", "approvals_reviewitem", "ledger_task", "ledger_taskstep", "dlq_deadletter",
                          "dlq_alert"):
                cursor.execute(f"VACUUM (ANALYZE) {table}")
