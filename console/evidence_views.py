"""An action's evidence record on the dashboard: a printable page and the JSON file, for
the people who may read the audit log (the record carries the audit events); and the audit
page's checks, for an auditor without a shell: the chain verified now, an evidence file
uploaded and verified."""

import json

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from ledger.audit import audit_verify
from ledger.evidence import evidence_actions, record_problems
from ledger.json_input import loads_storable

from .dashboard import staff_required
from .evidence import SECTIONS, evidence_export


def _record(request, pk):
    if not request.user.has_perm("ledger.view_auditevent"):
        raise PermissionDenied("an evidence record holds audit events: reading it needs the view_auditevent permission")
    action = get_object_or_404(evidence_actions(), pk=pk)
    return action, evidence_export(action)


@staff_required
def action_evidence(request, pk):
    """The record to read and print (the browser prints it to paper or PDF)."""
    action, record = _record(request, pk)
    sections = [(section.template, record["sections"][section.name]) for section in SECTIONS]
    return render(request, "ledger/evidence.html", {"action": action, "record": record, "sections": sections})


@staff_required
def action_evidence_json(request, pk):
    """The record as a file: staff's, whole (the API's, the agent's, withholds staff's addresses:
    console.evidence); `evidence_verify` checks either."""
    _, record = _record(request, pk)
    response = HttpResponse(json.dumps(record, indent=2, ensure_ascii=False), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="evidence-action-{pk}.json"'
    return response


# An evidence record of one action is some kilobytes; a file far larger is not one.
EVIDENCE_FILE_MAX_BYTES = 10 * 1024 * 1024


def _may_audit(request):
    if not request.user.has_perm("ledger.view_auditevent"):
        raise PermissionDenied("verifying the audit trail needs the view_auditevent permission")


@staff_required
@require_POST
def audit_chain_verify(request):
    """The audit page's "Verify the chain now": manage.py audit_verify, from the last checkpoint,
    its result recorded for the page as the sweeper's is."""
    _may_audit(request)
    report = audit_verify(since_checkpoint=True)
    if report.broken_at is not None:
        messages.error(request, f"The hash chain is broken: {report}.")
    else:
        messages.success(request, f"Hash chain verified: {report}.")
    return redirect("audit-log")


# The problems an uploaded record's answer names, the rest counted: the answer is a message kept
# in the session, and a forged file may cite any number of events (manage.py evidence_verify
# prints them all).
PROBLEMS_NAMED = 20


@staff_required
@require_POST
def audit_evidence_verify(request):
    """The audit page's evidence check: an uploaded evidence record checked as
    manage.py evidence_verify checks it (its hashes, links, digest, signature, and every event
    against the database's chain); the answer names every problem found."""
    _may_audit(request)
    upload = request.FILES.get("evidence")
    if upload is None:
        messages.error(request, "Not checked: choose an evidence file (the JSON an action's evidence page downloads).")
        return redirect("audit-log")
    try:
        if upload.size > EVIDENCE_FILE_MAX_BYTES:
            raise ValueError(f"{upload.size} bytes is far more than an evidence record")
        record = loads_storable(upload.read())
    except ValueError as exc:  # not JSON, not UTF-8, nested too deeply, a lone surrogate
        messages.error(request, f"{upload.name}: not checked: not a JSON evidence record ({exc}).")
        return redirect("audit-log")
    problems = record_problems(record) if isinstance(record, dict) else ["not an evidence record (not a JSON object)"]
    if problems:
        named = "; ".join(problems[:PROBLEMS_NAMED]) + (
            f"; and {len(problems) - PROBLEMS_NAMED} more" if len(problems) > PROBLEMS_NAMED else "")
        messages.error(request, f"{upload.name}: {len(problems)} problem(s): {named}.")
    else:
        messages.success(request, f"{upload.name}: intact: {len(record['audit']['events'])} audit events checked "
                                  "against the database's audit chain, signature valid.")
    return redirect("audit-log")
