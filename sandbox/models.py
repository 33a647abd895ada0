"""What the sandbox provider has committed, and the knobs tests turn: faults and idempotency."""

import secrets

from django.db import IntegrityError, models, transaction
from django.db.models import Exists, F, Q
from django.utils import timezone



def new_refund_id():
    return "re_" + secrets.token_hex(12)


def new_message_id():
    return "msg_" + secrets.token_hex(12)


def new_booking_id():
    return "bk_" + secrets.token_hex(12)


class SlotTaken(Exception):
    """A booking overlaps one already made for the same resource."""

    def __init__(self, booking):
        super().__init__(booking.booking_id)
        self.booking = booking


class SandboxSettings(models.Model):
    """The single row (pk 1) of provider-wide switches."""

    idempotency = models.BooleanField(default=True)
    # Outbound webhooks (sandbox.webhooks); null follows the SANDBOX_WEBHOOK_* setting.
    webhook_url = models.CharField(max_length=500, null=True, blank=True)
    webhook_duplicate_rate = models.FloatField(null=True, blank=True)
    webhook_delay_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "sandbox settings"
        constraints = [
            models.CheckConstraint(condition=Q(webhook_duplicate_rate__gte=0, webhook_duplicate_rate__lte=1),
                                   name="sandboxsettings_duplicate_rate_0_to_1"),
            models.CheckConstraint(condition=Q(webhook_delay_seconds__gte=0), name="sandboxsettings_delay_not_negative"),
        ]

    @classmethod
    def load(cls, *, lock=False):
        if not lock:
            found = cls.objects.filter(pk=1).first()
            if found is not None:
                return found
        rows = cls.objects.select_for_update() if lock else cls.objects
        return rows.get_or_create(pk=1)[0]

    @classmethod
    def for_write(cls, target):
        """The row, with `fault_armed`: whether a write fault is armed for `target`. Every write
        asks both, so they are one statement (the sandbox is the provider in `make bench`'s (d)),
        and the faults are looked at, and spent, only when one is armed."""
        armed = SandboxFault.objects.armed(target)
        row = cls.objects.filter(pk=1).annotate(fault_armed=Exists(armed)).first()
        if row is None:
            row = cls.load()
            row.fault_armed = armed.exists()
        return row


class SandboxOrder(models.Model):
    order_id = models.CharField(max_length=255, unique=True)
    customer = models.CharField(max_length=255)
    # Three places: a KWD amount has three minor digits (see ledger.money).
    amount = models.DecimalField(max_digits=12, decimal_places=3)
    currency = models.CharField(max_length=3)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return self.order_id


class SandboxEffect(models.Model):
    """What every refund, message and booking carries besides its own fields."""

    ID_FIELD = ""  # the field holding the id the provider shows ("re_…"), named by each kind

    operation_key = models.CharField(max_length=255, blank=True, default="", db_index=True)
    # Not unique: with the sandbox's idempotency off, a repeated key makes a second row.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True
        ordering = ["created_at", "pk"]
        # Reconciliation pages through each table by (created_at, id): a full scan per page
        # without it (~68 ms against ~18 ms a page at 100k effects).
        indexes = [models.Index(fields=["created_at", "id"], name="%(class)s_created_idx")]

    @property
    def public_id(self):
        return getattr(self, self.ID_FIELD)


class SandboxRefund(SandboxEffect):
    ID_FIELD = "refund_id"
    refund_id = models.CharField(max_length=40, unique=True, default=new_refund_id)
    order_id = models.CharField(max_length=255, db_index=True)
    # Three places: a KWD amount has three minor digits (see ledger.money).
    amount = models.DecimalField(max_digits=12, decimal_places=3)
    currency = models.CharField(max_length=3)
    # As Stripe's Refund names it. Made `succeeded`; a refund the provider fails later (a card
    # closed since the payment) is moved to `failed` or `canceled` behind the caller's back, as a
    # test stages it, and its listing says so from then on.
    status = models.CharField(max_length=20, default="succeeded")

    def __str__(self):
        return self.refund_id


class SandboxMessage(SandboxEffect):
    class Channel(models.TextChoices):
        EMAIL = "email", "e-mail"
        SMS = "sms", "SMS"
        WHATSAPP = "whatsapp", "WhatsApp"

    ID_FIELD = "message_id"

    message_id = models.CharField(max_length=40, unique=True, default=new_message_id)
    recipient = models.CharField(max_length=255, db_index=True)
    channel = models.CharField(max_length=20, choices=Channel.choices)
    message_type = models.CharField(max_length=100)
    body = models.TextField()

    def __str__(self):
        return self.message_id


class SandboxBooking(SandboxEffect):
    ID_FIELD = "booking_id"
    booking_id = models.CharField(max_length=40, unique=True, default=new_booking_id)
    resource = models.CharField(max_length=255, db_index=True)
    customer = models.CharField(max_length=255)
    service = models.CharField(max_length=255)
    start = models.DateTimeField()
    end = models.DateTimeField()

    class Meta(SandboxEffect.Meta):
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="sandboxbooking_ends_after_start"),
        ]

    def __str__(self):
        return self.booking_id

    def ensure_slot_free(self):
        """Raise SlotTaken if another booking of this resource overlaps [start, end).

        Locks the settings row until commit: two overlapping requests could otherwise both find
        the slot free and both insert (a phantom no lock on existing bookings prevents), so
        bookings take turns.
        """
        SandboxSettings.load(lock=True)
        clash = SandboxBooking.objects.filter(
            resource=self.resource, start__lt=self.end, end__gt=self.start
        ).first()
        if clash is not None:
            raise SlotTaken(clash)


class SandboxIdempotencyKey(models.Model):
    """An Idempotency-Key claimed by the request that created the effect `effect_id`.

    Its unique constraint is what makes concurrent requests with one key create one effect.
    """

    scope = models.CharField(max_length=50)
    key = models.CharField(max_length=255)
    # The id the provider shows ("re_…"), known before the effect is saved: the claim is made
    # complete in its one INSERT. Blank for a key that made nothing (see stripe_api).
    effect_id = models.CharField(max_length=40, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="sandboxidempotencykey_unique_key"),
        ]

    def __str__(self):
        return f"{self.scope}:{self.key}"


def effect_save(effect, *, idempotency, check=None):
    """Save a new refund, message or booking once; return (the effect, whether it is new).

    1. With the sandbox's `idempotency` on and an Idempotency-Key given, claim the key. If another
       request holds it, PostgreSQL holds this insert until that request's transaction ends; its
       failure then means the effect is committed, and that effect is returned instead.
    2. Run `check`, which may raise to roll back the claim along with everything else.
    3. Save the effect, in the transaction that made the claim (which names it by its id).
    """
    # No savepoint of its own inside the caller's transaction: a failure rolls back that one.
    with transaction.atomic(savepoint=False):
        if effect.idempotency_key and idempotency:
            scope = effect._meta.model_name
            try:
                with transaction.atomic():
                    SandboxIdempotencyKey.objects.create(scope=scope, key=effect.idempotency_key,
                                                         effect_id=effect.public_id)
            except IntegrityError:
                claim = SandboxIdempotencyKey.objects.get(scope=scope, key=effect.idempotency_key)
                return type(effect).objects.get(**{effect.ID_FIELD: claim.effect_id}), False
        if check is not None:
            check()
        effect.save(force_insert=True)
    return effect, True


class SandboxFaultManager(models.Manager):
    def armed(self, target, *, lookup=False):
        """The faults armed for `target`: a write's, or with `lookup` a look-up's."""
        armed = self.filter(target=target, remaining__gt=0)
        return armed.filter(fault__in=LOOKUP_FAULTS) if lookup else armed.exclude(fault__in=LOOKUP_FAULTS)

    def consume(self, target, *, lookup=False):
        """Use up one armed fault for `target` and return its kind, or None if none is armed:
        a write's fault, or with `lookup` a look-up's (each is spent only by its own kind of call).

        The conditional UPDATE must change exactly one row: of two calls racing for a fault armed
        for one time, the loser's UPDATE finds `remaining` already 0 and it tries the next fault.
        """
        for fault in self.armed(target, lookup=lookup).order_by("pk"):
            if self.filter(pk=fault.pk, remaining__gt=0).update(remaining=F("remaining") - 1) == 1:
                return fault.fault
        return None


class SandboxFault(models.Model):
    """The next `remaining` write calls for `target` (order id, recipient or resource) fail so;
    a look-up fault fails the next look-ups for `target` (an operation key, order id or recipient)."""

    class Kind(models.TextChoices):
        TIMEOUT_AFTER_COMMIT = "timeout_after_commit"
        TIMEOUT_BEFORE_COMMIT = "timeout_before_commit"
        ERROR_500 = "error_500"
        DECLINE = "decline"
        FAILED_AFTER_COMMIT = "failed_after_commit"  # made and answered so, then the provider fails it
        LOOKUP_ERROR = "lookup_error"  # the provider cannot be asked: a look-up answers 500

    target = models.CharField(max_length=255, db_index=True)
    fault = models.CharField(max_length=30, choices=Kind.choices)
    remaining = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    objects = SandboxFaultManager()

    class Meta:
        ordering = ["pk"]

    def __str__(self):
        return f"{self.fault} x{self.remaining} for {self.target}"


LOOKUP_FAULTS = [SandboxFault.Kind.LOOKUP_ERROR]


def new_event_id():
    return "evt_" + secrets.token_hex(12)


class SandboxWebhook(models.Model):
    """One event the sandbox sends, and its delivery (see sandbox.webhooks).

    Sent `copies` times (2 when it is duplicated on purpose), all under one event id. A failed
    POST counts as an attempt that did not add to `sent`; `next_attempt_at` is when the next
    one is due, null once every copy is sent or the sandbox gave up.
    """

    event_id = models.CharField(max_length=40, unique=True, default=new_event_id)
    event_type = models.CharField(max_length=50)
    data = models.JSONField()
    url = models.CharField(max_length=500)
    copies = models.PositiveSmallIntegerField(default=1)
    sent = models.PositiveSmallIntegerField(default=0)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "pk"]
        constraints = [
            models.CheckConstraint(condition=Q(copies__gte=1, sent__lte=F("copies"), attempts__gte=F("sent")),
                                   name="sandboxwebhook_counts_add_up"),
        ]

    def __str__(self):
        return f"{self.event_type} {self.event_id}"
