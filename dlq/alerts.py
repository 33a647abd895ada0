"""Alert transports: e-mail to the operations group (or to the alert's own recipients, a
review item's tier), an HMAC-signed webhook, and e-mail to the owner of an agent whose
action or task failed for good. A review item's recipient for whom it waits (who may decide it
now, as its page would offer them) gets a mail of their own, with a decision link
(approvals.links); a recipient away has their delegate mailed too (approvals.delegation). The
first of two approvals raises an alert of the item's own (`review_alert_second_approval`), to
those of its tiers it waits for then, who learnt of it only from the dashboard before, whoever
gave it and however (a reaction to the item's moves, `review_alert_when_second_awaited`); it is
mailed to nobody once the item waits for none of them (decided before the mail went).

Each attempt on each channel is recorded, in a transaction of its own per channel: what one
channel sent (and the decision links its mails carry) is committed before the next is tried,
so a worker killed or the database lost in the middle of a delivery loses the record of the
one channel it was sending on, no more, and a retry repeats none recorded as done. A channel
that failed is tried again by a job scheduled after a wait that doubles with its failures, up
to an hour (`retry_delay`), never given up; the sweeper queues again an alert whose next try
is overdue (its job lost with Redis). An alert with no operations channel to go to (no
ALERT_EMAILS, no ALERT_WEBHOOK_URL) is never taken as delivered: each try records the
failure and logs the error.
"""

import json
import logging
from datetime import timedelta
from functools import reduce
from operator import or_

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Max, Q
from django.urls import reverse
from django.utils import timezone

from approvals.decisions import past_its_window
from approvals.delegation import offered, standing_in
from approvals.links import deciders, link_issue
from approvals.models import ReviewKind, ReviewStatus, item_tiers
from ledger import clock
from ledger.connectors import http
from ledger.jobs import enqueue
from ledger.webhooks import sign_webhook

from .models import Alert, AlertDelivery

logger = logging.getLogger("surety.alerts")
# Every channel an alert may go on, in the order they are tried; the operations group hears of
# every alert by e-mail or webhook (the agent's owner besides, for some).
CHANNELS = ("email", "webhook", "owner")
OPERATIONS = {"email", "webhook"}
# What a try records when the alert has no operations channel to go to (a setting missing).
NOWHERE = "none"
# The longest wait between two tries of a channel that keeps failing: a receiver down for days
# costs each undelivered alert one try an hour (a timeout's worth of a worker), not one every
# few minutes for as long as it is down.
RETRY_MAX = timedelta(hours=1)
_RETRY_DOUBLINGS = 12  # 2 ** 12 s is past RETRY_MAX


def retry_delay(failures):
    """The wait before the next try of a channel that failed `failures` times: 2 s after the
    first failure, doubling, at most RETRY_MAX."""
    return min(timedelta(seconds=2 ** min(failures, _RETRY_DOUBLINGS)), RETRY_MAX)


def _enqueue(alert_id, delay=None):
    enqueue(alert_deliver, alert_id, at=clock.now() + delay if delay else None)


def group_emails(alert):
    """Where the alert's e-mail goes: its own recipients when it names them, else ALERT_EMAILS."""
    return alert.recipients or settings.ALERT_EMAILS


def channels(alert):
    found = ["email"] if group_emails(alert) else []
    if settings.ALERT_WEBHOOK_URL:
        found.append("webhook")
    if owner_email(alert):
        found.append("owner")
    return found


def owner_email(alert):
    """The agent's owner hears of its action's or task's permanent failure (a refusal no retry
    will change: someone must fix its cause), when they are an active user with an address.
    Everything else goes to the operations channels only."""
    entry = alert.dead_letter
    if entry is None or entry.last_error.get("retryable"):
        return ""
    owner = (entry.action or entry.task).agent.owner
    return owner.email if owner is not None and owner.is_active else ""


def _send(alert, channel, before, reached):
    """Deliver `alert` on `channel`. An e-mail goes to each address not in `before` (those an
    earlier attempt's mail got to), and each address it gets to is added to `reached` as it
    goes: a retry after a mail that failed halfway sends no one a second mail (nor a second
    decision link). A first approval's alert whose item no longer waits is mailed to nobody
    (`_no_longer_waiting`)."""
    link = settings.SITE_URL.rstrip("/") + alert.link
    if channel == "email" and (over := _no_longer_waiting(alert)):
        return over
    if channel in ("email", "owner"):
        to = group_emails(alert) if channel == "email" else [owner_email(alert)]
        # A person away: their delegate is mailed too, and that is audited once the mail went.
        standing = standing_in(to) if alert.review_item is not None else []
        to = [address for address in dict.fromkeys([*to, *(delegation.delegate.email for delegation in standing)])
              if address not in before]
        subject = f"[Surety] {alert.subject}"
        personal = _decision_links(alert, to)
        for address, decide in personal.items():
            send_mail(subject, f"{alert.body}\n\nDecide it here (this link is yours alone, works once and "
                               f"expires):\n{decide}\n\nThe item on the dashboard: {link}\n", None, [address])
            _reached(alert, [address], standing, reached)
        if others := [address for address in to if address not in personal]:
            send_mail(subject, f"{alert.body}\n\n{link}\n", None, others)
            _reached(alert, others, standing, reached)
        return f"mailed to {', '.join(to)}" + (f" (a decision link to {', '.join(personal)})" if personal else "")
    body = json.dumps({"id": alert.pk, "kind": alert.kind, "subject": alert.subject, "body": alert.body,
                       "link": link, "created_at": alert.created_at.isoformat()})
    http.call("POST", settings.ALERT_WEBHOOK_URL, content=body.encode(), headers={
        "Content-Type": "application/json", "Surety-Signature": sign_webhook(body.encode(), settings.ALERT_WEBHOOK_SECRET)})
    return f"posted to {settings.ALERT_WEBHOOK_URL}"


def _reached(alert, addresses, standing, reached):
    """`addresses` got their mail: noted, and a delegate among them audited as offered the item
    (at once: a later address's failure must not leave it unsaid, nor a retry say it twice)."""
    reached.extend(addresses)
    for delegation in standing:
        if delegation.delegate.email in addresses:
            offered(delegation, alert.review_item)


def _no_longer_waiting(alert):
    """What a `second_approval` alert's e-mail records instead of a mail when its item no longer
    waits for any of its recipients ("not mailed: no longer waiting: approved by user:bob"); ""
    while it waits for one of them, and for every other alert. The mail would tell them of a wait
    that is over: the item was decided, edited down or expired after the first approval and before
    the mail went (the alert queued behind other jobs, or tried again for hours while the mail
    server was down). The channel is done then, so never tried again; the webhook still posts the
    alert, the operations group's record of what happened (decision 49)."""
    if alert.kind != Alert.Kind.SECOND_APPROVAL:
        return ""
    item = alert.review_item
    if item.status != ReviewStatus.OPEN:
        why = ": " + " by ".join(filter(None, [item.status, item.decided_by_label]))
    elif deciders(item, alert.recipients):
        return ""
    elif past_its_window(item):  # nobody decides it now; the sweeper's next pass expires it
        why = ": its approval window closed"
    else:  # none of them may decide it now (gone, or their role changed)
        why = " for any of its recipients"
    return f"not mailed: no longer waiting{why}"


def _decision_links(alert, addresses):
    """address -> a decision link of its own, for each address of a person for whom the alert's
    open review item waits (approvals.links.deciders); none for other alerts."""
    item = alert.review_item
    if item is None or item.status != ReviewStatus.OPEN:
        return {}
    site = settings.SITE_URL.rstrip("/")
    return {address: site + reverse("decision-link", args=[link_issue(user, item)])
            for address, user in deciders(item, addresses).items()}


def review_alert_when_second_awaited(item, previous, actor, reason):
    """A review item's move (ledger.hooks.on_move, in its transaction): an approval item that waits
    for a second approval from now on tells those it waits for (`review_alert_second_approval`),
    kept open by the first of two (a move to the status it has: approvals.decisions) or reopened
    after a hold with that first one standing (from closed: approvals.reviews). Reopened, it waits
    anew, with a new deadline and window, and its overdue alerts start over; so does this one: the
    first approval's mail may have gone to nobody (it found the item held), or never been raised (a
    version held as it was made, its editor's approval recorded on the item the hold closed)."""
    if item.kind == ReviewKind.APPROVAL and item.status == ReviewStatus.OPEN and previous in (
            ReviewStatus.OPEN, ReviewStatus.CLOSED):
        review_alert_second_approval(item)


def review_alert_second_approval(item):
    """In the transaction that left `item` waiting for a second approval (the first of two given, or
    reopened with it after a hold): while it waits, an alert to the people of its tiers it waits for
    (`deciders`: not who gave the first, nor their delegate, nor anyone once its window closed),
    delivered after commit as any alert, each of them with a decision link (`_send`). The tiers are
    those its overdue alerts go to (`item_tiers`, as dlq.overdue reads them): the first (the
    operations group when its limit names none), and the next once it was escalated. None when the
    item waits for none of them (the operations group's mailbox is nobody's): the dashboard tells
    them then, as before."""
    if item.status != ReviewStatus.OPEN:
        return None
    first_tier, next_tier = item_tiers(item)
    tiers = (first_tier or list(settings.ALERT_EMAILS)) + (next_tier if item.escalated_at else [])
    waiting = list(deciders(item, tiers))
    if not waiting:
        return None
    given = [f"Approved by {approval.user.get_username()}"
             + (f" for {approval.on_behalf_of.get_username()}" if approval.on_behalf_of_id else "")
             + f" {approval.at:%Y-%m-%d %H:%M} UTC: {approval.reason}"
             for approval in item.approvals.select_related("user", "on_behalf_of").order_by("at", "pk")]
    window = [f"Its approval window closes {item.expires_at:%Y-%m-%d %H:%M} UTC."] if item.expires_at else []
    return Alert.objects.raise_for(
        kind=Alert.Kind.SECOND_APPROVAL, review_item=item, link=item.get_absolute_url(), recipients=waiting,
        subject=f"Second approval: {item}",
        body="\n".join([*given, f"Waiting since {item.created_at:%Y-%m-%d %H:%M} UTC for a second approval, from "
                                 f"someone else; {item.why}", *window]))


def alert_deliver(alert_id):
    """Try every channel not yet delivered, each in a transaction of its own (see the module's
    docstring); record each attempt; schedule the next try of those that failed."""
    failed = []
    for channel in CHANNELS:
        with transaction.atomic():
            alert = _locked(alert_id)
            if alert is None:
                return
            if channel in channels(alert) and channel not in _delivered_on(alert):
                failure = _attempt(alert, channel)
                if failure:
                    failed.append(failure)
    with transaction.atomic():
        alert = _locked(alert_id)
        if alert is None:
            return
        found = channels(alert)
        if not OPERATIONS.intersection(found):
            failed.append(_nowhere(alert))
        elif not failed and set(found) <= _delivered_on(alert):
            Alert.objects.filter(pk=alert.pk).update(delivered_at=timezone.now())
    if failed:
        _enqueue(alert_id, delay=retry_delay(max(failed)))


def _locked(alert_id):
    """The alert, locked until the caller's transaction ends; None once delivered, or while
    another job holds it: a second job for the alert (the sweeper's redelivery of a job stuck in
    a backed-up queue) finds it taken and leaves it to the first."""
    alert = Alert.objects.select_for_update(skip_locked=True).filter(pk=alert_id).first()
    return None if alert is None or alert.delivered_at else alert


def _delivered_on(alert):
    return set(alert.deliveries.filter(ok=True).values_list("channel", flat=True))


def _attempt(alert, channel):
    """One attempt on `channel`, recorded whatever its outcome; its number if it failed, else None."""
    earlier = alert.deliveries.filter(channel=channel)
    attempt = len(earlier) + 1
    before, reached = {address for delivery in earlier for address in delivery.reached}, []
    try:
        detail, ok = _send(alert, channel, before, reached), True
    except Exception as exc:  # a transport error of any kind is recorded, not raised
        detail, ok = f"{type(exc).__name__}: {exc}", False
    AlertDelivery.objects.create(alert=alert, channel=channel, attempt=attempt, ok=ok, detail=detail[:2000],
                                 reached=reached)
    return None if ok else attempt


def _nowhere(alert):
    """A try that found no operations channel: recorded as a failed delivery, which the alert's
    page shows, and logged as an error, so that the setting is fixed and the alert goes out at
    its next try; its number."""
    attempt = alert.deliveries.filter(channel=NOWHERE).count() + 1
    detail = ("no channel to tell operations on: ALERT_EMAILS is empty and ALERT_WEBHOOK_URL is not set; "
              "set either and restart, and the alert goes out at its next try")
    logger.error("alert %s (%s) is undelivered: %s", alert.pk, alert.subject, detail)
    AlertDelivery.objects.create(alert=alert, channel=NOWHERE, attempt=attempt, ok=False, detail=detail)
    return attempt


def alerts_redeliver_stale(older_than=timedelta(minutes=5)):
    """The sweeper's pass: undelivered alerts whose next try is overdue by `older_than` (never
    tried, or tried in vain `n` times and left longer than `retry_delay(n)` since: the job that
    was to try again was lost), each queued again at most once every `older_than` (stamped:
    while the workers are down every pass found the same alerts, and queued a job for each, a
    second apart, for as long as the outage lasted)."""
    now = timezone.now()
    cutoff = now - older_than
    due = Q(failures__isnull=True) & (Q(last_try__isnull=True) | Q(last_try__lt=cutoff))
    due |= reduce(or_, (Q(failures=n, last_try__lt=cutoff - retry_delay(n)) for n in range(1, _RETRY_DOUBLINGS)))
    due |= Q(failures__gte=_RETRY_DOUBLINGS, last_try__lt=cutoff - RETRY_MAX)
    stale = (Alert.objects.filter(delivered_at__isnull=True, created_at__lt=cutoff)
             .exclude(redelivery_queued_at__gte=cutoff)
             .annotate(failures=Max("deliveries__attempt", filter=Q(deliveries__ok=False)),
                       last_try=Max("deliveries__at"))
             .filter(due))
    ids = list(stale.values_list("pk", flat=True)[:100])
    Alert.objects.filter(pk__in=ids).update(redelivery_queued_at=now)
    for alert_id in ids:
        _enqueue(alert_id)
    return len(ids)
