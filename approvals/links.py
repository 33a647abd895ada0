"""Decision links: an alert's e-mail to a person for whom a review item waits carries a link
of their own, to decide it from the mail.

A link is bound to one person, one item and the print of the params the mail was sent about,
and lasts DECISION_LINK_SECONDS by the database's clock. Its token is in the mail alone: the
table keeps its SHA-256. Opening it (a GET, as mail scanners and link previewers do) changes
nothing; the decision is a POST by its person, signed in (and stepped up, as every money
decision), that uses the link in the decision's own transaction (`link_use`: a conditional
UPDATE, so two POSTs at once give one decision) and records the link in the decision's audit
events.
"""

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model

from ledger import clock
from ledger.models import Action

from .decisions import params_changed, waiting_for
from .models import DecisionLink, ReviewItem, ReviewStatus


class LinkRefused(Exception):
    """The link cannot decide; `message` says why, for a person, `status` the HTTP answer,
    `changes` what changed in the params (param, as sent, now) when that is why."""

    def __init__(self, message, status, changes=()):
        super().__init__(message)
        self.status, self.changes = status, list(changes)


def digest(token):
    return hashlib.sha256(token.encode()).hexdigest()


def deciders(item, addresses):
    """address -> the active person with that e-mail address for whom `item` waits, for each
    address that is such a person's (the others get the mail without a link). Waits for them as
    its page and the counts say (`waiting_for`): a link for one who gave the first of two
    approvals, or for their delegate, or for anyone once its window has closed, opened a page
    that offered nothing. Of several such people sharing an address, the first made (lowest id):
    in the order the database happened to read them, one alert's link went to one of them and
    the next alert's to the other."""
    found = {}
    people = get_user_model().objects.filter(is_active=True, email__in=[a for a in addresses if a]).order_by("pk")
    for user in people:
        if ReviewItem.objects.filter(waiting_for(user), pk=item.pk).exists():
            found.setdefault(user.email, user)
    return {address: found[address] for address in addresses if address in found}


def link_issue(user, item):
    """A new link for `user` to decide `item` on its params as they are now; returns the token
    (the path's part: /decide/TOKEN)."""
    token = secrets.token_urlsafe(32)
    # Its end guards a decision: on the database's clock, as the window it lives in (decision 57).
    now = clock.now()
    DecisionLink.objects.create(digest=digest(token), user=user, item=item,
                                fingerprint=item.action.params_fingerprint(), created_at=now,
                                expires_at=now + timedelta(seconds=settings.DECISION_LINK_SECONDS))
    return token


def link_open(token, user):
    """The link behind `token` if `user` may decide with it now; LinkRefused otherwise. Reads
    only: a GET and the POST's first look."""
    link = DecisionLink.objects.select_related("item", "item__action", "user").filter(digest=digest(token)).first()
    if link is None:
        raise LinkRefused("This link is not one of ours: open the item from the dashboard instead.", 404)
    if link.user_id != user.pk:
        raise LinkRefused(f"This link was sent to {link.user.get_username()}, not to you: it decides nothing "
                          "for anyone else. Open the item from the dashboard to decide it yourself.", 403)
    if link.used_at is not None:
        raise LinkRefused(f"This link was used {link.used_at:%Y-%m-%d %H:%M} UTC and works once: "
                          "open the item from the dashboard.", 410)
    if link.expires_at <= clock.now():
        raise LinkRefused(f"This link expired {link.expires_at:%Y-%m-%d %H:%M} UTC: open the item from the "
                          "dashboard.", 410)
    _same_params(link)
    return link


def _same_params(link):
    """Refused when the params are no longer those the mail was sent about: edited down into a
    new version (the item then ends `edited`), or changed in place."""
    action = link.item.action
    now = action.params_fingerprint()
    version = Action.objects.filter(supersedes=action).first() if link.item.status == ReviewStatus.EDITED else None
    if version is None and now == link.fingerprint:
        return
    changes, where = [], ""
    if version is not None:  # (changed in place, only the print tells: nothing to list)
        changes = params_changed(action.params, version.params)
        where = f": edited into {version.operation_key}, which waits for its own decision"
    raise LinkRefused(f"The parameters changed since this mail was sent{where}. This link decides nothing. "
                      "Look at them again on the dashboard.", 409, changes)


def link_use(link, user):
    """Use the link, in the caller's transaction (the decision's): True for the one request
    whose conditional UPDATE finds it unused and unexpired; a second one waits for the first's
    commit and finds it used."""
    now = clock.now()
    return DecisionLink.objects.filter(pk=link.pk, user=user, used_at__isnull=True,
                                       expires_at__gt=now).update(used_at=now) == 1
