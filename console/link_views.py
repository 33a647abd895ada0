"""An e-mail's decision link (approvals.links): opened, it shows the item and its decision
form, as the item's page does, and changes nothing; the form posts back to the link, which its
person, signed in and stepped up, uses once to decide."""

from django.db import transaction
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from approvals.decisions import AlreadyDecided, DecisionRefused
from approvals.links import LinkRefused, link_open, link_use
from ledger.middleware import current_decision_link

from .approval_views import decided, detail_context, detail_page, refused, take_decision
from .dashboard import staff_required
from .stepup import step_up_required


# no-store: neither the page nor its token is kept by a browser or a proxy. The site's
# Referrer-Policy (same-origin) keeps the token from any other site the page links to; a
# no-referrer policy here made the browser send `Origin: null` with the form, which the CSRF
# check refuses (tests/browser/test_interactions.py).
@never_cache
@staff_required
@step_up_required
def decision_link(request, token):
    try:
        link = link_open(token, request.user)
        if request.method != "POST":
            return detail_page(request, {**detail_context(request, link.item, decide_url=request.path), "link": link})
        with transaction.atomic():  # a decision refused leaves the link unused
            if not link_use(link, request.user):
                raise LinkRefused("This link was used a moment ago, and works once: open the item from the "
                                  "dashboard.", 410)
            through = current_decision_link.set({"id": link.pk, "sent_at": link.created_at.isoformat()})
            try:
                item, form = take_decision(request, link.item, fingerprint=link.fingerprint)
            finally:
                current_decision_link.reset(through)
    except LinkRefused as exc:
        return render(request, "approvals/link_refused.html", {"why": str(exc), "changes": exc.changes},
                      status=exc.status)
    except AlreadyDecided as exc:
        return refused(request, link.item, str(exc), 409)
    except DecisionRefused as exc:
        return refused(request, link.item, str(exc), 400)
    return decided(request, item, form)

