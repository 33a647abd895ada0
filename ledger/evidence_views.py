"""An action's evidence record on the dashboard: a printable page and the JSON file, for
the people who may read the audit log (the record carries the audit events)."""

import json

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render

from . import hooks
from .dashboard import staff_required
from .evidence import evidence_actions, evidence_export


def _record(request, pk):
    if not request.user.has_perm("ledger.view_auditevent"):
        raise PermissionDenied("an evidence record holds audit events: reading it needs the view_auditevent permission")
    action = get_object_or_404(evidence_actions(), pk=pk)
    return action, evidence_export(action)


@staff_required
def action_evidence(request, pk):
    """The record to read and print (the browser prints it to paper or PDF)."""
    action, record = _record(request, pk)
    sections = [(section.template, record["sections"][section.name]) for section in hooks.evidence_sections()]
    return render(request, "ledger/evidence.html", {"action": action, "record": record, "sections": sections})


@staff_required
def action_evidence_json(request, pk):
    """The record as a file, the very JSON the API answers; `evidence_verify` checks it."""
    _, record = _record(request, pk)
    response = HttpResponse(json.dumps(record, indent=2, ensure_ascii=False), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="evidence-action-{pk}.json"'
    return response
