"""Alert transports: e-mail to the operations group (or to the alert's own recipients, a
review item's tier), an HMAC-signed webhook, and e-mail to the owner of an agent whose
action or task failed for good. A review item's recipient who may decide it gets a mail of
their own, with a decision link (approvals.links); a recipient away has their delegate mailed
too (approvals.delegation).

Each attempt on each channel is recorded. A channel that failed is tried again by the job
with backoff, and by the sweeper for alerts still undelivered; a channel that already
succeeded is not repeated.
"""

import json
import logging
from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from approvals.delegation import offered, standing_in
from approvals.links import deciders, link_issue
from approvals.models import ReviewStatus
from ledger import clock
from ledger.connectors import http
from ledger.jobs import enqueue
from ledger.webhooks import sign_webhook

from .models import Alert, AlertDelivery

logger = logging.getLogger("surety.alerts")
MAX_DELIVERY_ATTEMPTS = 5


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
    decision link)."""
    link = settings.SITE_URL.rstrip("/") + alert.link
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


def _decision_links(alert, addresses):
    """address -> a decision link of its own, for each address of a person who may decide the
    alert's open review item (approvals.links); none for other alerts."""
    item = alert.review_item
    if item is None or item.status != ReviewStatus.OPEN:
        return {}
    site = settings.SITE_URL.rstrip("/")
    return {address: site + reverse("decision-link", args=[link_issue(user, item)])
            for address, user in deciders(item, addresses).items()}


def alert_deliver(alert_id):
    """Try every channel not yet delivered; record each attempt; reschedule failures."""
    # The alert stays locked while it is delivered: a second job for it (the sweeper's
    # redelivery of a job stuck in a backed-up queue) finds it taken and leaves it.
    with transaction.atomic():
        alert = Alert.objects.select_for_update(skip_locked=True).filter(pk=alert_id).first()
        if alert is None or alert.delivered_at:
            return
        done = set(alert.deliveries.filter(ok=True).values_list("channel", flat=True))
        failed = []
        for channel in channels(alert):
            if channel in done:
                continue
            earlier = alert.deliveries.filter(channel=channel)
            attempt = len(earlier) + 1
            before, reached = {address for delivery in earlier for address in delivery.reached}, []
            try:
                detail, ok = _send(alert, channel, before, reached), True
            except Exception as exc:  # a transport error of any kind is recorded, not raised
                detail, ok = f"{type(exc).__name__}: {exc}", False
                failed.append(attempt)
            AlertDelivery.objects.create(alert=alert, channel=channel, attempt=attempt, ok=ok, detail=detail[:2000],
                                         reached=reached)
        if not failed:
            Alert.objects.filter(pk=alert.pk).update(delivered_at=timezone.now())
    if failed and max(failed) < MAX_DELIVERY_ATTEMPTS:
        _enqueue(alert.pk, delay=timedelta(seconds=min(300, 2 ** max(failed))))


def alerts_redeliver_stale(older_than=timedelta(minutes=5)):
    """The sweeper's pass: undelivered alerts whose job may have been lost, each queued again at
    most once every `older_than` (stamped: while the workers are down every pass found the same
    alerts, and queued a job for each, a second apart, for as long as the outage lasted)."""
    now = timezone.now()
    cutoff = now - older_than
    stale = (Alert.objects.filter(delivered_at__isnull=True, created_at__lt=cutoff)
             .exclude(deliveries__at__gte=cutoff).exclude(redelivery_queued_at__gte=cutoff))
    ids = list(stale.values_list("pk", flat=True)[:100])
    Alert.objects.filter(pk__in=ids).update(redelivery_queued_at=now)
    for alert_id in ids:
        _enqueue(alert_id)
    return len(ids)
